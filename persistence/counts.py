"""Message counts per route and state kept by the store (``store.counts``): a folded table plus the transitions since.

``message_count`` (migration 0014) holds how many messages each (service, operation) has in each state *as of the
mark*: every ``message_transition`` row with an id up to ``message_count_mark.transition_id`` is in it. A read adds
the transitions after the mark (minus one for the state each left, plus one for the state each reached) in the
same snapshot, so it answers exactly what a ``GROUP BY`` of the ``message`` table would in that snapshot, at the
cost of the transitions since the mark (a primary-key range), not of the table. Every writer of a state writes its
transition row in the same transaction (``persistence/transitions.py``), so the transitions are the change log.

:meth:`StoredCounts.fold` moves the mark forward (each node's loop does it every few seconds, see
``openroute.jobs.counts``). Transition ids come from a sequence and commit out of order: a transaction may commit
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

The finished minutes (migration 0017) are kept the same way, for the console's dashboard ("finished in the last
hour", per state and in five-minute bars), which read every message finished in the hour (360,000 rows at 100
messages/s). ``message_finished_minute`` holds, per UTC minute and final state, how many transitions into a final
state (OK, FAILED, SKIPPED, CANCEL: a message restarted after FAILED and then OK counts in both) were folded: the
fold adds those of the range it folds, in its transaction, and deletes the minutes older than
:data:`FINISHED_KEPT`. :meth:`StoredCounts.finished_by_minute` adds, in the same snapshot, the transitions into a
final state after the mark (the same primary-key range as the counts' reads) and the deltas of deleted messages:
the message delete trigger of 0017 appends a row (at, state, -1) to ``message_finished_delta`` for each folded
transition into a final state of the deleted message recent enough to be in a kept minute; the fold moves them
into the minutes. The read costs the minutes times the states plus the tail, and answers exactly what a ``GROUP
BY`` of ``message_transition`` would for the minutes still kept. The minutes are grouped in SQL
(``date_trunc('minute', at, 'UTC')``; SQLite: ``strftime('%Y-%m-%d %H:%M', at)``) and written back as aware
datetimes through the column's type, never as text of this module's making.
"""

from __future__ import annotations

import contextlib
import functools
from collections import defaultdict
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import sqlalchemy as sa
from openroute.persistence._hot_path import _bad_parameter
from openroute.persistence.column_types import UTCDateTime
from openroute.persistence.database import StorePart, upsert
from openroute.persistence.models import (
    FINAL_STATES,
    MessageState,
    message_count_delta_table,
    message_count_mark_table,
    message_count_table,
    message_finished_delta_table,
    message_finished_minute_table,
    message_table,
    message_transition_table,
)

__all__ = [
    "FINISHED_KEPT",
    "StoredCounts",
    "finished_by_minute_statement",
    "recount",
    "refill_finished",
    "route_counts_statement",
    "state_counts_statement",
]

