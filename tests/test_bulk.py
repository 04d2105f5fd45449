"""The crossover both command lines read (openroute/runtime/bulk.py): each suggests the other tool on the wrong side of
it."""

from __future__ import annotations

import pytest

from openroute.cli import main
from openroute.runtime import bulk
from openroute.runtime.bulk import SPARK_PAYS_OFF_AT, spark_suggestion, sql_suggestion
from tests.spark.stores import many_failed


def test_each_side_of_the_crossover_gets_one_suggestion() -> None:
    for messages in (0, 400, SPARK_PAYS_OFF_AT - 1, SPARK_PAYS_OFF_AT, SPARK_PAYS_OFF_AT * 3):
        below = messages < SPARK_PAYS_OFF_AT
        assert (sql_suggestion(messages) is not None) is below
        assert (spark_suggestion(messages) is not None) is not below
    line = spark_suggestion(12, threshold=10)
    assert line is not None and line.startswith("12 message(s): from ~10 on a Spark job is quicker")
    assert "openroute spark reprocess" in line


def test_openroute_messages_suggests_spark_above_the_crossover(
    sqlite_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    many_failed(sqlite_url, 3)
    assert main(["messages", "restart", "--state", "FAILED", "--dry-run", "--database-url", sqlite_url]) == 0
    assert "Spark" not in capsys.readouterr().err  # 3 messages: far below the crossover
    monkeypatch.setattr(bulk, "SPARK_PAYS_OFF_AT", 3)
    assert main(["messages", "restart", "--state", "FAILED", "--dry-run", "--database-url", sqlite_url]) == 0
    captured = capsys.readouterr()
    assert "restart: 3 messages match (dry run, nothing done)" in captured.out
    assert "3 message(s): from ~3 on a Spark job is quicker than one by one" in captured.err
