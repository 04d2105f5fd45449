"""Throttling counters in the store: requests per source system, operation and fixed window, shared by all nodes.

The requests waiting at one moment are counted together: one statement adds the ``k`` requests of one system,
operation and window at once, when they all fit, atomically on SQLite and PostgreSQL::

    INSERT INTO throttle_counter (source_system, operation, window_start, count) VALUES (?, ?, ?, :k)
    ON CONFLICT (source_system, operation, window_start)
    DO UPDATE SET count = throttle_counter.count + :k WHERE throttle_counter.count + :k <= :limit
    RETURNING count

When they do not all fit the statement updates nothing (and keeps the row locked for the transaction), so the
count is read and raised to the limit: the first requests in order are admitted, the others refused and not
counted. Two nodes counting at once serialise on the row (PostgreSQL's row lock, SQLite's write lock): together
they admit the limit, not twice it. One statement per (system, operation) and batch, not per request, is what
keeps the counter cheap (docs/performance.md, "The throttling counter").
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
        # built once with bind parameters: a batch costs one execution of a cached statement per system/operation
        self._add = insert.values(
            source_system=sa.bindparam("at_system"), operation=sa.bindparam("at_operation"),
            window_start=sa.bindparam("at_window"), count=sa.bindparam("k"),
        ).on_conflict_do_update(
            index_elements=[_C.source_system, _C.operation, _C.window_start],
            set_={"count": _C.count + sa.bindparam("k")},
            where=_C.count + sa.bindparam("k") <= sa.bindparam("limit"),
        ).returning(_C.count)
        this_window = sa.and_(_C.source_system == sa.bindparam("at_system"),
                              _C.operation == sa.bindparam("at_operation"),
                              _C.window_start == sa.bindparam("at_window"))
        self._current = sa.select(_C.count).where(this_window).with_for_update()
        self._fill = sa.update(throttle_counter_table).where(this_window).values(count=sa.bindparam("full"))
        self._prune = sa.delete(throttle_counter_table).where(
            _C.source_system == sa.bindparam("at_system"), _C.operation == sa.bindparam("at_operation"),
            _C.window_start < sa.bindparam("at_window"),
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
        in order (a request sees the counts of the ones before it): one statement per distinct (system, operation,
        window, limit) while they fit."""
        groups: dict[tuple[str, str, int, int], list[int]] = {}
        for index, request in enumerate(requests):
            groups.setdefault(request, []).append(index)
        counts: list[int | None] = [None] * len(requests)
        taken = self._reserve([(*key, len(indexes)) for key, indexes in groups.items()])
        for ((before, admitted), indexes) in zip(taken, groups.values(), strict=True):
            for number, index in enumerate(indexes[:admitted], start=1):
                counts[index] = before + number
        return counts

    def reserve_many(self, blocks: Sequence[tuple[str, str, int, int, int]]) -> list[int]:
        """Count up to ``wanted`` requests for each (source system, operation, window start, limit, wanted) block, in
        one transaction, in order; returns how many each got: ``wanted``, or what was left of the window's limit.

        A node that takes more than its waiting requests need holds the rest as permits it spends without the store
        (:class:`~openroute.inbound.throttling.Throttling`). Raises SQLAlchemy's errors, like :meth:`take`."""
        return [admitted for _, admitted in self._reserve(blocks)]

    def _reserve(self, blocks: Sequence[tuple[str, str, int, int, int]]) -> list[tuple[int, int]]:
        postgres = self.store.dialect == "postgresql"

        def work(connection: sa.Connection) -> list[tuple[int, int]]:
            if postgres:  # a count lost to a crash costs nothing: do not wait for the WAL flush
                connection.exec_driver_sql("SET LOCAL synchronous_commit = off")
            return [self._add_group(connection, *block) for block in blocks]

        return self.store.run(work)

    def _add_group(self, connection: sa.Connection, system: str, operation: str, window: int, limit: int,
                   wanted: int) -> tuple[int, int]:
        """Count up to ``wanted`` requests of one system, operation and window; returns (the count before, how many
        were admitted)."""
        values = {"at_system": system, "at_operation": operation, "at_window": window}
        wanted = min(wanted, limit)  # beyond the limit is refused whatever the count
        count = connection.execute(self._add, {**values, "k": wanted, "limit": limit}).scalar()
        if count is not None:
            if count == wanted:  # the window's first requests (no row has 0): the earlier windows' rows go
                connection.execute(self._prune, values)
            return int(count) - wanted, wanted
        # not all fit: the row exists and is locked by this transaction (the upsert locks it even when it updates
        # nothing; SQLite's write lock is held anyway), so its count stays what is read here
        before = int(connection.execute(self._current, values).scalar_one())
        admitted = max(0, limit - before)
        if admitted:
            connection.execute(self._fill, {**values, "full": before + admitted})
        return before, admitted

    def count(self, source_system: str, operation: str, window_start: int) -> int:
        """The requests counted for ``source_system`` / ``operation`` in the window starting at ``window_start``."""
        query = sa.select(_C.count).where(
            _C.source_system == source_system, _C.operation == operation, _C.window_start == window_start)
        return int(self.store.run(lambda connection: connection.execute(query).scalar()) or 0)
