"""When Spark pays off, for the Spark commands: the crossover of :mod:`openroute.runtime.bulk`, which ``openroute
messages`` reads too (the line below it points the user to plain SQL)::

    from openroute.spark.guidance import suggestion

    print(suggestion(400))   # 400 messages: plain SQL is quicker below ~1,000,000; openroute messages restart ...
"""

from __future__ import annotations

from openroute.runtime.bulk import SPARK_PAYS_OFF_AT
from openroute.runtime.bulk import sql_suggestion as suggestion

__all__ = ["SPARK_PAYS_OFF_AT", "suggestion"]
