"""Every ``openroute ...`` command in the shell blocks of the README and docs/ names a subcommand and options that
exist (issue 26: docs named a removed flag). The commands are read from the blocks and checked against the real
command-line parser, the one ``openroute --help`` prints."""

from __future__ import annotations

import argparse
import re
import shlex
from pathlib import Path

import pytest

from openroute.cli import build_parser

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
#: code blocks whose lines are commands (or a command's output); python, json, toml... are not
SHELL_TAGS = {"", "bash", "sh", "shell", "console", "text"}
_FENCE = re.compile(r"^```(\S*)[^\n]*\n(.*?)^```", re.S | re.M)


def _commands(page: Path) -> list[tuple[int, list[str]]]:
    """(line, tokens after ``openroute``) of each ``openroute`` command in the page's shell blocks."""
    found = []
    text = page.read_text(encoding="utf-8")
    for block in _FENCE.finditer(text):
        if block.group(1).split(" ")[0] not in SHELL_TAGS:
            continue
        first_line = text.count("\n", 0, block.start(2)) + 1
        lines = block.group(2).replace("\\\n", " ").splitlines()
        for offset, line in enumerate(lines):
            line = line.strip().removeprefix("$ ")
            for segment in re.split(r"&&|\|\||[;|&]", line):
                try:
                    tokens = shlex.split(segment, comments=True)
                except ValueError:
                    continue
                if tokens and Path(tokens[0]).name == "openroute":
                    found.append((first_line + offset, tokens[1:]))
    return found


def _check(tokens: list[str]) -> str | None:
    """What is wrong with ``openroute <tokens>``, None when every subcommand and option exists."""
    parser: argparse.ArgumentParser = build_parser()
    rest = list(tokens)
    while rest:
        subparsers = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        head = rest[0].strip("[]")
        if not subparsers or head.startswith("-"):
            break
        if head.endswith(":"):
            return None  # a command's output ("openroute run: configuration ... has 4 problems")
        if head not in subparsers[0].choices:
            return f"{parser.prog} has no subcommand {head!r}"
        parser = subparsers[0].choices[head]
        rest = rest[1:]
    for token in rest:
        option = token.strip("[](),").split("=", 1)[0]
        is_option = option.startswith("-") and option not in ("-", "--") and not option[1:].isdigit()
        if is_option and option not in parser._option_string_actions:
            return f"{parser.prog} has no option {option}"
    return None


def _all() -> list[tuple[str, int, list[str]]]:
    return [(page.relative_to(ROOT).as_posix(), line, tokens) for page in PAGES for line, tokens in _commands(page)]


def test_the_docs_show_commands() -> None:
    commands = _all()
    assert len(commands) > 20
    assert any(tokens[:2] == ["messages", "list"] for _page, _line, tokens in commands)


@pytest.mark.parametrize(("page", "line", "tokens"), _all(), ids=lambda v: v if isinstance(v, str | int) else "")
def test_documented_command_exists(page: str, line: int, tokens: list[str]) -> None:
    problem = _check(tokens)
    assert problem is None, f"{page}:{line}: openroute {' '.join(tokens)}: {problem}"


def test_the_check_finds_a_removed_flag_and_a_wrong_subcommand() -> None:
    assert _check(["run", "--auth-config-file", "x.json"]) == "openroute run has no option --auth-config-file"
    assert _check(["messages", "retry", "42"]) == "openroute messages has no subcommand 'retry'"
    assert _check(["messages", "list", "--error-code", "HLR_DOWN"]) is None
