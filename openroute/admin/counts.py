"""Message counts per state for ``/admin/counts`` and ``/metrics``, at a cost that does not grow with the store.

Messages that are not final (the backlog) are counted exactly on every call with a query a state index
answers (its cost follows the backlog, not the table). Final messages only accumulate: counting them reads the
whole table (about 100 ms at 1,000,000 rows), so their counts are a cached value, refreshed in the background once
it is older than ``final_ttl`` seconds (default 5: the console's refresh): a call never waits for that count
except the very first one, and ``StateCounts.final_as_of`` says when the final states were counted
(stale-while-revalidate, as HTTP caches do it). The per-route counts of ``/metrics`` are cached for ``route_ttl``
seconds.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa

from openroute.persistence import FINAL_STATES, MessageState, mask_secrets, message_table

log = logging.getLogger(__name__)

OPEN_STATES: tuple[MessageState, ...] = tuple(s for s in MessageState if s not in FINAL_STATES)


@dataclass(frozen=True)
class StateCounts:
    """How many messages are in each state; final states as of ``final_as_of``."""

    counts: dict[MessageState, int]
    final_as_of: datetime


def counts_statement(states: tuple[MessageState, ...]) -> sa.Select[Any]:
    """How many messages are in each of ``states`` (the open ones on every call, the final ones when the cached
    counts are refreshed)."""
    c = message_table.c
    return sa.select(c.state, sa.func.count()).where(c.state.in_(states)).group_by(c.state)


class MessageCounts:
    """Cached state counts of one store (thread-safe: the admin API and the metrics call it from worker threads).

    ``final_ttl`` / ``route_ttl``: how old (seconds) the final-state counts and the per-route backlog counts
    may be before a call refreshes them.
    """

    def __init__(
        self,
        engine: sa.Engine,
        final_ttl: float = 5.0,
        route_ttl: float = 5.0,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        if final_ttl < 0 or route_ttl < 0:
            raise ValueError(f"cache times must be >= 0 seconds, got final_ttl={final_ttl} route_ttl={route_ttl}")
        self.engine = engine
        self.final_ttl = final_ttl
        self.route_ttl = route_ttl
        self._monotonic = monotonic
        self._lock = threading.Lock()
        self._final: tuple[float, datetime, dict[MessageState, int]] | None = None
        self._routes: tuple[float, list[tuple[str, str, MessageState, int]]] | None = None
        self._refresh: threading.Thread | None = None

    def by_state(self) -> StateCounts:
        """Exact counts of the non-final states, and the (cached) counts of the final states."""
        with self.engine.connect() as connection:
            counts = {MessageState(s): int(n) for s, n in connection.execute(counts_statement(OPEN_STATES)).all()}
            _at, as_of, final = self._final_counts(connection)
        counts.update(final)
        return StateCounts(counts, as_of)

    def _final_counts(self, connection: sa.Connection) -> tuple[float, datetime, dict[MessageState, int]]:
        with self._lock:
            cached = self._final
            if cached is not None:
                if self._monotonic() - cached[0] > self.final_ttl and self._refresh is None:
                    self._refresh = threading.Thread(target=self._refresh_final, name="final-state-counts",
                                                     daemon=True)
                    self._refresh.start()
                return cached
        return self._count_final(connection)

    def _count_final(self, connection: sa.Connection) -> tuple[float, datetime, dict[MessageState, int]]:
        counted = connection.execute(counts_statement(tuple(FINAL_STATES))).all()
        fresh = (self._monotonic(), datetime.now(UTC), {MessageState(s): int(n) for s, n in counted})
        with self._lock:
            self._final = fresh
        return fresh

    def _refresh_final(self) -> None:
        try:
            with self.engine.connect() as connection:
                self._count_final(connection)
        except sa.exc.SQLAlchemyError as error:  # the stale value stays; the next expired call tries again
            log.warning("final-state counts not refreshed: %s", mask_secrets(str(error).splitlines()[0]))
        finally:
            with self._lock:
                self._refresh = None

    def wait_for_refresh(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for a background refresh of the final-state counts; True when none runs."""
        with self._lock:
            running = self._refresh
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
        c = message_table.c
        query = (
            sa.select(c.service, c.operation, c.state, sa.func.count())
            .where(c.state.in_(OPEN_STATES))
            .group_by(c.service, c.operation, c.state)
        )
        with self.engine.connect() as connection:
            rows = [(s, o, MessageState(st), int(n)) for s, o, st, n in connection.execute(query).all()]
        with self._lock:
            self._routes = (self._monotonic(), rows)
        return rows

    def invalidate(self) -> None:
        """Forget the cached values (the next call reads the store, and waits for it)."""
        with self._lock:
            self._final = None
            self._routes = None
