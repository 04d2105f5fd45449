"""ruff's security rules (flake8-bandit, ``S``) run in CI, and every finding kept in the product says why."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PRODUCT = ["openroute", "persistence", "confirmation", "routes", "samples"]


def test_the_security_rules_are_selected() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    assert "S" in config["tool"]["ruff"]["lint"]["select"]


def test_every_security_exception_in_the_product_gives_its_reason() -> None:
    bare = []
    for folder in PRODUCT:
        for path in (ROOT / folder).rglob("*.py"):
            for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                match = re.search(r"# noqa: (S\d+(?:, *S\d+)*)(.*)$", line)
                if match and len(match.group(2).strip()) < 10:
                    bare.append(f"{path.relative_to(ROOT)}:{number}")
    assert bare == [], f"# noqa: Sxxx without a reason: {bare}"


def test_the_product_passes_the_security_rules() -> None:
    ruff = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")
    if ruff is None:
        pytest.skip("ruff is not installed")
    result = subprocess.run([ruff, "check", "--select", "S", "--no-cache", *PRODUCT], cwd=ROOT,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