#: how long ``message_finished_minute`` keeps a minute: the dashboard shows the last hour; the rest is slack for a
#: late fold and a clock a little behind. Migration 0017's delete trigger writes this window (plus
#: ``FINISHED_DELTA_MARGIN``) into the database: changing it takes a migration that replaces the trigger.
FINISHED_KEPT = timedelta(hours=2)
#: the delete trigger keeps the finished transitions of a deleted message this much longer than ``FINISHED_KEPT``
#: (by the database's clock), so that a node's clock behind the database's never reads a minute that misses one
FINISHED_DELTA_MARGIN = timedelta(minutes=10)
_FINAL = sorted(state.value for state in FINAL_STATES)

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

    ``lateral`` (PostgreSQL): each message with transitions in the range is taken once (one range scan of the
    primary key), then its route looked up by the message's primary key and its transitions in the range by
    ``ix_message_transition_message``, each in a LATERAL subquery (``OFFSET 0`` keeps them subqueries): every join
    is a nested loop over those messages, one lookup each, whatever the planner estimates. As a plain join the
    planner hashed the whole message table for 10,000 transitions (31,000 buffers instead of ~4.6 per message); with
    the transitions joined back to the messages' routes, a table without statistics yet (a young store: every range
    estimated at one row) ran the routes' subquery once per transition, quadratic (5.9 M index scans, 10.8 s, for
    4,200 transitions)."""
    t = message_transition_table.c
    m = message_table.c
    window = [t.id > low] if high is None else [t.id > low, t.id <= high]
    if not by_route:
        rows = sa.func.count()
        return sa.select(t.to_state, t.from_state, rows, rows).where(*window).group_by(t.to_state, t.from_state)
    if lateral:  # each message once (it has several transitions in a few seconds), its route and moves by index
        ids = sa.select(t.message_id).where(*window).distinct().subquery("ids")
        route = sa.select(m.service, m.operation).where(m.id == ids.c.message_id).offset(0).lateral("route")
        moves = (
            sa.select(t.to_state, t.from_state).where(t.message_id == ids.c.message_id, *window).offset(0)
            .lateral("moves")
        )
        return (
            sa.select(route.c.service, route.c.operation, moves.c.to_state, moves.c.from_state, sa.func.count())
            .select_from(ids.join(route, sa.true()).join(moves, sa.true()))
            .group_by(route.c.service, route.c.operation, moves.c.to_state, moves.c.from_state)
        )
    return (
        sa.select(m.service, m.operation, t.to_state, t.from_state, sa.func.count())
        .select_from(message_transition_table.join(message_table, m.id == t.message_id))
        .where(*window)
        .group_by(m.service, m.operation, t.to_state, t.from_state)
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


def _minute(column: Any, dialect: str) -> sa.ColumnElement[Any]:
    """``column`` (a UTCDateTime) truncated to its UTC minute, in SQL: a ``timestamptz`` on PostgreSQL, the text
    ``YYYY-MM-DD HH:MM`` on SQLite (:func:`_as_minute` reads both). The constants are SQL literals, not bound
    parameters: PostgreSQL sees the same expression in the SELECT and the GROUP BY."""
    if dialect == "postgresql":
        return sa.func.date_trunc(sa.literal_column("'minute'"), column, sa.literal_column("'UTC'"), type_=UTCDateTime)
    return sa.func.strftime(sa.literal_column("'%Y-%m-%d %H:%M'"), column, type_=sa.String)


def _as_minute(value: datetime | str) -> datetime:
    """A minute of :func:`_minute` as an aware UTC datetime."""
    if isinstance(value, str):
        return datetime.strptime(value, "%Y-%m-%d %H:%M").replace(tzinfo=UTC)
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def _finished_transitions(dialect: str, high: bool) -> sa.Select[Any]:
    """(minute, to state, rows) of the transitions into a final state with an id above ``:low`` (and up to ``:high``
    when ``high``) and an ``at`` from ``:since`` on: one range scan of the primary key."""
    t = message_transition_table.c
    minute = _minute(t.at, dialect)
    window = [t.id > sa.bindparam("low", type_=sa.BigInteger)]
    if high:
        window.append(t.id <= sa.bindparam("high", type_=sa.BigInteger))
    return (
        sa.select(minute, t.to_state, sa.func.count())
        .where(*window, t.to_state.in_(_FINAL), t.at >= sa.bindparam("since", type_=UTCDateTime()))
        .group_by(minute, t.to_state)
    )


@functools.cache
def _finished_range(dialect: str) -> sa.Select[Any]:
    """:func:`_finished_transitions` of the range (``:low``, ``:high``] a fold folds (and a refill fills)."""
    return _finished_transitions(dialect, high=True)


@functools.cache
def _finished_by_minute(dialect: str) -> sa.CompoundSelect[Any]:
    """(minute, state, n) of the kept minutes from ``:since`` on, of the deltas of deleted messages and of the
    transitions after ``:low`` (the mark): built once per dialect, like :func:`_route_counts`."""
    f = message_finished_minute_table.c
    d = message_finished_delta_table.c
    since = sa.bindparam("since", type_=UTCDateTime())
    # SQLite: the stored minute as the same text as the others (the column's own format is read as a DATETIME)
    kept = f.minute if dialect == "postgresql" else _minute(f.minute, dialect)
    minute = _minute(d.at, dialect)
    deltas = sa.select(minute, d.state, sa.func.sum(d.n)).where(d.at >= since).group_by(minute, d.state)
    return sa.union_all(
        sa.select(kept, f.state, f.n).where(f.minute >= since), deltas, _finished_transitions(dialect, high=False)
    )


def finished_by_minute_statement(mark: int, since: datetime, dialect: str = "postgresql") -> sa.CompoundSelect[Any]:
    """(minute, state, n) of the kept minutes from ``since`` on, of the deltas of deleted messages and of the
    transitions after ``mark``: what :meth:`StoredCounts.finished_by_minute` reads (for ``EXPLAIN``)."""
    return _finished_by_minute(dialect).params(low=mark, since=_utc_minute(since))


def _by_minute(rows: Any) -> dict[tuple[datetime, MessageState], int]:
    """(minute, state) -> transitions, summed from (minute, state, n) rows (zeros left out)."""
    counts: dict[tuple[datetime, MessageState], int] = defaultdict(int)
    for minute, state, n in rows:
        counts[_as_minute(minute), MessageState(state)] += int(n)
    return {key: n for key, n in sorted(counts.items()) if n}


def _utc_minute(since: datetime) -> datetime:
    """``since`` truncated to its UTC minute; a naive datetime is refused with the error the store's bind processor
    gives (:class:`UTCDateTime`): it would otherwise be taken as local time here, before any bind."""
    if since.tzinfo is None:
        error = ValueError(f"naive datetime {since!r}: the store only takes timezone-aware timestamps")
        raise _bad_parameter("finished_by_minute", error)
    return since.astimezone(UTC).replace(second=0, microsecond=0)


class StoredCounts(StorePart):
    """The ``message_count`` table of ``database`` and the transitions after its mark (see the module docstring)."""

    def by_state(self) -> tuple[dict[MessageState, int], int]:
        """Messages per state (states without any left out), exact in one snapshot; and how many transition and
        delta rows the read added (what a :meth:`fold` would save the next reads)."""
        counts: dict[MessageState, int] = defaultdict(int)
        tail = 0
        with self.snapshot() as conn:
            for to_state, from_state, n, rows in conn.execute(state_counts_statement(self.read_mark(conn))):
                counts[MessageState(to_state)] += int(n)
                if from_state is not None:
                    counts[MessageState(from_state)] -= int(n)
                tail += int(rows)
        return {s: n for s, n in counts.items() if n}, tail

    def by_route(
        self, connection: sa.Connection | None = None, *, mark: int | None = None
    ) -> dict[tuple[str, str], dict[MessageState, int]]:
        """(service, operation) -> state -> messages, exact in one snapshot (the transitions after the mark are
        joined to their messages for the route): ``connection``'s transaction when given (from :meth:`snapshot`,
        so that the caller's other reads see the same one), else a transaction of its own. ``mark``: the mark
        :meth:`read_mark` already read in ``connection``'s snapshot (one round trip fewer for a caller reading
        several of these figures); without ``connection`` the own snapshot reads its own."""
        if connection is None:
            with self.snapshot() as conn:
                return self.by_route(conn)
        statement = _route_counts(self.database.dialect)
        low = self.read_mark(connection) if mark is None else mark
        counted = _routes(connection.execute(statement, {"mark": low}))
        routes: dict[tuple[str, str], dict[MessageState, int]] = {}
        for (service, operation, state), n in sorted(counted.items()):
            if n:
                routes.setdefault((service, operation), {})[state] = n
        return routes

    def finished_by_minute(
        self, connection: sa.Connection | None, since: datetime, *, mark: int | None = None
    ) -> dict[tuple[datetime, MessageState], int]:
        """(minute, final state) -> transitions into that state in that minute (UTC, aware), for the minutes from
        ``since`` (truncated to its minute) on, exact in one snapshot: the kept minutes of ``message_finished_minute``
        plus the deltas of deleted messages plus the transitions after the mark (a primary-key range), so every
        transition into a final state still in ``message_transition`` counts once, folded or not. Minutes older than
        :data:`FINISHED_KEPT` are not kept: ask for the last hour or so. ``connection`` and ``mark`` as for
        :meth:`by_route`.
        A naive ``since`` raises the store's error for naive datetimes (``sqlalchemy.exc.StatementError``)."""
        minute = _utc_minute(since)
        if connection is None:
            with self.snapshot() as conn:
                return self.finished_by_minute(conn, minute)
        statement = _finished_by_minute(self.database.dialect)
        low = self.read_mark(connection) if mark is None else mark
        return _by_minute(connection.execute(statement, {"low": low, "since": minute}))

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
    def read_mark(conn: sa.Connection) -> int:
        """The id of the last transition in the stored counts, as ``conn``'s snapshot sees it (0 before any fold)."""
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
            else:  # the pending mark is not final yet: the next fold tries again
                self._fold_finished(conn, low, None)
                return self._add(conn, deltas)
            transitions: list[Any] = []
            if target is not None and target > low:
                transitions = list(conn.execute(_transitions(low, target, True, postgres)).all())
                self._fold_finished(conn, low, target)
                low = target
            else:
                self._fold_finished(conn, low, None)
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
        c = message_count_table.c
        _add_counted(conn, message_count_table, [c.service, c.operation, c.state], changed)
        return sum(abs(int(row[-1])) for row in rows)

    def _fold_finished(self, conn: sa.Connection, low: int, high: int | None) -> None:
        """In the fold's transaction: add the transitions into a final state with an id in (``low``, ``high``]
        (none when ``high`` is None: the mark stays) and the finished deltas of deleted messages to
        ``message_finished_minute``, then delete the minutes older than :data:`FINISHED_KEPT` (after adding: a
        delta may fall in one). Transitions older than that are not added: their minute would go at once."""
        dialect = self.database.dialect
        cutoff = _database_now(conn) - FINISHED_KEPT
        rows = _take_finished_deltas(conn, dialect)
        if high is not None:
            rows += conn.execute(_finished_range(dialect), {"low": low, "high": high, "since": cutoff}).all()
        _add_minutes(conn, rows)
        f = message_finished_minute_table.c
        conn.execute(sa.delete(message_finished_minute_table).where(f.minute < cutoff))

    def recount(self) -> None:
        """Count the ``message`` table again (and set the mark to the highest transition) and fill the finished
        minutes again up to that mark: after writes that did not go through the store (see the module docstring).
        Blocks writers meanwhile on PostgreSQL."""
        with self.database.begin() as conn:
            recount(conn)
            refill_finished(conn)


