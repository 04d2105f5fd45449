"""Message counts per route and state kept by the store (``store.counts``): a folded table plus the transitions since.

``message_count`` (migration 0014) holds how many messages each (service, operation) has in each state *as of the
mark*: every ``message_transition`` row with an id up to ``message_count_mark.transition_id`` is in it. A read adds
the transitions after the mark (minus one for the state each left, plus one for the state each reached) in the
same statement, so it answers exactly what a ``GROUP BY`` of the ``message`` table would in that snapshot, at the
cost of the transitions since the mark (an index range), not of the table. Every writer of a state writes its
transition row in the same transaction (``persistence/transitions.py``), so the transitions are the change log.

:meth:`StoredCounts.fold` moves the mark forward (each node's loop does it every few seconds, see
``openroute.admin.counts``). Transaction ids come from a sequence and commit out of order: a transaction may commit
a transition below the highest id already visible. On PostgreSQL a fold therefore only folds up to a *pending*
mark recorded by an earlier fold: the highest visible id then, and the snapshot's ``xmax`` read after it; once
the oldest running transaction is past that ``xmax``, every transaction that could still commit an id below the
pending mark has ended, so the range is final (a writer takes its transition id after writing its message row,
so it has its transaction id by then). The oldest running transaction is the cluster's: when it is not one
writing ``message_transition`` (``pg_locks``), the writers of this database decide. On SQLite writers are
serialised: a fold folds up to the highest id.

A deleted message (retention, archive, any ``DELETE``) takes its transitions with it (``ON DELETE CASCADE``); a
trigger on ``message`` (migration 0014) takes it out of ``message_count`` in the deleting transaction, in the
state it had at the mark (the state its first transition after the mark left, or its state when it has none; a
message stored after the mark was never in the table). ``TRUNCATE`` (PostgreSQL) empties the table and resets the
mark. A write that changes ``message.state`` without a transition row (raw SQL, ``benchmarks/store_fill.py``)
is not seen: :meth:`StoredCounts.recount` counts the table again.
"""

from __future__ import annotations

import contextlib
from collections import defaultdict
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from openroute.persistence.database import StorePart
from openroute.persistence.models import (
    MessageState,
    message_count_mark_table,
    message_count_table,
    message_table,
    message_transition_table,
)

__all__ = ["StoredCounts", "recount", "route_counts_statement", "state_counts_statement"]

_MARK_ID = 1
#: another transaction writing ``message_transition`` that began before ``:xmax`` (or has no id yet): the oldest
#: running transaction of the whole cluster (``pg_snapshot_xmin``) may be one of another database
_WRITING_BEFORE = sa.text(
    "SELECT 1 FROM pg_locks l LEFT JOIN pg_locks x ON x.virtualtransaction = l.virtualtransaction"
    " AND x.locktype = 'transactionid'"
    " WHERE l.locktype = 'relation' AND l.relation = 'message_transition'::regclass AND l.mode = 'RowExclusiveLock'"
    " AND l.pid <> pg_backend_pid() AND (x.transactionid IS NULL"
    " OR pg_snapshot_xmax(pg_current_snapshot())::text::bigint - age(x.transactionid) < :xmax) LIMIT 1"
)


def _changes(low: Any, high: Any = None, by_route: bool = False) -> sa.Subquery:
    """(service, operation,) state, +1/-1 per transition row with an id in (low, high]: one for the state it
    reached, minus one for the state it left."""
    t = message_transition_table.c
    m = message_table.c
    window = [t.id > low] if high is None else [t.id > low, t.id <= high]

    def part(state: Any, sign: int, *extra: Any) -> sa.Select[Any]:
        columns = [state.label("state"), sa.literal(sign).label("n")]
        query = sa.select(*columns).where(*window, *extra)
        if by_route:
            query = (
                sa.select(m.service, m.operation, *columns)
                .select_from(message_transition_table.join(message_table, m.id == t.message_id))
                .where(*window, *extra)
            )
        return query

    return sa.union_all(part(t.to_state, 1), part(t.from_state, -1, t.from_state.is_not(None))).subquery("changes")


