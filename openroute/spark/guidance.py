"""When Spark pays off: the selection size above which ``openroute spark reprocess`` beats ``openroute messages``.

A Spark command pays a fixed start (a JVM and a session, 10-13 s cold, about a second on a warm Connect
server) and then grows slowly with the rows; plain SQL (``openroute messages restart``, the admin API) starts
at once and grows with every row. :data:`SPARK_PAYS_OFF_AT` is where the two meet (docs/spark.md, "Spark or
plain SQL", says how it was found); the commands suggest the other tool on the wrong side of it::

    from openroute.spark.guidance import suggestion

    print(suggestion(400))   # 400 messages: plain SQL is quicker below ~5,000,000; openroute messages restart ...
"""

from __future__ import annotations

#: candidates of one reprocessing job above which Spark is quicker than plain SQL (see the module docstring)
SPARK_PAYS_OFF_AT = 5_000_000


def suggestion(candidates: int, threshold: int = SPARK_PAYS_OFF_AT) -> str | None:
    """The line a reprocessing job prints when plain SQL would do its ``candidates`` quicker (None above
    ``threshold``, where Spark is the right tool)."""
    if candidates >= threshold:
        return None
    return (f"{candidates} message(s): below ~{threshold:,} plain SQL is quicker than Spark's start-up; "
            "openroute messages restart --state FAILED ... (or the admin API) does the same through the same rules")
