"""The size limits of the installed packages' rooms (issue 29): a module holds at most 550 lines, a function at
most 80, a class at most 25 public methods (those defined in its body, properties included).

Measured with ``ast`` over ``openroute/``, ``persistence/``, ``confirmation/`` and ``routes/``.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("openroute", "persistence", "confirmation", "routes")

MAX_MODULE_LINES = 550
MAX_FUNCTION_LINES = 80
MAX_PUBLIC_METHODS = 25

#: Rooms still over a limit, each split in its own branch of issue 29 (the coordinator empties this list after
#: merging them): "path" for a module's lines, "path:qualified.name" for a function or a class.
ALLOWED: frozenset[str] = frozenset()  # rooms still over the limits, each with the reason: none left


def _modules() -> Iterator[Path]:
    for package in PACKAGES:
        yield from sorted((ROOT / package).rglob("*.py"))


def _definitions(tree: ast.AST, prefix: str = "") -> Iterator[tuple[str, ast.AST]]:
    """Every function and class with its qualified name (``Class.method``, ``function.inner``)."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            name = f"{prefix}{node.name}"
            yield name, node
            yield from _definitions(node, f"{name}.")
        else:
            yield from _definitions(node, prefix)


def _public_methods(cls: ast.ClassDef) -> int:
    return sum(1 for node in cls.body
               if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and not node.name.startswith("_"))


def _rooms_over_the_limits() -> dict[str, str]:
    over: dict[str, str] = {}
    for path in _modules():
        where = path.relative_to(ROOT).as_posix()
        source = path.read_text(encoding="utf-8")
        lines = len(source.splitlines())
        if lines > MAX_MODULE_LINES:
            over[where] = f"{lines} lines"
        for name, node in _definitions(ast.parse(source, filename=where)):
            if isinstance(node, ast.ClassDef):
                methods = _public_methods(node)
                if methods > MAX_PUBLIC_METHODS:
                    over[f"{where}:{name}"] = f"{methods} public methods"
            else:
                assert isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    over[f"{where}:{name}"] = f"{length} lines"
    return over


def test_no_room_is_over_the_limits() -> None:
    over = {room: size for room, size in _rooms_over_the_limits().items() if room not in ALLOWED}
    assert not over, "over the limits (module 550 lines, function 80, class 25 public methods): " + ", ".join(
        f"{room} ({size})" for room, size in sorted(over.items()))


def test_the_allow_list_names_only_rooms_still_over_the_limits() -> None:
    stale = ALLOWED - set(_rooms_over_the_limits())
    assert not stale, f"no longer over the limits, take them off ALLOWED: {sorted(stale)}"


@pytest.mark.parametrize(("source", "room"), [
    ("x = 1\n" * (MAX_MODULE_LINES + 1), "planted.py"),
    ("def long():\n" + "    x = 1\n" * MAX_FUNCTION_LINES, "planted.py:long"),
    ("class Wide:\n" + "".join(f"    def m{i}(self): ...\n" for i in range(MAX_PUBLIC_METHODS + 1)),
     "planted.py:Wide"),
])
def test_a_planted_room_over_a_limit_is_found(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, source: str,
                                              room: str) -> None:
    (tmp_path / "openroute").mkdir()
    (tmp_path / "openroute" / "planted.py").write_text(source, encoding="utf-8")
    monkeypatch.setitem(globals(), "ROOT", tmp_path)
    monkeypatch.setitem(globals(), "PACKAGES", ("openroute",))
    assert f"openroute/{room}" in _rooms_over_the_limits()
