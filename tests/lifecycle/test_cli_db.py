"""``openroute db upgrade`` on each real database, and its failure on a bad URL."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import sqlalchemy as sa
from openroute.persistence import MessageStore

from openroute.cli import main

ROOT = Path(__file__).resolve().parents[2]


def test_db_upgrade_creates_the_schema(database_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["db", "upgrade", "--database-url", database_url]) == 0
    assert f"at revision {MessageStore.head_revision()}" in capsys.readouterr().out
    store = MessageStore(database_url)
    assert store.current_revision() == MessageStore.head_revision()
    assert "message" in sa.inspect(store.engine).get_table_names()
    assert main(["db", "upgrade", "--database-url", database_url]) == 0  # again: nothing to do
    store.dispose()


def test_db_upgrade_reports_a_bad_url(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["db", "upgrade", "--database-url", "oracle://nobody@nowhere/x"]) == 1
    assert "unsupported database" in capsys.readouterr().err


def test_db_upgrade_as_a_command_uses_the_environment(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'env.db'}"
    done = subprocess.run([sys.executable, "-m", "openroute", "db", "upgrade"], cwd=ROOT, capture_output=True,
                          text=True, env={"OPENROUTE_DATABASE_URL": url, "PATH": ""}, timeout=60)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "env.db").exists()
