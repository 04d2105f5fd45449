"""Message counts per route and state kept by the store (``store.counts``): a folded table plus the transitions since.

``message_count`` (migration 0014) holds how many messages each (service, operation) has in each state *as of the
mark*: every ``message_transition`` row with an id up to ``message_count_mark.transition_id`` is in it. A read adds
the transitions after the mark (minus one for the state each left, plus one for the state each reached) in the
same snapshot, so it answers exactly what a ``GROUP BY`` of the ``message`` table would in that snapshot, at the
cost of the transitions since the mark (a primary-key range), not of the table. Every writer of a state writes its
transition row in the same transaction (``persistence/transitions.py``), so the transitions are the change log.

:meth:`StoredCounts.fold` moves the mark forward (each node's loop does it every few seconds, see
``openroute.admin.counts``). Transition ids come from a sequence and commit out of order: a transaction may commit
a transition below the highest id already visible. On PostgreSQL a fold therefore only folds up to a *pending*
mark recorded by an earlier fold: the highest visible id then, and the snapshot's ``xmax`` read after it; once
the oldest running transaction is past that ``xmax``, every transaction that could still commit an id below the
pending mark has ended, so the range is final (a writer takes its transition id after writing its message row,
so it has its transaction id by then). The oldest running transaction is the cluster's: when it is not one
writing ``message_transition`` (``pg_locks``), the writers of this database decide. On SQLite writers are
serialised: a fold folds up to the highest id.

A deleted message (retention, archive, any ``DELETE``) takes its transitions with it (``ON DELETE CASCADE``); a
trigger on ``message`` (migration 0014) takes it out of the counts in the deleting transaction, in the state it
had at the mark (the state its first transition after the mark left, or its state when it has none; a message
stored after the mark was never in the table): it appends a row (service, operation, state, -1) to
``message_count_delta``, a table without a key. Deleters only insert, so two transactions deleting messages of
the same routes (retention on one node, an archive or an operator's delete on another) never wait for each other
or deadlock, as they did when each updated the shared ``message_count`` rows. The reads add the deltas, grouped,
in the same snapshot; a fold moves the deltas it sees into ``message_count`` and deletes exactly those rows
(``DELETE ... RETURNING``) in its transaction, which holds the mark ``FOR UPDATE`` (a deleter holds it ``FOR
SHARE`` until it ends, so its mark stays the one it used). ``TRUNCATE`` (PostgreSQL) empties the table and resets the
mark. A write that changes ``message.state`` without a transition row (raw SQL, ``benchmarks/store_fill.py``)
is not seen: :meth:`StoredCounts.recount` counts the table again.
"""

from __future__ import annotations

import contextlib
import functools
from collections import defaultdict
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from openroute.persistence.database import StorePart
from openroute.persistence.models import (
    MessageState,
    message_count_delta_table,
    message_count_mark_table,
    message_count_table,
    message_table,
    message_transition_table,
)

__all__ = ["StoredCounts", "recount", "route_counts_statement", "state_counts_statement"]

_MARK_ID = 1
_MARK = sa.select(message_count_mark_table.c.transition_id).where(message_count_mark_table.c.id == _MARK_ID)
#: another transaction writing ``message_transition`` that began before ``:xmax`` (or has no id yet): the oldest
#: running transaction of the whole cluster (``pg_snapshot_xmin``) may be one of another database
_WRITING_BEFORE = sa.text(
    "SELECT 1 FROM pg_locks l LEFT JOIN pg_locks x ON x.virtualtransaction = l.virtualtransaction"
    " AND x.locktype = 'transactionid'"
    " WHERE l.locktype = 'relation' AND l.relation = 'message_transition'::regclass AND l.mode = 'RowExclusiveLock'"
    " AND l.pid <> pg_backend_pid() AND (x.transactionid IS NULL"
    " OR pg_snapshot_xmax(pg_current_snapshot())::text::bigint - age(x.transactionid) < :xmax) LIMIT 1"
)