def _database_now(connection: sa.Connection) -> datetime:
    """Now by the database's clock on PostgreSQL (the nodes sharing a store agree on it: a node whose clock ran
    hours ahead would otherwise prune every node's kept minutes, and skip adding the ones it folds), by this
    process's on SQLite (one process's file)."""
    if connection.dialect.name != "postgresql":
        return datetime.now(UTC)
    moment: datetime = connection.execute(sa.select(sa.func.now())).scalar_one()
    return moment.astimezone(UTC)


def _take_finished_deltas(conn: sa.Connection, dialect: str) -> list[Any]:
    """Delete the finished deltas visible now and return them as (minute, state, n) rows (grouped in the statement
    on PostgreSQL, like :meth:`StoredCounts._take_deltas`; SQLite has no DELETE in a WITH: by minute here)."""
    d = message_finished_delta_table.c
    taken = sa.delete(message_finished_delta_table).returning(d.at, d.state, d.n)
    if dialect != "postgresql":
        return [(at.replace(second=0, microsecond=0), state, n) for at, state, n in conn.execute(taken)]
    gone = taken.cte("gone")
    minute = _minute(gone.c.at, dialect)
    return list(
        conn.execute(sa.select(minute, gone.c.state, sa.func.sum(gone.c.n)).group_by(minute, gone.c.state)).all()
    )