def state_counts_statement(mark: int) -> sa.CompoundSelect[Any]:
    """(state, messages, transition rows read) of the stored counts, then of the transitions after ``mark`` (the
    mark of the same snapshot: a value, not a subquery, so the planner reads the id range from the primary key)."""
    c = message_count_table.c
    changes = _changes(mark)
    return sa.union_all(
        sa.select(c.state, sa.func.sum(c.n), sa.literal(0)).group_by(c.state),
        sa.select(changes.c.state, sa.func.sum(changes.c.n), sa.func.count()).group_by(changes.c.state),
    )


def route_counts_statement(mark: int) -> sa.CompoundSelect[Any]:
    """(service, operation, state, messages) of the stored counts, then of the transitions after ``mark``."""
    c = message_count_table.c
    changes = _changes(mark, by_route=True)
    return sa.union_all(
        sa.select(c.service, c.operation, c.state, c.n),
        sa.select(changes.c.service, changes.c.operation, changes.c.state, sa.func.sum(changes.c.n)).group_by(
            changes.c.service, changes.c.operation, changes.c.state
        ),
    )


class StoredCounts(StorePart):
    """The ``message_count`` table of ``database`` and the transitions after its mark (see the module docstring)."""

    def by_state(self) -> tuple[dict[MessageState, int], int]:
        """Messages per state (states without any left out), exact in one snapshot; and how many transition rows
        after the mark the read added (what a :meth:`fold` would save the next reads)."""
        counts: dict[MessageState, int] = defaultdict(int)
        tail = 0
        with self._snapshot() as conn:
            for state, n, rows in conn.execute(state_counts_statement(self._mark(conn))):
                counts[MessageState(state)] += int(n)
                tail += int(rows)
        return {s: n for s, n in counts.items() if n}, tail

    def by_route(self) -> dict[tuple[str, str], dict[MessageState, int]]:
        """(service, operation) -> state -> messages, exact in one snapshot (the transitions after the mark are
        joined to their messages for the route)."""
        counts: dict[tuple[str, str], dict[MessageState, int]] = {}
        with self._snapshot() as conn:
            for service, operation, state, n in conn.execute(route_counts_statement(self._mark(conn))):
                route = counts.setdefault((service, operation), defaultdict(int))
                route[MessageState(state)] += int(n)
        kept = {key: {s: n for s, n in states.items() if n} for key, states in sorted(counts.items())}
        return {key: states for key, states in kept.items() if states}

    @contextlib.contextmanager
    def _snapshot(self) -> Iterator[sa.Connection]:
        """A read transaction whose statements share one snapshot (PostgreSQL: REPEATABLE READ; SQLite's
        transactions are serialised)."""
        engine = self.database.engine
        with engine.connect() as conn:
            if self.database.dialect == "postgresql":
                conn = conn.execution_options(isolation_level="REPEATABLE READ", postgresql_readonly=True)
            with conn.begin():
                yield conn

    @staticmethod
    def _mark(conn: sa.Connection) -> int:
        mark = message_count_mark_table.c
        found = conn.execute(sa.select(mark.transition_id).where(mark.id == _MARK_ID)).scalar_one_or_none()
        return 0 if found is None else int(found)

    def fold(self) -> int | None:
        """Move the mark forward over the transitions that can no longer change (see the module docstring), adding
        them to ``message_count``, in one transaction of its own. Returns how many transition rows were folded, None
        when another node folds right now (PostgreSQL; the caller just tries again later)."""
        mark = message_count_mark_table.c
        postgres = self.database.dialect == "postgresql"
        with self.database.begin() as conn:
            # before this transaction takes a transaction id: the oldest one still running
            oldest = (
                conn.execute(sa.text("SELECT pg_snapshot_xmin(pg_current_snapshot())::text::bigint")).scalar_one()
                if postgres
                else None
            )
            row = conn.execute(
                sa.select(mark.transition_id, mark.pending_id, mark.pending_xmax)
                .where(mark.id == _MARK_ID)
                .with_for_update(skip_locked=True)
            ).first()
            if row is None:
                return None
            low, pending, pending_xmax = int(row[0]), row[1], row[2]
            top = conn.execute(sa.select(sa.func.max(message_transition_table.c.id))).scalar_one() or 0
            if not postgres:
                target: int | None = top  # one writer at a time: every id up to the highest visible is committed
            elif pending is None or pending <= low:
                target = None
            elif (oldest is not None and oldest >= pending_xmax) or not conn.execute(
                _WRITING_BEFORE, {"xmax": pending_xmax}
            ).first():
                target = int(pending)  # every transaction open when the pending mark was read has ended
            else:
                return 0  # the pending mark is not final yet: the next fold tries again
            folded = 0
            if target is not None and target > low:
                folded = self._add(conn, low, target)
                low = target
            values: dict[str, Any] = {
                "transition_id": low,
                "pending_id": None,
                "pending_xmax": None,
                "folded_at": datetime.now(UTC),
            }
            if postgres and top > low:
                values["pending_id"] = top  # read before the xmax below (see the module docstring)
                values["pending_xmax"] = conn.execute(
                    sa.text("SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint")
                ).scalar_one()
            if folded or values["pending_id"] != pending or low != int(row[0]):
                conn.execute(sa.update(message_count_mark_table).where(mark.id == _MARK_ID).values(values))
            return folded

    def _add(self, conn: sa.Connection, low: int, high: int) -> int:
        changes = _changes(low, high, by_route=True)
        summed = (
            sa.select(
                changes.c.service, changes.c.operation, changes.c.state, sa.func.sum(changes.c.n).label("n")
            ).group_by(changes.c.service, changes.c.operation, changes.c.state)
        ).subquery("summed")
        c = message_count_table.c
        insert = self.database.upsert(message_count_table).from_select(
            ["service", "operation", "state", "n"],
            sa.select(summed.c.service, summed.c.operation, summed.c.state, summed.c.n).where(sa.true()),
        )
        conn.execute(
            insert.on_conflict_do_update(
                index_elements=[c.service, c.operation, c.state], set_={"n": c.n + insert.excluded.n}
            )
        )
        conn.execute(sa.delete(message_count_table).where(c.n == 0))
        t = message_transition_table.c
        return int(conn.execute(sa.select(sa.func.count()).where(t.id > low, t.id <= high)).scalar_one())

    def recount(self) -> None:
        """Count the ``message`` table again (and set the mark to the highest transition): after writes that did
        not go through the store (see the module docstring). Blocks writers meanwhile on PostgreSQL."""
        with self.database.begin() as conn:
            recount(conn)


def recount(connection: sa.Connection) -> None:
    """Fill ``message_count`` from a ``GROUP BY`` of ``message`` and set the mark to the highest transition id, in
    ``connection``'s transaction. On PostgreSQL it first takes a SHARE lock on ``message``: writers (who write
    their message row before their transition row) wait, so no transaction below the mark is still open."""
    if connection.dialect.name == "postgresql":
        connection.exec_driver_sql("LOCK TABLE message IN SHARE MODE")
    m = message_table.c
    connection.execute(sa.delete(message_count_table))
    connection.execute(
        sa.insert(message_count_table).from_select(
            ["service", "operation", "state", "n"],
            sa.select(m.service, m.operation, m.state, sa.func.count()).group_by(m.service, m.operation, m.state),
        )
    )
    top = connection.execute(sa.select(sa.func.max(message_transition_table.c.id))).scalar_one() or 0
    mark = message_count_mark_table
    connection.execute(sa.delete(mark))
    connection.execute(
        sa.insert(mark).values(
            id=_MARK_ID, transition_id=top, pending_id=None, pending_xmax=None, folded_at=datetime.now(UTC)
        )
    )
