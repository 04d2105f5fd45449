"""The message store: one SQLAlchemy engine over a SQLite file (default) or PostgreSQL.

Every method that changes a row takes an optional ``connection``: without one it runs in its own
transaction, with one it joins the caller's transaction, which lets the engine group several
writes into one commit. The store writes the ``state`` column only in :meth:`MessageStore.insert_message`
(always ``NEW``), :meth:`MessageStore.apply_transition` and :meth:`MessageStore.claim`; whether a
transition is legal is decided by ``openroute.states`` before these are called. Each of them also writes
the change's ``message_transition`` row in the same transaction (one executemany INSERT per batch).

Every write of a message row adds one to its ``version``, so a snapshot's (id, version) pins the state it was
read in: the hot-path statements (claim, outcome UPDATE) are keyed by primary key and version only. A state
predicate would add nothing to their safety, but it lets PostgreSQL plan them on a state index once the table
has statistics (a scan of the whole backlog per statement instead of one primary-key probe).
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar, cast

import sqlalchemy as sa
from openroute.persistence._hot_path import HotPath, TransitionRow
from openroute.persistence.models import (
    FINAL_STATES,
    ExternalCallStatus,
    MessageState,
    NodeState,
    entity_call_table,
    external_call_table,
    funnel_lock_table,
    message_table,
    message_transition_table,
    node_table,
)
from openroute.persistence.outage import StoreOutage
from sqlalchemy.dialects import postgresql, sqlite

DEFAULT_DATABASE_URL = "sqlite:///openroute.db"
MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"

T = TypeVar("T")

# The columns a transition may change besides state and version; everything else is written once.
TRANSITION_COLUMNS = frozenset(
    {
        "failed_count",
        "next_attempt_at",
        "custom_data",
        "business_errors",
        "last_error_code",
        "last_error_text",
        "last_error_trace",
        "node_id",
        "start_process_ts",
    }
)


class GroupConflict(Exception):
    """A grouped write could not tell which of its items lost: roll back and write them one by one."""


@dataclass(frozen=True)
class MessageFields:
    """What every message has from the moment it arrives: its route key, its payload and the sender's trace.

    ``openroute.InboundMessage`` (what an endpoint accepts) and :class:`NewMessage` (what the store inserts)
    are both these fields plus their own (the optional ones keep each class's positional order).
    """

    service: str
    operation: str
    payload: str
    content_type: str
    correlation_id: str
    source_system: str


@dataclass(frozen=True)
class NewMessage(MessageFields):
    """What :meth:`MessageStore.insert_message` stores as a NEW message."""

    receive_ts: datetime
    process_id: str | None = None
    msg_ts: datetime | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    object_id: str | None = None
    entity_type: str | None = None
    funnel_value: str | None = None
    parent_id: int | None = None
    #: the W3C traceparent its later spans hang under (``openroute.tracing``; None while tracing is off)
    traceparent: str | None = None

    @classmethod
    def from_values(cls, values: Mapping[str, Any]) -> NewMessage:
        """The message of ``values`` (every field, already checked) without __init__'s cost: a frozen dataclass sets
        each of its 15 fields through ``object.__setattr__``, and every accepted message is built once."""
        message = object.__new__(cls)
        message.__dict__.update(values)
        return message


@dataclass(frozen=True)
class StoredMessage:
    """An immutable snapshot of one ``message`` row (as of ``version``)."""

    id: int
    correlation_id: str
    source_system: str
    process_id: str | None
    service: str
    operation: str
    object_id: str | None
    entity_type: str | None
    funnel_value: str | None
    payload: str
    content_type: str
    headers: dict[str, str]
    state: MessageState
    failed_count: int
    receive_ts: datetime
    msg_ts: datetime | None
    start_process_ts: datetime | None
    last_update_ts: datetime
    next_attempt_at: datetime | None
    node_id: str | None
    custom_data: dict[str, Any]
    business_errors: list[dict[str, Any]]
    last_error_code: str | None
    last_error_text: str | None
    parent_id: int | None
    version: int
    #: the traceback of the unexpected error of the current state (None for expected errors and no error)
    last_error_trace: str | None = None
    #: the W3C traceparent of the span that accepted it: the parent of its attempts and confirmation (None: untraced)
    traceparent: str | None = None

    @classmethod
    def from_values(cls, message_id: int, values: Mapping[str, Any]) -> StoredMessage:
        """The snapshot of a row just inserted with ``values`` (every column but id), without __init__'s cost."""
        snapshot = object.__new__(cls)
        snapshot.__dict__["id"] = message_id
        snapshot.__dict__.update(values)
        return snapshot

    def evolve(self, **changes: Any) -> StoredMessage:
        """A copy with ``changes`` applied (used to follow a write without re-reading the row)."""
        if not _STORED_FIELDS.issuperset(changes):
            raise TypeError(f"StoredMessage has no field(s) {sorted(changes.keys() - _STORED_FIELDS)}")
        # a frozen dataclass: copying its __dict__ costs a fraction of __init__ with 28 fields (the writer's hot path)
        copy = object.__new__(StoredMessage)
        values = copy.__dict__
        values.update(self.__dict__)
        values.update(changes)
        return copy


_STORED_FIELDS = frozenset(StoredMessage.__dataclass_fields__)


@dataclass(frozen=True)
class InsertOutcome:
    """Result of :meth:`MessageStore.insert_message`: the stored message, or the one it duplicates."""

    message: StoredMessage
    duplicate: bool


@dataclass(frozen=True)
class ExternalCall:
    """A stored external call of one message."""

    message_id: int
    call_key: str
    status: ExternalCallStatus
    attempts: int
    result: Any
    last_error: str | None
    #: the key handed to the remote (None for in-store calls and rows older than migration 0006)
    idempotency_key: str | None = None
    #: the node that last started the call, and when (the STARTED record)
    node_id: str | None = None
    started_at: datetime | None = None


_CALL_COLUMNS = tuple(
    external_call_table.c[name] for name in (
        "message_id", "call_key", "status", "attempts", "result", "last_error", "idempotency_key", "node_id",
        "started_at",
    )
)


def _insert_values(new: NewMessage) -> dict[str, Any]:
    values: dict[str, Any] = {
        "correlation_id": new.correlation_id,
        "source_system": new.source_system,
        "process_id": new.process_id,
        "service": new.service,
        "operation": new.operation,
        "object_id": new.object_id,
        "entity_type": new.entity_type,
        "funnel_value": new.funnel_value,
        "payload": new.payload,
        "content_type": new.content_type,
        "headers": dict(new.headers),
        "state": MessageState.NEW,
        "failed_count": 0,
        "receive_ts": new.receive_ts,
        "msg_ts": new.msg_ts,
        "start_process_ts": None,
        "last_update_ts": new.receive_ts,
        "next_attempt_at": None,
        "node_id": None,
        "custom_data": {},
        "business_errors": [],
        "last_error_code": None,
        "last_error_text": None,
        "parent_id": new.parent_id,
        "version": 0,
        "traceparent": new.traceparent,
    }
    return values


def _transition_row(
    message_id: int,
    from_state: MessageState | None,
    to_state: MessageState,
    at: datetime,
    node_id: str | None,
    error_code: str | None,
    cause: str,
    changes: Mapping[str, Any] | None = None,
) -> TransitionRow:
    """One ``message_transition`` row (its attempt is read from the message row when it is written).

    The attempt is ``failed_count + 1`` as written, except for a change out of PROCESSING that counts a failure
    (``changes`` sets the failed count): that one belongs to the attempt that failed, the new failed count. The row
    keeps the change's error text and traceback (from ``changes``) when it has an error code."""
    counted = changes is not None and from_state is MessageState.PROCESSING and "failed_count" in changes
    text = trace = None
    if error_code is not None and changes is not None:
        text, trace = changes.get("last_error_text"), changes.get("last_error_trace")
    return (message_id, from_state, to_state, at, node_id, error_code, cause, 0 if counted else 1, text, trace)


def row_to_message(row: sa.Row[Any]) -> StoredMessage:
    """The :class:`StoredMessage` of a row selected with every column of :data:`message_table`."""
    values = dict(row._mapping)
    values["headers"] = values["headers"] or {}
    values["custom_data"] = values["custom_data"] or {}
    values["business_errors"] = values["business_errors"] or []
    return StoredMessage(**values)


_row_to_message = row_to_message


def _configure_sqlite(engine: sa.Engine) -> None:
    """WAL, busy timeout and immediate write transactions for every SQLite connection.

    ``BEGIN IMMEDIATE`` takes the write lock at the start of a transaction: with pysqlite's deferred
    BEGIN a reader that later writes can fail with SQLITE_BUSY without honouring the busy timeout.
    """

    @sa.event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None  # we emit BEGIN ourselves (see below)
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA busy_timeout=30000")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.close()

    @sa.event.listens_for(engine, "begin")
    def _on_begin(connection: sa.Connection) -> None:
        connection.exec_driver_sql("BEGIN IMMEDIATE")


def create_store_engine(url: str, *, pool_size: int = 8, echo: bool = False) -> sa.Engine:
    """A SQLAlchemy engine configured the way the store needs it (SQLite pragmas, pool size)."""
    parsed = sa.engine.make_url(url)
    if parsed.get_backend_name() == "sqlite":
        if parsed.database in (None, "", ":memory:"):
            raise ValueError("the store needs a SQLite file (an in-memory database is private to one connection)")
        engine = sa.create_engine(url, echo=echo, pool_size=pool_size, max_overflow=pool_size)
        _configure_sqlite(engine)
        return engine
    if parsed.get_backend_name() == "postgresql":
        return sa.create_engine(url, echo=echo, pool_size=pool_size, max_overflow=pool_size, pool_pre_ping=True)
    raise ValueError(f"unsupported database {parsed.get_backend_name()!r}: use sqlite:/// or postgresql+psycopg://")


class MessageStore:
    """Messages, external calls and nodes in one relational database.

    ``url`` is a SQLAlchemy URL: ``sqlite:///path/file.db`` (the default ``sqlite:///openroute.db``) or
    ``postgresql+psycopg://user@host/db``. The same statements run on both.
    """

    def __init__(self, url: str | None = None, *, pool_size: int = 8, echo: bool = False) -> None:
        self.url = url or DEFAULT_DATABASE_URL
        self.engine = create_store_engine(self.url, pool_size=pool_size, echo=echo)
        self.dialect = self.engine.dialect.name
        self._insert = postgresql.insert if self.dialect == "postgresql" else sqlite.insert
        # the per-message statements (insert, claim, outcome, transition row) run as SQL text on the driver's cursor
        self._hot = HotPath(self.engine.dialect)
        self._checked_columns: set[tuple[str, ...]] = set()  # column sets a transition was allowed to write
        #: whether the database is known to be unreachable now (every user of this store reports to it)
        self.outage = StoreOutage()

    # -- schema ---------------------------------------------------------------------------------
    def upgrade(self, revision: str = "head") -> None:
        """Apply the Alembic migrations up to ``revision`` (what ``openroute db upgrade`` runs)."""
        from alembic import command

        with self.engine.begin() as connection:
            config = alembic_config(self.url)
            config.attributes["connection"] = connection
            command.upgrade(config, revision)

    def create_schema(self) -> None:
        """Create every table, through the migrations so the schema is always the migrated one."""
        self.upgrade("head")

    def current_revision(self) -> str | None:
        """The Alembic revision the database is at (None before the first upgrade)."""
        from alembic.runtime.migration import MigrationContext

        with self.engine.connect() as connection:
            return MigrationContext.configure(connection).get_current_revision()

    @staticmethod
    def head_revision() -> str:
        """The newest migration this version of openroute ships (what ``upgrade()`` brings a database to)."""
        from alembic.script import ScriptDirectory

        head = ScriptDirectory.from_config(alembic_config("sqlite://")).get_current_head()
        assert head is not None, "the migrations folder has no head revision"  # noqa: S101  a broken install, not input
        return head

    def dispose(self) -> None:
        """Close every pooled connection."""
        self.engine.dispose()

    # -- transactions ---------------------------------------------------------------------------
    @contextlib.contextmanager
    def begin(self) -> Iterator[sa.Connection]:
        """One transaction: committed when the block ends, rolled back on an exception."""
        with self.engine.begin() as connection:
            yield connection

    def run(self, work: Callable[[sa.Connection], T], connection: sa.Connection | None = None) -> T:
        """Run ``work`` in ``connection``'s transaction, or in a new one."""
        if connection is not None:
            return work(connection)
        with self.engine.begin() as own:
            return work(own)

    # -- messages -------------------------------------------------------------------------------
    def insert_message(
        self, new: NewMessage, connection: sa.Connection | None = None, *, node_id: str | None = None,
        cause: str = "engine",
    ) -> InsertOutcome:
        """Store ``new`` as NEW, or report the message with the same (source system, correlation id).

        Uses ``INSERT ... ON CONFLICT DO NOTHING`` so a duplicate is an answer, not a failed transaction.
        A stored message gets its first ``message_transition`` row (from None to NEW, by ``node_id``).
        """
        return self.insert_messages([new], connection, node_id=node_id, cause=cause)[0]

    def insert_messages(
        self, batch: Sequence[NewMessage], connection: sa.Connection | None = None, *, node_id: str | None = None,
        cause: str = "engine",
    ) -> list[InsertOutcome]:
        """:meth:`insert_message` for many messages with one multi-row INSERT; one outcome per item, in order."""
        if not batch:
            return []
        rows = [_insert_values(new) for new in batch]
        c = message_table.c

        def work(conn: sa.Connection) -> list[InsertOutcome]:
            ids = self._hot.insert_messages(conn, rows)
            self._record_transitions(conn, [
                _transition_row(new_id, None, MessageState.NEW, new.receive_ts, node_id, None, cause)
                for new, new_id in zip(batch, ids, strict=True) if new_id is not None
            ])
            outcomes: list[InsertOutcome] = []
            for new, values, new_id in zip(batch, rows, ids, strict=True):
                key = (new.source_system, new.correlation_id)
                if new_id is not None:
                    outcomes.append(InsertOutcome(StoredMessage.from_values(new_id, values), duplicate=False))
                    continue
                existing = conn.execute(
                    sa.select(message_table).where(c.source_system == key[0], c.correlation_id == key[1])
                ).one()
                outcomes.append(InsertOutcome(_row_to_message(existing), duplicate=True))
            return outcomes

        return self.run(work, connection)

    def get(self, message_id: int, connection: sa.Connection | None = None) -> StoredMessage | None:
        """The current row of ``message_id``, or None."""
        row = self.run(
            lambda conn: conn.execute(sa.select(message_table).where(message_table.c.id == message_id)).first(),
            connection,
        )
        return None if row is None else _row_to_message(row)

    def find(
        self, *conditions: sa.ColumnElement[bool], limit: int | None = None, connection: sa.Connection | None = None
    ) -> list[StoredMessage]:
        """Messages matching SQLAlchemy ``conditions`` on :data:`message_table` columns, by id."""
        query = sa.select(message_table).where(*conditions).order_by(message_table.c.id).limit(limit)
        return [_row_to_message(r) for r in self.run(lambda conn: conn.execute(query).all(), connection)]

    def count_by_state(self, connection: sa.Connection | None = None) -> dict[MessageState, int]:
        """How many messages are in each state (states with none are left out)."""
        query = sa.select(message_table.c.state, sa.func.count()).group_by(message_table.c.state)
        return {MessageState(s): n for s, n in self.run(lambda conn: conn.execute(query).all(), connection)}

    def apply_transition(
        self,
        message_id: int,
        version: int,
        from_state: MessageState,
        to_state: MessageState,
        now: datetime,
        changes: Mapping[str, Any] | None = None,
        connection: sa.Connection | None = None,
        *,
        node_id: str | None = None,
        cause: str = "engine",
    ) -> bool:
        """Write one state change if the row is still at ``version`` (read in ``from_state``).

        Returns False (and writes nothing) when another writer got there first. The row is matched by id and
        version only: every write bumps the version, so an unchanged version means an unchanged state. Legality
        is not checked here: call ``openroute.states.transition``, which checks it and raises the typed errors.
        The change's ``message_transition`` row (by ``node_id``, for ``cause``) is written with it.
        """
        return self.apply_transition_many(
            [(message_id, version, from_state, to_state, now, changes or {})], connection, node_id=node_id, cause=cause
        )[0]

    def apply_transition_many(
        self,
        batch: Sequence[tuple[int, int, MessageState, MessageState, datetime, Mapping[str, Any]]],
        connection: sa.Connection | None = None,
        *,
        node_id: str | None = None,
        cause: str | Sequence[str] = "engine",
    ) -> list[bool]:
        """:meth:`apply_transition` for many (id, version, from, to, now, changes) items, one flag per item.

        Items changing the same columns share one executemany UPDATE. If its total row count says some
        item lost, :class:`GroupConflict` is raised: the caller must roll back and retry the items one by
        one (a single item is always resolved exactly). The written items' ``message_transition`` rows
        follow in one executemany INSERT; ``cause`` is one for all items or one per item.
        """
        causes = [cause] * len(batch) if isinstance(cause, str) else list(cause)
        if len(causes) != len(batch):
            raise ValueError(f"{len(causes)} causes for {len(batch)} transitions")
        groups: dict[tuple[str, ...], list[int]] = {}
        for index, item in enumerate(batch):
            columns = tuple(sorted(item[5]))
            if columns not in self._checked_columns:
                unknown = set(columns) - TRANSITION_COLUMNS
                if unknown:
                    raise ValueError(f"a transition cannot write {sorted(unknown)}")
                self._checked_columns.add(columns)
            groups.setdefault(columns, []).append(index)

        def work(conn: sa.Connection) -> list[bool]:
            flags = [False] * len(batch)
            for columns, indexes in groups.items():
                items = [(batch[i][0], batch[i][1], batch[i][3], batch[i][4], [batch[i][5][name] for name in columns])
                         for i in indexes]
                if len(items) > 1 and conn.dialect.supports_sane_multi_rowcount:
                    if self._hot.apply_outcomes(conn, columns, items) != len(items):
                        raise GroupConflict(f"{len(items)} transitions in one statement, some lost")
                    for index in indexes:
                        flags[index] = True
                    continue
                for index, item in zip(indexes, items, strict=True):
                    flags[index] = self._hot.apply_outcomes(conn, columns, [item]) == 1
            self._record_transitions(conn, [
                _transition_row(item[0], item[2], item[3], item[4], node_id, item[5].get("last_error_code"), why,
                                item[5])
                for item, why, written in zip(batch, causes, flags, strict=True)
                if written
            ])
            return flags

        return self.run(work, connection)

    def apply_transitions(
        self,
        transitions: Sequence[tuple[int, int, MessageState, MessageState, Mapping[str, Any]]],
        now: datetime,
        connection: sa.Connection | None = None,
        *,
        node_id: str | None = None,
        cause: str = "engine",
    ) -> list[bool]:
        """:meth:`apply_transition` for many messages in one transaction; one flag per item."""

        def work(conn: sa.Connection) -> list[bool]:
            return [
                self.apply_transition(mid, version, old, new, now, changes, conn, node_id=node_id, cause=cause)
                for mid, version, old, new, changes in transitions
            ]

        return self.run(work, connection)

    def claim(
        self,
        candidates: Iterable[tuple[int, int]],
        from_states: Iterable[MessageState],
        to_state: MessageState,
        node_id: str,
        now: datetime,
        connection: sa.Connection | None = None,
        *,
        previous: Mapping[int, MessageState] | None = None,
        cause: str = "engine",
    ) -> set[int]:
        """Move the (id, version) ``candidates`` to ``to_state`` for ``node_id``.

        The caller read every candidate in one of ``from_states`` (``openroute.states.claim`` checks it); the
        rows are matched by id and version only, which pins that state. Returns the ids this call won. On
        PostgreSQL rows locked by a concurrent claim are skipped (``FOR UPDATE SKIP LOCKED``) instead of waited
        for; on SQLite the write lock serialises claims and the conditional UPDATE decides. Each won message
        gets its ``message_transition`` row in the same transaction, from its state in ``previous`` (the state
        at the candidate's version).
        """
        pairs = list(candidates)
        if not pairs:
            return set()
        before = previous or {}

        def recorded(won: set[int], conn: sa.Connection) -> set[int]:
            self._record_transitions(
                conn, [_transition_row(i, before.get(i), to_state, now, node_id, None, cause) for i in won]
            )
            return won

        return self.run(lambda conn: recorded(self._hot.claim(conn, pairs, to_state, node_id, now), conn), connection)

    def _record_transitions(self, conn: sa.Connection, rows: list[TransitionRow]) -> None:
        """Write ``message_transition`` rows (see :func:`_transition_row`) with one executemany INSERT."""
        self._hot.record_transitions(conn, rows)

    def transitions_of(self, message_id: int, connection: sa.Connection | None = None) -> list[dict[str, Any]]:
        """The recorded state changes of ``message_id``, oldest first (from_state None for the insert), each with
        its error code, error text and traceback (None when the change had none)."""
        t = message_transition_table.c
        query = (
            sa.select(t.from_state, t.to_state, t.at, t.node_id, t.attempt, t.error_code, t.cause, t.error_text,
                      t.error_trace)
            .where(t.message_id == message_id)
            .order_by(t.id)
        )
        return [dict(r._mapping) for r in self.run(lambda conn: conn.execute(query).all(), connection)]

    def due(
        self, states: Iterable[MessageState], now: datetime, limit: int, connection: sa.Connection | None = None
    ) -> list[StoredMessage]:
        """Messages in ``states`` whose next attempt is due at ``now``, oldest due first."""
        c = message_table.c
        query = (
            sa.select(message_table)
            .where(c.state.in_(list(states)), c.next_attempt_at <= now)
            .order_by(c.next_attempt_at)
            .limit(limit)
        )
        return [_row_to_message(r) for r in self.run(lambda conn: conn.execute(query).all(), connection)]

    def received_before(
        self, state: MessageState, cutoff: datetime, limit: int, connection: sa.Connection | None = None
    ) -> list[StoredMessage]:
        """Messages in ``state`` received at or before ``cutoff``, oldest first (NEW nobody queued)."""
        c = message_table.c
        query = (
            sa.select(message_table).where(c.state == state, c.receive_ts <= cutoff).order_by(c.receive_ts).limit(limit)
        )
        return [_row_to_message(r) for r in self.run(lambda conn: conn.execute(query).all(), connection)]

    def started_before(
        self,
        state: MessageState,
        cutoff: datetime,
        limit: int,
        node_id: str | None = None,
        connection: sa.Connection | None = None,
    ) -> list[StoredMessage]:
        """Messages in ``state`` started at or before ``cutoff`` (optionally of one node), oldest first."""
        c = message_table.c
        conditions = [c.state == state, c.start_process_ts <= cutoff]
        if node_id is not None:
            conditions.append(c.node_id == node_id)
        query = sa.select(message_table).where(*conditions).order_by(c.start_process_ts).limit(limit)
        return [_row_to_message(r) for r in self.run(lambda conn: conn.execute(query).all(), connection)]

    # -- external calls -------------------------------------------------------------------------
    def get_external_call(
        self, message_id: int, call_key: str, connection: sa.Connection | None = None
    ) -> ExternalCall | None:
        """The stored call ``call_key`` of ``message_id``, or None if it was never recorded."""
        c = external_call_table.c
        query = sa.select(*_CALL_COLUMNS).where(c.message_id == message_id, c.call_key == call_key)
        row = self.run(lambda conn: conn.execute(query).first(), connection)
        return None if row is None else ExternalCall(**row._mapping)

    def begin_external_call(
        self,
        message_id: int,
        call_key: str,
        idempotency_key: str,
        node_id: str,
        now: datetime,
        *,
        hold_in_doubt: bool = False,
        connection: sa.Connection | None = None,
    ) -> tuple[ExternalCall | None, bool]:
        """Record, committed before the call is made, that call ``call_key`` of ``message_id`` is starting.

        Returns ``(previous record or None, started)``. ``started`` is False, and nothing is written, when the call
        succeeded before (previous status OK: skip it) or when it is in doubt (previous status STARTED: an earlier
        attempt began it and recorded no outcome) and ``hold_in_doubt`` is set. Otherwise the row becomes STARTED
        with this node and time (attempts + 1 when it existed) and the caller makes the call, then reports it with
        :meth:`finish_external_call`.
        """
        c = external_call_table.c
        where = sa.and_(c.message_id == message_id, c.call_key == call_key)

        def work(conn: sa.Connection) -> tuple[ExternalCall | None, bool]:
            row = conn.execute(sa.select(*_CALL_COLUMNS).where(where)).first()
            previous = None if row is None else ExternalCall(**row._mapping)
            if previous is not None and (
                previous.status is ExternalCallStatus.OK
                or (hold_in_doubt and previous.status is ExternalCallStatus.STARTED)
            ):
                return previous, False
            if previous is None:
                conn.execute(sa.insert(external_call_table).values(
                    message_id=message_id, call_key=call_key, status=ExternalCallStatus.STARTED, attempts=1,
                    idempotency_key=idempotency_key, node_id=node_id, started_at=now, created_at=now, updated_at=now,
                ))
            else:
                conn.execute(sa.update(external_call_table).where(where).values(
                    status=ExternalCallStatus.STARTED, attempts=c.attempts + 1, idempotency_key=idempotency_key,
                    node_id=node_id, started_at=now, updated_at=now,
                ))
            return previous, True

        return self.run(work, connection)

    def finish_external_call(
        self,
        message_id: int,
        call_key: str,
        ok: bool,
        now: datetime,
        result: Any = None,
        error: str | None = None,
        connection: sa.Connection | None = None,
    ) -> bool:
        """Record the outcome of a call started with :meth:`begin_external_call`; False if it was not STARTED."""
        c = external_call_table.c
        statement = (
            sa.update(external_call_table)
            .where(c.message_id == message_id, c.call_key == call_key, c.status == ExternalCallStatus.STARTED)
            .values(status=ExternalCallStatus.OK if ok else ExternalCallStatus.FAILED, result=result,
                    last_error=error, updated_at=now)
        )
        return bool(self.run(lambda conn: conn.execute(statement).rowcount, connection) == 1)

    def calls_in_doubt(self, message_id: int, connection: sa.Connection | None = None) -> list[ExternalCall]:
        """The calls of ``message_id`` started and never finished (status STARTED), by call key."""
        c = external_call_table.c
        query = (
            sa.select(*_CALL_COLUMNS)
            .where(c.message_id == message_id, c.status == ExternalCallStatus.STARTED)
            .order_by(c.call_key)
        )
        return [ExternalCall(**r._mapping) for r in self.run(lambda conn: conn.execute(query).all(), connection)]

    def resolve_calls_in_doubt(
        self,
        message_id: int,
        done: bool,
        now: datetime,
        call_keys: Sequence[str] | None = None,
        note: str = "operator",
        connection: sa.Connection | None = None,
    ) -> list[str]:
        """An operator's answer to calls in doubt of ``message_id`` (all of them, or those of ``call_keys``).

        ``done``: the call is recorded OK (result None; a later attempt skips it). Otherwise it is recorded FAILED,
        so the next attempt makes it again with the same idempotency key. Entity-scoped calls this message holds
        IN_PROGRESS are resolved the same way. Returns the call keys resolved, sorted.
        """
        c = external_call_table.c
        e = entity_call_table.c
        status = ExternalCallStatus.OK if done else ExternalCallStatus.FAILED
        text = None if done else f"{note}: call again"
        conditions = [c.message_id == message_id, c.status == ExternalCallStatus.STARTED]
        entity_conditions = [e.owner_message_id == message_id, e.status == "IN_PROGRESS"]
        if call_keys is not None:
            conditions.append(c.call_key.in_(list(call_keys)))
            entity_conditions.append(e.call_key.in_(list(call_keys)))

        def work(conn: sa.Connection) -> list[str]:
            keys = conn.execute(
                sa.update(external_call_table).where(*conditions)
                .values(status=status, last_error=text, updated_at=now).returning(c.call_key)
            ).scalars().all()
            entity_keys = conn.execute(
                sa.update(entity_call_table).where(*entity_conditions)
                .values(status=status.value, last_error=text, updated_at=now).returning(e.call_key)
            ).scalars().all()
            return sorted({*keys, *entity_keys})

        return self.run(work, connection)

    def record_external_call(
        self,
        message_id: int,
        call_key: str,
        status: ExternalCallStatus,
        now: datetime,
        result: Any = None,
        error: str | None = None,
        connection: sa.Connection | None = None,
    ) -> None:
        """Insert the call record, or update it (attempts + 1) if an earlier attempt failed.

        A call already recorded OK is never overwritten (the update only touches FAILED rows), so a
        replay that got past the check cannot erase the evidence of the first success.
        """
        c = external_call_table.c
        statement = self._insert(external_call_table).values(
            message_id=message_id,
            call_key=call_key,
            status=status,
            attempts=1,
            result=result,
            last_error=error,
            created_at=now,
            updated_at=now,
        )
        statement = statement.on_conflict_do_update(
            index_elements=["message_id", "call_key"],
            set_={
                "status": statement.excluded.status,
                "attempts": c.attempts + 1,
                "result": statement.excluded.result,
                "last_error": statement.excluded.last_error,
                "updated_at": statement.excluded.updated_at,
            },
            where=c.status == ExternalCallStatus.FAILED,
        )
        self.run(lambda conn: conn.execute(statement), connection)

    # -- entity-scoped external calls ----------------------------------------------------------------
    def begin_entity_call(
        self,
        entity_type: str,
        object_id: str,
        call_key: str,
        message_id: int,
        now: datetime,
        stale_before: datetime,
        connection: sa.Connection | None = None,
        *,
        hold_in_doubt: bool = False,
    ) -> tuple[str, Any]:
        """Try to take the call ``call_key`` of one entity for ``message_id``.

        Returns ``("OK", result)`` when an earlier call succeeded (do not call again), ``("BUSY", None)`` when
        another message's attempt is making the call now (IN_PROGRESS since after ``stale_before``), and
        ``("RUN", None)`` when the caller now holds the call and must report with :meth:`finish_entity_call`.
        An IN_PROGRESS record of a dead attempt (this message's, or another's gone stale) is a call in doubt: with
        ``hold_in_doubt`` the caller takes it over still IN_PROGRESS (an operator resolves it through this
        message) and gets ``("IN_DOUBT", None)``.
        """
        c = entity_call_table.c
        where = sa.and_(c.entity_type == entity_type, c.object_id == object_id, c.call_key == call_key)

        def work(conn: sa.Connection) -> tuple[str, Any]:
            query = sa.select(c.id, c.status, c.result, c.owner_message_id, c.updated_at).where(where)
            if self.dialect == "postgresql":
                query = query.with_for_update()
            row = conn.execute(query).first()
            if row is None:
                # RETURNING, not rowcount: psycopg reports no reliable rowcount for ON CONFLICT DO NOTHING
                inserted = conn.execute(
                    self._insert(entity_call_table)
                    .values(entity_type=entity_type, object_id=object_id, call_key=call_key, status="IN_PROGRESS",
                            owner_message_id=message_id, attempts=1, created_at=now, updated_at=now)
                    .on_conflict_do_nothing(index_elements=["entity_type", "object_id", "call_key"])
                    .returning(c.id)
                ).scalar()
                return ("RUN", None) if inserted is not None else ("BUSY", None)
            if row.status == "OK":
                return ("OK", row.result)
            if row.status == "IN_PROGRESS" and row.owner_message_id != message_id and row.updated_at > stale_before:
                return ("BUSY", None)
            doubt = hold_in_doubt and row.status == "IN_PROGRESS"
            taken = conn.execute(
                sa.update(entity_call_table)
                .where(c.id == row.id, c.status == row.status, c.updated_at == row.updated_at)
                .values(status="IN_PROGRESS", owner_message_id=message_id,
                        attempts=c.attempts if doubt else c.attempts + 1, updated_at=now)
            ).rowcount
            if taken != 1:
                return ("BUSY", None)
            return ("IN_DOUBT", None) if doubt else ("RUN", None)

        return self.run(work, connection)

    def finish_entity_call(
        self,
        entity_type: str,
        object_id: str,
        call_key: str,
        message_id: int,
        ok: bool,
        now: datetime,
        result: Any = None,
        error: str | None = None,
        connection: sa.Connection | None = None,
    ) -> None:
        """Record the outcome of a call taken with :meth:`begin_entity_call` (only by its holder)."""
        c = entity_call_table.c
        statement = (
            sa.update(entity_call_table)
            .where(c.entity_type == entity_type, c.object_id == object_id, c.call_key == call_key,
                   c.owner_message_id == message_id, c.status == "IN_PROGRESS")
            .values(status="OK" if ok else "FAILED", result=result, last_error=error, updated_at=now)
        )
        self.run(lambda conn: conn.execute(statement), connection)

    def entity_calls(
        self, entity_type: str, object_id: str, connection: sa.Connection | None = None
    ) -> list[dict[str, Any]]:
        """The entity-scoped calls recorded for one entity (status, attempts, result, owner)."""
        c = entity_call_table.c
        query = (
            sa.select(c.call_key, c.status, c.attempts, c.result, c.last_error, c.owner_message_id)
            .where(c.entity_type == entity_type, c.object_id == object_id)
            .order_by(c.id)
        )
        return [dict(r._mapping) for r in self.run(lambda conn: conn.execute(query).all(), connection)]

    # -- processing patterns: obsolete, funnel, children ---------------------------------------------
    def newer_ok_exists(self, message: StoredMessage, connection: sa.Connection | None = None) -> bool:
        """Whether a message received after ``message`` for the same entity type + object id ended OK."""
        if message.object_id is None or message.entity_type is None:
            return False
        c = message_table.c
        query = sa.select(c.id).where(
            c.entity_type == message.entity_type,
            c.object_id == message.object_id,
            c.state == MessageState.OK,
            c.id != message.id,
            sa.or_(c.receive_ts > message.receive_ts, sa.and_(c.receive_ts == message.receive_ts, c.id > message.id)),
        ).limit(1)
        return self.run(lambda conn: conn.execute(query).first(), connection) is not None

    def older_unfinished_in_funnel(self, message: StoredMessage, connection: sa.Connection | None = None) -> int | None:
        """The id of an older (receive time, then id) message of the same funnel value that is not final."""
        if message.funnel_value is None:
            return None
        c = message_table.c
        query = sa.select(c.id).where(
            c.funnel_value == message.funnel_value,
            c.state.not_in(list(FINAL_STATES)),
            c.id != message.id,
            sa.or_(c.receive_ts < message.receive_ts, sa.and_(c.receive_ts == message.receive_ts, c.id < message.id)),
        ).order_by(c.receive_ts, c.id).limit(1)
        return self.run(lambda conn: conn.execute(query).scalar(), connection)

    def acquire_funnel(
        self, funnel_value: str, message_id: int, now: datetime, connection: sa.Connection | None = None
    ) -> int | None:
        """Make ``message_id`` the one message of ``funnel_value`` allowed to be PROCESSING.

        Returns None when it holds the funnel now, else the id of the PROCESSING message that holds it.
        The previous holder is replaced only when it is no longer PROCESSING. The funnel row is read under its
        row lock (PostgreSQL ``FOR UPDATE``; SQLite's write lock serialises anyway), so the holder's check and
        a concurrent takeover cannot interleave: of two concurrent takers exactly one wins, and a holder
        claimed again while another message takes its funnel over waits for that takeover and sees it.
        """
        f = funnel_lock_table.c
        m = message_table.c
        query = sa.select(f.message_id).where(f.funnel_value == funnel_value)
        if self.dialect == "postgresql":
            query = query.with_for_update()

        def work(conn: sa.Connection) -> int | None:
            holder = conn.execute(query).scalar()
            if holder is None:
                inserted = conn.execute(
                    self._insert(funnel_lock_table)
                    .values(funnel_value=funnel_value, message_id=message_id, acquired_at=now)
                    .on_conflict_do_nothing(index_elements=["funnel_value"])
                    .returning(f.funnel_value)
                ).scalar()
                if inserted is not None:
                    return None
                holder = conn.execute(query).scalar()
            if holder == message_id:
                return None
            state = conn.execute(sa.select(m.state).where(m.id == holder)).scalar()
            if state == MessageState.PROCESSING:
                return int(cast(int, holder))
            taken = conn.execute(
                sa.update(funnel_lock_table)
                .where(f.funnel_value == funnel_value, f.message_id == holder)
                .values(message_id=message_id, acquired_at=now)
            ).rowcount
            return None if taken == 1 else int(cast(int, holder))

        return self.run(work, connection)

    def children_of(self, parent_id: int, connection: sa.Connection | None = None) -> list[StoredMessage]:
        """The child messages of ``parent_id``, in the order they were split (by id)."""
        return self.find(message_table.c.parent_id == parent_id, connection=connection)

    def lock_message(self, message_id: int, connection: sa.Connection) -> StoredMessage | None:
        """Read ``message_id`` holding its row lock (PostgreSQL ``FOR UPDATE``) until ``connection`` commits."""
        query = sa.select(message_table).where(message_table.c.id == message_id)
        if self.dialect == "postgresql":
            query = query.with_for_update()
        row = connection.execute(query).first()
        return None if row is None else _row_to_message(row)

    # -- nodes ----------------------------------------------------------------------------------
    def register_node(self, node_id: str, now: datetime, connection: sa.Connection | None = None) -> None:
        """Record that ``node_id`` (re)started now on this host and process."""
        values = {"host": socket.gethostname(), "pid": os.getpid(), "started_at": now, "heartbeat_at": now}
        statement = self._insert(node_table).values(id=node_id, stopped_at=None, **values)
        statement = statement.on_conflict_do_update(index_elements=["id"], set_={**values, "stopped_at": None})
        self.run(lambda conn: conn.execute(statement), connection)

    def heartbeat(self, node_id: str, now: datetime, connection: sa.Connection | None = None) -> NodeState | None:
        """Refresh the heartbeat of ``node_id``; returns the state an operator gave it (None: no such node)."""
        statement = sa.update(node_table).where(node_table.c.id == node_id).values(heartbeat_at=now)

        def work(conn: sa.Connection) -> NodeState | None:
            conn.execute(statement)
            return self.node_state(node_id, conn)

        return self.run(work, connection)

    def node_state(self, node_id: str, connection: sa.Connection | None = None) -> NodeState | None:
        """The state of ``node_id`` (None: no such node)."""
        query = sa.select(node_table.c.state).where(node_table.c.id == node_id)
        state = self.run(lambda conn: conn.execute(query).scalar_one_or_none(), connection)
        return None if state is None else NodeState(state)

    def set_node_state(self, node_id: str, state: NodeState, connection: sa.Connection | None = None) -> bool:
        """Give ``node_id`` the ``state`` (an operator's decision, kept across restarts); False: no such node."""
        statement = sa.update(node_table).where(node_table.c.id == node_id).values(state=NodeState(state))
        return bool(self.run(lambda conn: conn.execute(statement).rowcount, connection))

    def nodes(self, connection: sa.Connection | None = None) -> list[dict[str, Any]]:
        """Every node ever registered (id, host, pid, started_at, heartbeat_at, stopped_at, state), by id."""
        query = sa.select(node_table).order_by(node_table.c.id)
        return self.run(lambda conn: [dict(row._mapping) for row in conn.execute(query)], connection)

    def node_stopped(self, node_id: str, now: datetime, connection: sa.Connection | None = None) -> None:
        """Record an orderly stop of ``node_id``."""
        statement = sa.update(node_table).where(node_table.c.id == node_id).values(heartbeat_at=now, stopped_at=now)
        self.run(lambda conn: conn.execute(statement), connection)


def alembic_config(url: str) -> Any:
    """An Alembic ``Config`` for the store's migrations at ``url`` (no ini file needed)."""
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return config
