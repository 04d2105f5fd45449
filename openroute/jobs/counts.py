"""Message counts per state for ``/admin/counts``, the console and ``/metrics``, exact on every call at a cost that
does not grow with the store.

Every count is read from the store's ``message_count`` table plus the transitions written since its mark, in one
statement (:class:`~openroute.persistence.counts.StoredCounts`): what a ``GROUP BY`` of the ``message`` table
would answer in that snapshot, for the cost of the recent transitions (an index range), not of the table (a
``GROUP BY`` of 1,000,000 messages took 85-136 ms; the dashboard's two took about 1 s). Each node folds the
transitions into the table every ``fold_interval`` seconds (:meth:`MessageCounts.run`, started by the server), so
the first call after an idle hour costs what any other call does; a read that found more than ``max_tail``
transitions after the mark (no node folding, e.g. only the CLI runs) starts a fold in the background.

Why this design (docs/performance.md, "Counts"): a stale-while-revalidate cache of the final states answered an
old count after an idle period and paid a full count per refresh; a refresher kept warm would pay that count every
few seconds on every node, growing with the table; counts written by the hot path (a counter row per route and
state) would put a row every transition updates, contended by every node, into each accept and outcome
transaction. The transition rows are written anyway: reading them back costs the writers nothing. Deletions
(retention, archive, SQL) are taken out by a trigger in the deleting transaction, which appends a delta row (no
shared row updated: concurrent deleters never deadlock) that the next fold moves in; a ``TRUNCATE`` resets the
counts. The per-route backlog of ``/metrics`` is cached for ``route_ttl`` seconds.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa

from openroute.definitions.errors import ConfigurationError
from openroute.persistence import FINAL_STATES, MessageState, MessageStore, mask_secrets, message_table
from openroute.persistence.outage import StoreOutage, run_passes

log = logging.getLogger(__name__)

OPEN_STATES: tuple[MessageState, ...] = tuple(s for s in MessageState if s not in FINAL_STATES)


@dataclass(frozen=True)
class StateCounts:
    """How many messages are in each state, exact as of ``final_as_of`` (when they were read; the name is kept
    from when the final states were a cached count)."""

    counts: dict[MessageState, int]
    final_as_of: datetime


def counts_statement(states: tuple[MessageState, ...]) -> sa.Select[Any]:
    """How many messages are in each of ``states``, counted in the ``message`` table (the exact reference the
    stored counts are checked against, and what the benchmark compares them with)."""
    c = message_table.c
    return sa.select(c.state, sa.func.count()).where(c.state.in_(states)).group_by(c.state)


class MessageCounts:
    """The state counts of one store (thread-safe: the admin API and the metrics call it from worker threads).

    ``fold_interval``: seconds between the folds of :meth:`run`; ``max_tail``: a read that added more transitions
    than this starts a fold; ``route_ttl``: how old (seconds) the per-route backlog counts may be.
    """

    def __init__(
        self,
        store: MessageStore,
        route_ttl: float = 5.0,
        *,
        fold_interval: float = 2.0,
        max_tail: int = 20_000,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        if route_ttl < 0 or fold_interval <= 0 or max_tail < 0:
            raise ConfigurationError(
                f"route_ttl must be >= 0, fold_interval > 0 and max_tail >= 0 (seconds, rows), got "
                f"route_ttl={route_ttl} fold_interval={fold_interval} max_tail={max_tail}"
            )
        self.store = store
        self.route_ttl = route_ttl
        self.fold_interval = fold_interval
        self.max_tail = max_tail
        self._monotonic = monotonic
        self._lock = threading.Lock()
        self._routes: tuple[float, list[tuple[str, str, MessageState, int]]] | None = None
        self._folding: threading.Thread | None = None
        #: whether the fold loop finds the store unreachable
        self.outage = StoreOutage.of_loop("message counts")

    def by_state(self) -> StateCounts:
        """Exact counts of every state (states without messages left out)."""
        counts, tail = self.store.counts.by_state()
        if tail > self.max_tail:
            self._fold_soon()
        return StateCounts(counts, datetime.now(UTC))

    def by_route(self) -> dict[tuple[str, str], dict[MessageState, int]]:
        """(service, operation) -> state -> exact count."""
        return self.store.counts.by_route()

    def fold(self) -> int | None:
        """Fold the settled transitions into the stored counts (:meth:`StoredCounts.fold`): rows folded, None when
        another node folds now."""
        return self.store.counts.fold()

    async def run(self, stop: asyncio.Event) -> None:
        """Fold every ``fold_interval`` seconds until ``stop`` is set (in a worker thread; outages logged once)."""
        await run_passes(
            lambda: asyncio.to_thread(self.fold),
            self.fold_interval,
            stop,
            self.outage,
            "folding the message counts failed; tried again at the next interval",
            log,
        )

    def _fold_soon(self) -> None:
        with self._lock:
            if self._folding is not None:
                return
            self._folding = threading.Thread(target=self._fold_in_background, name="message-counts-fold", daemon=True)
            self._folding.start()

    def _fold_in_background(self) -> None:
        try:
            for _ in range(2):  # PostgreSQL: the first fold sets the pending mark the second one folds up to
                self.fold()
        except sa.exc.SQLAlchemyError as error:  # the reads stay exact, only slower; the next long read tries again
            log.warning("message counts not folded: %s", mask_secrets(str(error).splitlines()[0]))
        finally:
            with self._lock:
                self._folding = None

    def wait_for_fold(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for a fold started by a read; True when none runs."""
        with self._lock:
            running = self._folding
        if running is not None:
            running.join(timeout)
            return not running.is_alive()
        return True

    def open_by_route(self) -> list[tuple[str, str, MessageState, int]]:
        """(service, operation, state, count) of the non-final messages, cached for ``route_ttl`` seconds."""
        with self._lock:
            cached = self._routes
            if cached is not None and self._monotonic() - cached[0] <= self.route_ttl:
                return cached[1]
        rows = [
            (service, operation, state, n)
            for (service, operation), states in self.by_route().items()
            for state, n in states.items()
            if state in OPEN_STATES
        ]
        with self._lock:
            self._routes = (self._monotonic(), rows)
        return rows

    def invalidate(self) -> None:
        """Forget the cached per-route backlog (the next call reads the store)."""
        with self._lock:
            self._routes = None