def _transitions(
    low: int | sa.BindParameter[int], high: int | None = None, by_route: bool = False, lateral: bool = False
) -> sa.Select[Any]:
    """(service, operation,) to state, from state, rows: the transitions with an id in (low, high], grouped (one
    range scan of the primary key; each counts one for the state it reached, minus one for the state it left).

    ``lateral`` (PostgreSQL): the route of each message with transitions in the range is looked up once, by its
    primary key, in a LATERAL subquery (``OFFSET 0`` keeps it one); as a plain join, the planner hashed the whole
    message table for 10,000 transitions (31,000 buffers instead of ~4.6 per message)."""
    t = message_transition_table.c
    m = message_table.c
    window = [t.id > low] if high is None else [t.id > low, t.id <= high]
    if not by_route:
        rows = sa.func.count()
        return sa.select(t.to_state, t.from_state, rows, rows).where(*window).group_by(t.to_state, t.from_state)
    if lateral:  # each message once (it has several transitions in a few seconds), then joined back by id
        ids = sa.select(t.message_id).where(*window).distinct().subquery("ids")
        route = sa.select(m.service, m.operation).where(m.id == ids.c.message_id).offset(0).lateral("route")
        routes = (  # OFFSET 0 again: one lookup per message, not per transition joined to its id first
            sa.select(ids.c.message_id, route.c.service, route.c.operation)
            .select_from(ids.join(route, sa.true()))
            .offset(0)
            .subquery("routes")
        )
        service, operation = routes.c.service, routes.c.operation
        source: Any = message_transition_table.join(routes, routes.c.message_id == t.message_id)
    else:
        service, operation = m.service, m.operation
        source = message_transition_table.join(message_table, m.id == t.message_id)
    return (
        sa.select(service, operation, t.to_state, t.from_state, sa.func.count())
        .select_from(source)
        .where(*window)
        .group_by(service, operation, t.to_state, t.from_state)
    )


def state_counts_statement(mark: int) -> sa.CompoundSelect[Any]:
    """(state, None, messages, 0) of the stored counts, (state, None, messages, rows) of the deltas of deleted
    messages, then (to state, from state, rows, rows) of the transitions after ``mark`` (the mark of the same
    snapshot: a value, not a subquery, so the planner reads the id range from the primary key)."""
    c = message_count_table.c
    d = message_count_delta_table.c
    stored = sa.select(c.state, sa.null(), sa.func.sum(c.n), sa.literal(0)).group_by(c.state)
    deltas = sa.select(d.state, sa.null(), sa.func.sum(d.n), sa.func.count()).group_by(d.state)
    return sa.union_all(stored, deltas, _transitions(mark))


def route_counts_statement(mark: int, dialect: str = "postgresql") -> sa.CompoundSelect[Any]:
    """(service, operation, state, None, messages) of the stored counts, then (service, operation, to state, from
    state, rows) of the deltas of deleted messages and of the transitions after ``mark``."""
    return _route_counts(dialect).params(mark=mark)


@functools.cache
def _route_counts(dialect: str) -> sa.CompoundSelect[Any]:
    """:func:`route_counts_statement` with the mark a parameter ``mark``: built once per dialect (building it
    cost 0.4 ms of CPU, more than executing it)."""
    c = message_count_table.c
    d = message_count_delta_table.c
    deltas = sa.select(d.service, d.operation, d.state, sa.null(), sa.func.sum(d.n)).group_by(
        d.service, d.operation, d.state
    )
    changes = _transitions(sa.bindparam("mark", type_=sa.Integer), by_route=True, lateral=dialect == "postgresql")
    return sa.union_all(sa.select(c.service, c.operation, c.state, sa.null(), c.n), deltas, changes)


def _routes(rows: Any) -> dict[tuple[str, str, MessageState], int]:
    """(service, operation, state) -> messages, from rows of :func:`route_counts_statement`'s shape."""
    counts: dict[tuple[str, str, MessageState], int] = defaultdict(int)
    for service, operation, to_state, from_state, n in rows:
        counts[service, operation, MessageState(to_state)] += int(n)
        if from_state is not None:
            counts[service, operation, MessageState(from_state)] -= int(n)
    return counts


