"""The garbage collector's settings while a node serves (``openroute run`` applies them once it serves).

Two settings, both about the work the cyclic collector does per message, not about memory:

* **Start-up objects frozen** (``gc.freeze()``): what start-up loaded (modules, routes, the application) lives as
  long as the process. Out of the collector's reach, a full collection walks only what serving creates; unfrozen,
  every full collection walks ~67,000 objects and more than half of a message's time went to the collector.
* **A young generation of 20,000 objects** instead of CPython's 700. A message makes a few dozen container objects
  (its snapshots, its exchange, futures, rows) that reference counting frees when the message is done; the young
  collections find almost nothing to free (no cycles on the hot path), but each walks every object in flight, and
  at 700 one ran every ~70 messages: ~8,000 instructions a message on the SQLite lifecycle benchmark, 1.6 % of it
  (docs/performance.md). At 20,000 a young collection walks at most 20,000 objects (about a millisecond) and runs
  a few times a second at full load; cyclic garbage, which the hot path does not make, waits a little longer.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

__all__ = ["YOUNG_GENERATION", "serving", "tune_for_serving", "untune"]

#: objects allocated (net) before a young collection while serving (CPython's default: 700)
YOUNG_GENERATION = 20_000

Thresholds = tuple[int, int, int]


def tune_for_serving() -> Thresholds:
    """Freeze what start-up made and widen the young generation (see the module docstring); call once serving.
    Returns the thresholds it replaced (for :func:`untune`)."""
    before: Thresholds = gc.get_threshold()
    gc.freeze()
    gc.set_threshold(YOUNG_GENERATION, before[1], before[2])
    return before


def untune(before: Thresholds) -> None:
    """Undo :func:`tune_for_serving` (``before``: what it returned): everything frozen is collectable again."""
    gc.unfreeze()
    gc.set_threshold(*before)


@contextlib.contextmanager
def serving() -> Iterator[None]:
    """:func:`tune_for_serving` for a block (a benchmark's run, a test), undone after it."""
    before = tune_for_serving()
    try:
        yield
    finally:
        untune(before)
