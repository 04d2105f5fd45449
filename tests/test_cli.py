"""openroute/cli.py: the registry of subcommands, ``--version``, and an example in every command's ``--help``."""

from __future__ import annotations

import argparse
import subprocess
import sys
from importlib.metadata import version

import pytest

from openroute.cli import COMMANDS, build_parser, main


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _every_parser(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    found = [path]
    for name, sub in _subparsers(parser).items():
        found += _every_parser(sub, (*path, name))
    return found


def test_cli_knows_its_commands() -> None:
    parser = build_parser()
    assert parser.parse_args(["demo"]).command == "demo"
    assert parser.parse_args(["run", "--port", "9000"]).port == 9000
    assert parser.parse_args(["run", "--log-level", "debug"]).log_level == "DEBUG"
    assert parser.parse_args(["db", "upgrade"]).db_command == "upgrade"
    assert len(COMMANDS) == len(set(COMMANDS))


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out.strip() == f"openroute {version('openroute')}"


def test_every_command_has_an_example_in_its_help(capsys: pytest.CaptureFixture[str]) -> None:
    paths = _every_parser(build_parser())
    assert {("run",), ("demo",), ("db",), ("db", "upgrade")} <= set(paths)
    for path in paths:
        with pytest.raises(SystemExit):
            main([*path, "--help"])
        shown = capsys.readouterr().out
        assert "  openroute " + " ".join(path) in shown, (path, shown)  # an example command line


def test_bad_options_are_usage_errors(capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (["run", "--log-format", "xml"], ["run", "--port", "x"], ["nonsense"], []):
        with pytest.raises(SystemExit) as exited:
            main(argv)
        assert exited.value.code == 2, argv
        assert "usage: openroute" in capsys.readouterr().err


def test_the_installed_script_answers() -> None:
    result = subprocess.run([sys.executable, "-m", "openroute", "--version"], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0 and result.stdout.startswith("openroute ")
