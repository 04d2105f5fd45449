"""The distribution installs every package folder, under the openroute namespace (issue 13, item 9)."""

from __future__ import annotations

import importlib
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FOLDERS = {"openroute": "openroute", "persistence": "openroute.persistence",
           "confirmation": "openroute.confirmation", "routes": "openroute_reference"}


def _setuptools() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]


def _package_folders() -> set[str]:
    found = set()
    for folder, name in FOLDERS.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            relative = init.parent.relative_to(ROOT / folder).parts
            found.add(".".join((name, *relative)))
    return found


def test_every_package_folder_is_listed_for_installation() -> None:
    assert set(_setuptools()["packages"]) == _package_folders()


def test_root_folders_install_under_the_openroute_namespace() -> None:
    assert _setuptools()["package-dir"] == {name: folder for folder, name in FOLDERS.items()}


@pytest.mark.parametrize("name", sorted(FOLDERS.values()))
def test_installed_names_import_from_the_repository_folders(name: str) -> None:
    module = importlib.import_module(name)
    folder = next(f for f, n in FOLDERS.items() if n == name)
    assert Path(module.__file__).resolve().parent == ROOT / folder

