"""``openroute spark audit`` as a command: its exit status (0 checks pass, 1 a check fails, 2 usage or connection
error with one line on stderr) and the files it writes."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from openroute.cli import main as openroute_main
from tests.spark.test_audit import CRM, NOW, StoreBuilder, ago


def main(argv: list[str]) -> int:
    """``openroute spark audit ARGV``: the command line resolves the store's URL as for every command."""
    return openroute_main(["spark", "audit", *argv])


def small_store(*, stuck: bool) -> StoreBuilder:
    b = StoreBuilder()
    b.message(1, CRM, [("NEW", ago(hours=2)), ("PROCESSING", ago(hours=2)),
                       ("OK", ago(hours=2) + timedelta(seconds=5))])
    if stuck:
        b.message(2, CRM, [("NEW", ago(hours=3))], node=None)
    return b


def test_exit_0_when_every_check_passes(spark: Any, sqlite_url: str, tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    small_store(stuck=False).write(sqlite_url)
    out = tmp_path / "report"

    assert main(["--database-url", sqlite_url, "--out", str(out), "--now", NOW.isoformat(), "--partitions", "2"]) == 0
    printed = capsys.readouterr().out
    assert "ok   stuck: 0" in printed and f"report: {out / 'report.html'}" in printed
    assert json.loads((out / "summary.json").read_text())["passed"] is True
    assert (out / "parquet" / "state_counts").is_dir()


def test_exit_1_when_a_check_fails_through_openroute_spark_audit(spark: Any, sqlite_url: str, tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    small_store(stuck=True).write(sqlite_url)

    status = openroute_main(["spark", "audit", "--database-url", sqlite_url, "--out", str(tmp_path / "r"),
                             "--now", NOW.isoformat(), "--stuck-after", "2h", "--spark-log", str(tmp_path / "log")])
    assert status == 1
    assert "FAIL stuck: 1 (2)" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (["--database-url", "sqlite:////nonexistent/openroute.db"], "no SQLite store at /nonexistent/openroute.db"),
        (["--database-url", "postgresql+psycopg://nobody@127.0.0.1:1/none"], "cannot read tables message, "),
        (["--database-url", "mysql://x/y"], "unsupported database 'mysql'"),
        (["--stuck-after", "soon"], "not a duration: 'soon'"),
        (["--partitions", "0"], "--partitions must be >= 1, got 0"),
    ],
)
def test_exit_2_with_one_line_on_stderr(spark: Any, sqlite_url: str, tmp_path: Path, argv: list[str], line: str,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    small_store(stuck=False).write(sqlite_url)
    args = ["--database-url", sqlite_url, "--out", str(tmp_path / "r"), *argv]

    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("openroute spark audit: ") and line in err
    assert err.count("\n") == 1 and "Traceback" not in err and "at org." not in err
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        ([], "the following arguments are required: --out"),
        (["--database-url", "sqlite:///x.db", "--out", "o", "--now", "2026-11-20T12:00"], "give the zone too"),
        (["--database-url", "sqlite:///x.db", "--out", "o", "--now", "yesterday"], "not an ISO-8601 time: 'yesterday'"),
        (["--database-url", "sqlite:///x.db", "--out", "o", "--partitions", "many"], "invalid int value: 'many'"),
    ],
)
def test_usage_errors_exit_2(argv: list[str], line: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    assert line in capsys.readouterr().err