class StoredCounts(StorePart):
    """The ``message_count`` table of ``database`` and the transitions after its mark (see the module docstring)."""

    def by_state(self) -> tuple[dict[MessageState, int], int]:
        """Messages per state (states without any left out), exact in one snapshot; and how many transition and
        delta rows the read added (what a :meth:`fold` would save the next reads)."""
        counts: dict[MessageState, int] = defaultdict(int)
        tail = 0
        with self.snapshot() as conn:
            for to_state, from_state, n, rows in conn.execute(state_counts_statement(self._mark(conn))):
                counts[MessageState(to_state)] += int(n)
                if from_state is not None:
                    counts[MessageState(from_state)] -= int(n)
                tail += int(rows)
        return {s: n for s, n in counts.items() if n}, tail

    def by_route(self, connection: sa.Connection | None = None) -> dict[tuple[str, str], dict[MessageState, int]]:
        """(service, operation) -> state -> messages, exact in one snapshot (the transitions after the mark are
        joined to their messages for the route): ``connection``'s transaction when given (from :meth:`snapshot`,
        so that the caller's other reads see the same one), else a transaction of its own."""
        if connection is None:
            with self.snapshot() as conn:
                return self.by_route(conn)
        statement = _route_counts(self.database.dialect)
        counted = _routes(connection.execute(statement, {"mark": self._mark(connection)}))
        routes: dict[tuple[str, str], dict[MessageState, int]] = {}
        for (service, operation, state), n in sorted(counted.items()):
            if n:
                routes.setdefault((service, operation), {})[state] = n
        return routes

    @contextlib.contextmanager
    def snapshot(self) -> Iterator[sa.Connection]:
        """A read-only transaction whose statements share one snapshot (PostgreSQL: REPEATABLE READ; SQLite's
        transactions are serialised), for :meth:`by_route` and the caller's own reads."""
        engine = self.database.engine
        with engine.connect() as conn:
            if self.database.dialect == "postgresql":
                conn = conn.execution_options(isolation_level="REPEATABLE READ", postgresql_readonly=True)
            with conn.begin():
                yield conn

    @staticmethod
    def _mark(conn: sa.Connection) -> int:
        found = conn.execute(_MARK).scalar_one_or_none()
        return 0 if found is None else int(found)

    def fold(self) -> int | None:
        """Move the mark forward over the transitions that can no longer change (see the module docstring), adding
        them and the deltas of deleted messages to ``message_count``, in one transaction of its own. Returns how many
        transition and delta rows were folded, None when another node folds or a deleter holds the mark right now
        (PostgreSQL; the caller just tries again later)."""
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
            # the deltas committed so far, taken out of their table: no deleter is running (it holds the mark FOR SHARE)
            deltas = self._take_deltas(conn, postgres)
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
                return self._add(conn, deltas)  # the pending mark is not final yet: the next fold tries again
            transitions: list[Any] = []
            if target is not None and target > low:
                transitions = list(conn.execute(_transitions(low, target, True, postgres)).all())
                low = target
            folded = self._add(conn, deltas + transitions)
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

    @staticmethod
    def _take_deltas(conn: sa.Connection, postgres: bool) -> list[Any]:
        """Delete the deltas visible now and return them as (service, operation, state, None, n) rows (PostgreSQL:
        grouped in the statement, so an archive's hundreds of thousands of deltas come back as a row per route)."""
        d = message_count_delta_table.c
        taken = sa.delete(message_count_delta_table).returning(d.service, d.operation, d.state, d.n)
        if not postgres:  # no DELETE in a WITH on SQLite
            return [(service, operation, state, None, n) for service, operation, state, n in conn.execute(taken)]
        gone = taken.cte("gone")
        grouped = sa.select(gone.c.service, gone.c.operation, gone.c.state, sa.null(), sa.func.sum(gone.c.n))
        return list(conn.execute(grouped.group_by(gone.c.service, gone.c.operation, gone.c.state)).all())

    def _add(self, conn: sa.Connection, rows: list[Any]) -> int:
        """Add ``rows`` (deltas and grouped transitions, :func:`_routes`' shape) to ``message_count``; their rows."""
        changed = [
            {"service": service, "operation": operation, "state": state, "n": n}
            for (service, operation, state), n in _routes(rows).items()
            if n
        ]
        if changed:
            c = message_count_table.c
            insert = self.database.upsert(message_count_table)
            conn.execute(
                insert.on_conflict_do_update(
                    index_elements=[c.service, c.operation, c.state], set_={"n": c.n + insert.excluded.n}
                ),
                changed,
            )
            conn.execute(sa.delete(message_count_table).where(c.n == 0))
        return sum(abs(int(row[-1])) for row in rows)

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
    connection.execute(sa.delete(message_count_delta_table))
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
