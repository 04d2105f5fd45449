"""One resolution of the store's settings for every command (docs/configuration.md): ``--database-url`` over
``OPENROUTE_DATABASE_URL`` over the ``database_url`` of the ``--config`` file over ``sqlite:///openroute.db``.

Each command is given the sources from one down to the default; the store it reaches for names the source that won.
No store exists anywhere (the default ``openroute.db`` is a folder), so every command stops where it opens it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from openroute.cli import build_parser, main, resolve_settings

#: the sources in their order, each with the URL it gives
SOURCES = {
    "flag": "sqlite:////nonexistent/flag.db",
    "env": "sqlite:////nonexistent/env.db",
    "config": "sqlite:////nonexistent/config.db",
    "default": "sqlite:///openroute.db",
}


def _given_from(first: str, tmp_path: Path) -> tuple[list[str], dict[str, str]]:
    """The options and environment of a command given ``first`` and every source below it."""
    (tmp_path / "openroute.db").mkdir()  # the default: a folder, which no command opens as a store
    config = tmp_path / "openroute.toml"
    config.write_text(f'database_url = "{SOURCES["config"]}"\n', encoding="utf-8")
    given = list(SOURCES)[list(SOURCES).index(first):]
    options = ["--database-url", SOURCES["flag"]] if "flag" in given else []
    options += ["--config", str(config)] if "config" in given else []
    env = {name: value for name, value in os.environ.items() if not name.startswith("OPENROUTE_")}
    if "env" in given:
        env["OPENROUTE_DATABASE_URL"] = SOURCES["env"]
    return options, env


@pytest.fixture
def isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The command runs in ``tmp_path`` with no ``OPENROUTE_...`` variable but those a test sets."""
    monkeypatch.chdir(tmp_path)
    for name in [name for name in os.environ if name.startswith("OPENROUTE_")]:
        monkeypatch.delenv(name)
    return tmp_path


def _in_process(argv: list[str], env: dict[str, str], monkeypatch: pytest.MonkeyPatch,
                capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    if "OPENROUTE_DATABASE_URL" in env:
        monkeypatch.setenv("OPENROUTE_DATABASE_URL", env["OPENROUTE_DATABASE_URL"])
    code = main(argv)
    return code, capsys.readouterr().err


@pytest.mark.parametrize("first", list(SOURCES))
@pytest.mark.parametrize("command", [["messages", "list"], ["db", "mask-secrets"]], ids=" ".join)
def test_the_operator_commands_open_the_store_of_the_first_source(
        command: list[str], first: str, isolated: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    options, env = _given_from(first, isolated)
    code, err = _in_process([*command, *options], env, monkeypatch, capsys)
    assert code == 2 and f"{SOURCES[first]}: there is no store file" in err, err


@pytest.mark.parametrize("first", list(SOURCES))
@pytest.mark.parametrize("job", [["reprocess"], ["archive", "--keep", "OK=1d", "--to", "x"], ["audit", "--out", "o"]],
                         ids=lambda job: job[0])
def test_the_spark_jobs_get_the_store_of_the_first_source(
        job: list[str], first: str, isolated: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The command line resolves it before the job starts Spark (the jobs read ``args.database_url`` alone)."""
    options, env = _given_from(first, isolated)
    if "OPENROUTE_DATABASE_URL" in env:
        monkeypatch.setenv("OPENROUTE_DATABASE_URL", env["OPENROUTE_DATABASE_URL"])
    args = build_parser().parse_args(["spark", *job, *options])
    assert resolve_settings(args) is None
    assert args.database_url == SOURCES[first]


def test_a_spark_job_not_given_a_resolved_url_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    """A job reached without the command line (its handler called directly) resolves nothing on its own."""
    from openroute.spark.cli import run

    args = build_parser().parse_args(["spark", "archive", "--keep", "OK=1d", "--to", "x"])
    assert run(args) == 2
    assert "the store's URL is not resolved" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.parametrize("first", list(SOURCES))
def test_run_reaches_for_the_store_of_the_first_source(first: str, isolated: Path) -> None:
    options, env = _given_from(first, isolated)
    done = subprocess.run([sys.executable, "-m", "openroute", "run", "--port", "0", *options], cwd=isolated, env=env,
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 4, done.stderr
    assert f"cannot reach the database {SOURCES[first]}:" in done.stderr
