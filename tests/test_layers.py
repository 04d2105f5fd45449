"""The layer contracts of docs/architecture.md, checked by import-linter through ``.ci/layers`` (run by .ci/run).

The check passes on the tree, and fails on a scratch copy where one import up the layers is planted (at module
level, deferred in a function, or under TYPE_CHECKING: every kind counts).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _check(root: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(root / ".ci" / "layers")], capture_output=True, text=True, timeout=120,
                          check=False, env={"PYTHON": sys.executable, "PATH": "/usr/bin:/bin"})


def test_the_tree_keeps_every_layer_contract() -> None:
    done = _check(ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 broken" in done.stdout


def test_a_relative_python_is_found_after_the_check_leaves_for_its_temporary_tree() -> None:
    """``PYTHON=.venv/bin/python .ci/layers`` (or ``.ci/typecheck``), run from the project: the scripts work in a
    temporary tree of symlinks, where a relative interpreter path would name nothing."""
    relative = Path(sys.executable).absolute()
    relative_text = str(relative.relative_to(ROOT)) if relative.is_relative_to(ROOT) else str(relative)
    done = subprocess.run(["bash", ".ci/layers"], cwd=ROOT, capture_output=True, text=True, timeout=120, check=False,
                          env={"PYTHON": relative_text, "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0 and "0 broken" in done.stdout, done.stdout + done.stderr


PLANTS = [
    # (file, line added, the contract that breaks)
    ("persistence/store.py", "import openroute.confirmation\n", "Layers"),
    ("openroute/route.py", "import openroute_reference\n", "Layers"),
    ("openroute/dsl.py", "def _late() -> None:\n    from openroute.engine import Engine  # noqa: F401\n",
     "Definitions do not import the runtime"),
    ("openroute/interceptors.py", "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import openroute.states\n",
     "Definitions do not import the runtime"),
    ("openroute/streams/protocol.py", "import sqlalchemy  # noqa: F401\n", "streams imports only the standard library"),
    ("openroute/spark/audit.py", "import openroute.admin  # noqa: F401\n", "Edges are independent"),
    ("openroute/engine/outcome.py", "import openroute  # noqa: F401\n",
     "Only the application imports the package root"),
    # retry imports errors: errors importing retry closes a circle inside one layer
    ("openroute/errors.py", "def _late() -> None:\n    import openroute.retry  # noqa: F401\n", "No import cycle"),
]


def test_planted_violations_fail_the_check(tmp_path: Path) -> None:
    """One scratch copy with one violation per contract (a single import-linter run names all of them)."""
    for name in ("openroute", "persistence", "confirmation", "routes", ".ci"):
        shutil.copytree(ROOT / name, tmp_path / name, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    for path, line, _ in PLANTS:
        target = tmp_path / path
        target.write_text(target.read_text(encoding="utf-8") + "\n" + line, encoding="utf-8")
    done = _check(tmp_path)
    assert done.returncode != 0, done.stdout
    broken = done.stdout.split("Broken contracts", 1)[-1]
    for _, _, contract in PLANTS:
        assert contract in broken, f"{contract}: {done.stdout}"
    assert "- .retry -> .errors" in broken  # the cycle, as import-linter names it
    for path, _, _ in PLANTS[:-1]:
        module = path.replace("/", ".").removesuffix(".py").replace("persistence.", "openroute.persistence.")
        assert module in broken, f"{module}: {done.stdout}"
