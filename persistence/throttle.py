"""Throttling counters in the store: requests per source system, operation and fixed window, shared by all nodes.

One statement counts a request and tells whether it was under the limit, atomically on SQLite and PostgreSQL::

    INSERT INTO throttle_counter (source_system, operation, window_start, count) VALUES (?, ?, ?, 1)
    ON CONFLICT (source_system, operation, window_start)
    DO UPDATE SET count = throttle_counter.count + 1 WHERE throttle_counter.count < :limit
    RETURNING count

A request over the limit updates no row, so it returns nothing and is not counted. Two nodes counting at once
serialise on the row (PostgreSQL's row lock, SQLite's write lock): together they admit the limit, not twice it.
"""

from __future__ import annotations

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
        self._insert = postgresql.insert if store.dialect == "postgresql" else sqlite.insert

    def take(self, source_system: str, operation: str, window_start: int, limit: int) -> int | None:
        """Count one request of ``source_system`` / ``operation`` in the window starting at ``window_start``
        (milliseconds since the epoch) if fewer than ``limit`` were counted there. Returns the new count, or None
        when the window is full (nothing counted). The first request of a window deletes the earlier windows' rows.

        Raises SQLAlchemy's errors (see :func:`~openroute.persistence.is_store_unreachable` for an outage).
        """
        insert = self._insert(throttle_counter_table).values(
            source_system=source_system, operation=operation, window_start=window_start, count=1
        )
        statement = insert.on_conflict_do_update(
            index_elements=[_C.source_system, _C.operation, _C.window_start],
            set_={"count": _C.count + 1},
            where=_C.count < limit,
        ).returning(_C.count)

        def work(connection: sa.Connection) -> int | None:
            count = connection.execute(statement).scalar()
            if count == 1:
                connection.execute(sa.delete(throttle_counter_table).where(
                    _C.source_system == source_system, _C.operation == operation, _C.window_start < window_start))
            return None if count is None else int(count)

        return self.store.run(work)

    def count(self, source_system: str, operation: str, window_start: int) -> int:
        """The requests counted for ``source_system`` / ``operation`` in the window starting at ``window_start``."""
        query = sa.select(_C.count).where(
            _C.source_system == source_system, _C.operation == operation, _C.window_start == window_start)
        return int(self.store.run(lambda connection: connection.execute(query).scalar()) or 0)