def _add_minutes(conn: sa.Connection, rows: list[Any]) -> None:
    """Add (minute, state, n) rows to ``message_finished_minute`` (upserts adding ``n``; rows left at zero go).
    The minutes are aware datetimes by then, written by the column's own type (SQLite: its text format)."""
    changed = [{"minute": minute, "state": state, "n": n} for (minute, state), n in _by_minute(rows).items()]
    f = message_finished_minute_table.c
    _add_counted(conn, message_finished_minute_table, [f.minute, f.state], changed)


def _add_counted(conn: sa.Connection, table: sa.Table, keys: list[Any], changed: list[dict[str, Any]]) -> None:
    """Add the ``n`` of each row of ``changed`` to ``table``'s row of the same ``keys`` (inserted when missing), then
    delete the rows left at zero: how ``message_count`` and ``message_finished_minute`` take what a fold folds."""
    if not changed:
        return
    insert = upsert(table, conn.dialect.name)
    conn.execute(insert.on_conflict_do_update(index_elements=keys, set_={"n": table.c.n + insert.excluded.n}), changed)
    conn.execute(sa.delete(table).where(table.c.n == 0))


def refill_finished(connection: sa.Connection, now: datetime | None = None) -> None:
    """Fill ``message_finished_minute`` again, in ``connection``'s transaction: the transitions into a final state up
    to the mark (none without a mark row) with an ``at`` within :data:`FINISHED_KEPT` before ``now``, grouped by
    minute; the finished deltas are dropped (the deleted transitions are not there to count). Migration 0017's
    backfill and :meth:`StoredCounts.recount` (after :func:`recount` moved the mark)."""
    dialect = connection.dialect.name
    connection.execute(sa.delete(message_finished_minute_table))
    connection.execute(sa.delete(message_finished_delta_table))
    mark = connection.execute(_MARK).scalar_one_or_none()
    if mark is None:
        return
    cutoff = (now or _database_now(connection)) - FINISHED_KEPT
    rows = connection.execute(_finished_range(dialect), {"low": 0, "high": int(mark), "since": cutoff}).all()
    _add_minutes(connection, list(rows))


def recount(connection: sa.Connection) -> None:
    """Fill ``message_count`` from a ``GROUP BY`` of ``message`` and set the mark to the highest transition id, in
    ``connection``'s transaction (the finished minutes are :func:`refill_finished`'s: migration 0014 runs this
    before they exist). On PostgreSQL it first takes a SHARE lock on ``message``: writers (who write
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
