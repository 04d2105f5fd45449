"""Named points where a test can pause a Spark job run as a process, to kill it (``kill -9``) exactly there.

A job calls :func:`pause_point` where being killed must lose nothing (the archive: ``selected``, ``written``,
``verified``, ``deleted-batch``; the reprocess apply: ``batch-written``, a batch's changes written inside its
transaction, not yet committed). Normally that does nothing. With the environment variable
``OPENROUTE_SPARK_PAUSE_AT=<point>`` (or ``<point>:<n>``: the n-th time the job gets there) the job prints::

    openroute spark: paused at deleted-batch #2 (pid 4242, OPENROUTE_SPARK_PAUSE_AT)

on stderr and waits there, at most ``OPENROUTE_SPARK_PAUSE_SECONDS`` (default 600) before it goes on. A test
waits for that line, then kills the process: the kill lands at a known point, not at a moment guessed by a sleep.
"""

from __future__ import annotations

import os
import sys
import time

#: ``<point>`` or ``<point>:<n>``: pause the n-th time (default the first) the job reaches the named point
PAUSE_AT_ENV = "OPENROUTE_SPARK_PAUSE_AT"

#: how long a paused job waits before it goes on (seconds, default 600)
PAUSE_SECONDS_ENV = "OPENROUTE_SPARK_PAUSE_SECONDS"

_seen: dict[str, int] = {}


def _wanted() -> tuple[str, int] | None:
    value = os.environ.get(PAUSE_AT_ENV, "").strip()
    if not value:
        return None
    point, _sep, count = value.partition(":")
    try:
        times = int(count) if count else 1
    except ValueError:
        raise ValueError(f"{PAUSE_AT_ENV}: {value!r} is not <point> or <point>:<n>") from None
    return point.strip(), times


def pause_point(point: str) -> None:
    """The job reached ``point``: pause here when ``$OPENROUTE_SPARK_PAUSE_AT`` names it (see the module).

    Raises ``ValueError`` for a malformed ``$OPENROUTE_SPARK_PAUSE_AT``; returns at once when it is unset.
    """
    wanted = _wanted()
    if wanted is None or wanted[0] != point:
        return
    _seen[point] = _seen.get(point, 0) + 1
    if _seen[point] != wanted[1]:
        return
    seconds = float(os.environ.get(PAUSE_SECONDS_ENV) or 600)
    print(f"openroute spark: paused at {point} #{_seen[point]} (pid {os.getpid()}, {PAUSE_AT_ENV})",
          file=sys.stderr, flush=True)
    time.sleep(seconds)
