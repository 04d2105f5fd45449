"""Throttling counters in the store: requests per source system, operation and fixed window, shared by all nodes.

One statement counts a request and tells whether it was under the limit, atomically on SQLite and PostgreSQL::

    INSERT INTO throttle_counter (source_system, operation, window_start, count) VALUES (?, ?, ?, 1)
    ON CONFLICT (source_system, operation, window_start)
    DO UPDATE SET count = throttle_counter.count + 1 WHERE throttle_counter.count < :limit
    RETURNING count

A request over the limit updates no row, so it returns nothing and is not counted. Two nodes counting at once
serialise on the row (PostgreSQL's row lock, SQLite's write lock): together they admit the limit, not twice it.
On PostgreSQL the counting transaction does not wait for its WAL flush (``synchronous_commit = off``): a crash
can forget the last counts of a window, which only lets a few more requests through.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from openroute.persistence.models import throttle_counter_table
from openroute.persistence.store import MessageStore
from sqlalchemy.dialects import postgresql, sqlite

__all__ = ["ThrottleCounters"]

_C = throttle_counter_table.c


class ThrottleCounters:
    """The shared counters of the throttling rules, in ``store``'s database (table ``throttle_counter``)."""

    def __init__(self, store: MessageStore) -> None:
        self.store = store
        insert = (postgresql.insert if store.dialect == "postgresql" else sqlite.insert)(throttle_counter_table)
        # built once with bind parameters: a request costs one execution of a cached statement
        self._take = insert.values(
            source_system=sa.bindparam("system"), operation=sa.bindparam("operation"),
            window_start=sa.bindparam("window"), count=1,
        ).on_conflict_do_update(
            index_elements=[_C.source_system, _C.operation, _C.window_start],
            set_={"count": _C.count + 1},
            where=_C.count < sa.bindparam("limit"),
        ).returning(_C.count)
        self._prune = sa.delete(throttle_counter_table).where(
            _C.source_system == sa.bindparam("system"), _C.operation == sa.bindparam("operation"),
            _C.window_start < sa.bindparam("window"),
        )

    def take(self, source_system: str, operation: str, window_start: int, limit: int) -> int | None:
        """Count one request of ``source_system`` / ``operation`` in the window starting at ``window_start``
        (milliseconds since the epoch) if fewer than ``limit`` were counted there. Returns the new count, or None
        when the window is full (nothing counted). The first request of a window deletes the earlier windows' rows.

        Raises SQLAlchemy's errors (see :func:`~openroute.persistence.is_store_unreachable` for an outage).
        """
        return self.take_many([(source_system, operation, window_start, limit)])[0]

    def take_many(self, requests: Sequence[tuple[str, str, int, int]]) -> list[int | None]:
        """:meth:`take` for several (source system, operation, window start, limit) requests in one transaction,
        in order (a request sees the counts of the ones before it)."""
        postgres = self.store.dialect == "postgresql"

        def work(connection: sa.Connection) -> list[int | None]:
            if postgres:  # a count lost to a crash costs nothing: do not wait for the WAL flush
                connection.exec_driver_sql("SET LOCAL synchronous_commit = off")
            counts: list[int | None] = []
            for system, operation, window, limit in requests:
                values = {"system": system, "operation": operation, "window": window}
                count = connection.execute(self._take, {**values, "limit": limit}).scalar()
                if count == 1:
                    connection.execute(self._prune, values)
                counts.append(None if count is None else int(count))
            return counts

        return self.store.run(work)

    def count(self, source_system: str, operation: str, window_start: int) -> int:
        """The requests counted for ``source_system`` / ``operation`` in the window starting at ``window_start``."""
        query = sa.select(_C.count).where(
            _C.source_system == source_system, _C.operation == operation, _C.window_start == window_start)
        return int(self.store.run(lambda connection: connection.execute(query).scalar()) or 0)
