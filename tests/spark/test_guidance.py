"""The size above which the Spark commands are the right tool (openroute/spark/guidance.py)."""

from __future__ import annotations

from openroute.spark.guidance import SPARK_PAYS_OFF_AT, suggestion


def test_below_the_crossover_the_reprocess_job_suggests_plain_sql_and_above_it_nothing() -> None:
    line = suggestion(400)
    assert line is not None and line.startswith("400 message(s): below ~1,000,000 plain SQL is quicker")
    assert "openroute messages restart" in line
    assert suggestion(SPARK_PAYS_OFF_AT) is None and suggestion(SPARK_PAYS_OFF_AT * 3) is None
    assert suggestion(10, threshold=5) is None
