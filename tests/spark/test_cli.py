"""``openroute spark`` on a terminal and off it: the Spark stages done / total while a job runs, only on a
terminal, erased before the results; nothing but the results in a pipe."""

from __future__ import annotations

import re
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from tests.spark.processes import run_in_pipe, run_in_terminal
from tests.spark.stores import reprocess_store


def screen(raw: bytes) -> list[str]:
    """The lines a terminal shows after ``raw`` (carriage return, new line and ESC [K, erase to the end of the
    line: the controls the command uses), without trailing empty lines."""
    text = raw.decode()
    lines, column, at = [""], 0, 0
    while at < len(text):
        if text.startswith("\x1b[K", at):
            lines[-1] = lines[-1][:column]
            at += 3
            continue
        char = text[at]
        at += 1
        if char == "\r":
            column = 0
        elif char == "\n":
            lines.append("")
            column = 0
        else:
            line = lines[-1].ljust(column)
            lines[-1] = line[:column] + char + line[column + 1:]
            column += 1
    while lines and not lines[-1]:
        lines.pop()
    return lines


def _argv(url: str, out: Path) -> list[str]:
    return ["reprocess", "--database-url", url, "--master", "local[1]", "--partitions", "2", "--out", str(out),
            "--job-id", "shown", "--apply", "--batch-size", "2"]


RESULTS = [
    "job shown: plan in {out}/plan",
    "route                 decision       messages",
    "billing/charge        RESTART               1",
    "crm/setCustomer       RESTART               4",
    "crm/setCustomer       SKIP_OBSOLETE         1",
    "shop/createOrder      RESTART               1",
    "shop/createOrderLine  LEAVE                 1",
    "8 message(s): below ~1,000,000 plain SQL is quicker than Spark's start-up; openroute messages restart "
    "--state FAILED ... (or the admin API) does the same through the same rules",
    "applied: restarted 6, skipped as obsolete 1, already done by this job 0, changed since the plan 0, "
    "no longer stored 0 (4 batches)",
]


def _results(lines: list[str]) -> list[str]:
    """The lines after the first, which must say how long the Spark session took to start (it varies)."""
    assert lines and re.fullmatch(r"spark session ready in \d+\.\d s on local\[1\]", lines[0]), lines[:1]
    return lines[1:]


@pytest.fixture(scope="module")
def runs(spark_installed: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, tuple[Path, Any]]]:
    """The same command run on a terminal and in a pipe, each on a store of its own, both children started at
    once: each is mostly the start of one JVM, and the two overlap on this machine's cores. Gives, per way, the
    job folder and the future of what :func:`run_in_terminal` / :func:`run_in_pipe` return."""
    started: dict[str, tuple[Path, Any]] = {}
    with ThreadPoolExecutor(max_workers=2) as pool:
        for how, run in (("terminal", run_in_terminal), ("pipe", run_in_pipe)):
            folder = tmp_path_factory.mktemp(how)
            url = f"sqlite:///{folder / 'openroute.db'}"
            reprocess_store(url)
            out = folder / "job"
            started[how] = (out, pool.submit(run, _argv(url, out), folder, 300))
        yield started


def test_on_a_terminal_the_stages_done_of_total_show_while_it_runs_and_are_erased_before_the_results(
    runs: dict[str, tuple[Path, Any]],
) -> None:
    out, run = runs["terminal"]
    status, raw = run.result()
    assert status == 0, raw
    drawn = re.findall(rb"\r\x1b\[K(spark stages (\d+)/(\d+)[^\r]*)", raw)
    assert drawn, f"no progress line on the terminal: {raw!r}"
    assert all(int(done) <= int(known) for _line, done, known in drawn)
    assert int(drawn[-1][2]) > 1, "the stages of every job of the command are counted"
    assert re.search(rb"batch \d+: restarted \d+, skipped \d+", raw), "the apply's batches show on the line"
    assert _results(screen(raw)) == [line.format(out=out) for line in RESULTS], "only the results stay on the screen"


def test_in_a_pipe_there_is_no_progress_only_the_results(runs: dict[str, tuple[Path, Any]]) -> None:
    out, run = runs["pipe"]
    done = run.result()
    assert done.returncode == 0, done.stderr
    assert _results(done.stdout.splitlines()) == [line.format(out=out) for line in RESULTS]
    assert done.stderr == "", "nothing on stderr: no progress, no Spark log"
