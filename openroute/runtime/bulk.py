"""The size of a bulk change of stored messages above which a Spark job is quicker than plain SQL.

``openroute messages`` (and the admin API) change messages one by one through the engine and start at once; an
``openroute spark`` job pays a fixed start (a JVM and a session, or a round trip to a warm Spark Connect server)
and then grows more slowly with the rows. :data:`SPARK_PAYS_OFF_AT` is where they cross, as
``benchmarks/spark_bench.py`` measured it (docs/spark.md, "Spark or ``openroute messages``?", says how it is found
and what the runs showed). Both command lines
read it from here, below them both, and each suggests the other tool on the wrong side of it::

    from openroute.runtime.bulk import spark_suggestion, sql_suggestion

    print(spark_suggestion(12_000_000))  # from openroute messages: Spark is quicker above ...
    print(sql_suggestion(400))           # from openroute spark reprocess: plain SQL is quicker below ...
"""

from __future__ import annotations

__all__ = ["SPARK_PAYS_OFF_AT", "spark_suggestion", "sql_suggestion"]

#: messages of one bulk restart above which ``openroute spark reprocess`` is quicker than ``openroute messages``:
#: the cold crossing (a JVM and a session per command) of the plan + apply lines against plain SQL's, measured at
#: 100k and 1M messages on 2026-11-27 (``--repeat 2``, load 1-4): ~20M messages in the store, ~1,000,000 selected.
#: A quiet ``--repeat 3`` run (2026-12-06) found the warm lines parallel to the set-based script's within their noise
#: (no crossing at those sizes); ``openroute messages`` is slower than that script, so the value stays until a 10M
#: run pins the lines down (docs/spark.md)
SPARK_PAYS_OFF_AT = 1_000_000


def sql_suggestion(messages: int, threshold: int | None = None) -> str | None:
    """The line a Spark job prints when plain SQL would do its ``messages`` quicker (None at or above
    ``threshold``, default :data:`SPARK_PAYS_OFF_AT`, where Spark is the right tool)."""
    threshold = SPARK_PAYS_OFF_AT if threshold is None else threshold
    if messages >= threshold:
        return None
    return (f"{messages} message(s): below ~{threshold:,} plain SQL is quicker than Spark's start-up; "
            "openroute messages restart --state FAILED ... (or the admin API) does the same through the same rules")


def spark_suggestion(messages: int, threshold: int | None = None) -> str | None:
    """The line ``openroute messages`` prints when a Spark job would do its ``messages`` quicker (None below
    ``threshold``, default :data:`SPARK_PAYS_OFF_AT`)."""
    threshold = SPARK_PAYS_OFF_AT if threshold is None else threshold
    if messages < threshold:
        return None
    return (f"{messages} message(s): from ~{threshold:,} on a Spark job is quicker than one by one; "
            "openroute spark reprocess --state FAILED ... --apply does the same through the same rules "
            "(docs/spark.md)")
