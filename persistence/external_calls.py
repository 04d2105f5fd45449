"""The calls a message makes to external systems (``store.calls``): per message and call key, and per entity.

A call of a message is recorded STARTED, committed before it is made, then OK or FAILED; one still STARTED after its
attempt died is a call in doubt for an operator. An entity-scoped call (``ExtCallScope.ENTITY``) is shared by every
message of one entity type + object id: one message at a time holds it IN_PROGRESS.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from openroute.persistence._call_path import CallPath
from openroute.persistence.database import Database, StorePart
from openroute.persistence.models import ExternalCallStatus, entity_call_table, external_call_table

__all__ = ["CallEnd", "CallStart", "EntityCallStatus", "ExternalCall", "ExternalCallStore"]

#: the ``entity_call.status`` while a message's attempt holds the call; it ends ``ExternalCallStatus.OK`` or ``FAILED``
_IN_PROGRESS = "IN_PROGRESS"


class EntityCallStatus(enum.StrEnum):
    """What :meth:`ExternalCallStore.begin_entity` answers."""

    #: an earlier call succeeded: its recorded result is returned, the call is not made again
    DONE = "OK"
    #: another message is making the call now (or its claim is not stale yet)
    BUSY = "BUSY"
    #: this message took the call: make it and record the outcome
    RUN = "RUN"
    #: an earlier attempt took the call and recorded no outcome, and the caller holds calls in doubt
    IN_DOUBT = "IN_DOUBT"


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
    #: how often the system's circuit breaker refused the call (not made, not in ``attempts``)
    refused: int = 0


_CALL_COLUMNS = tuple(
    external_call_table.c[name] for name in (
        "message_id", "call_key", "status", "attempts", "refused", "result", "last_error", "idempotency_key",
        "node_id", "started_at",
    )
)


@dataclass(frozen=True)
class CallStart:
    """A call of a message about to be made (:meth:`ExternalCallStore.begin_many`; the arguments of ``begin``)."""

    message_id: int
    call_key: str
    idempotency_key: str
    node_id: str
    at: datetime
    hold_in_doubt: bool = False


@dataclass(frozen=True)
class CallEnd:
    """The outcome of a call started with ``begin`` (:meth:`ExternalCallStore.finish_many`; those of ``finish``)."""

    message_id: int
    call_key: str
    ok: bool
    at: datetime
    result: Any = None
    error: str | None = None


def _first_row(start: CallStart) -> dict[str, Any]:
    """The ``external_call`` row of a call started for the first time."""
    return {"message_id": start.message_id, "call_key": start.call_key, "status": ExternalCallStatus.STARTED,
            "attempts": 1, "idempotency_key": start.idempotency_key, "node_id": start.node_id,
            "started_at": start.at, "created_at": start.at, "updated_at": start.at}


class ExternalCallStore(StorePart):
    """The ``external_call`` and ``entity_call`` tables of ``database``.

    A node's group commit records the calls of many messages at once (:meth:`begin_many`, :meth:`finish_many`): a
    group's first starts are one INSERT and its ends one UPDATE run for every row, as SQL text on the driver's cursor
    (:mod:`._call_path`), where a call recorded through SQLAlchemy Core costs the building of its statement's
    parameters and execution context each time.
    """

    def __init__(self, database: Database) -> None:
        super().__init__(database)
        self._path = CallPath(database.engine.dialect)

    def begin_many(self, connection: sa.Connection,
                   starts: Sequence[CallStart]) -> list[tuple[ExternalCall | None, bool]]:
        """:meth:`begin` for each of ``starts`` in ``connection``'s transaction: the calls recorded for the first time
        in one INSERT, each call recorded before (a retry, a call in doubt, one done) read and decided on alone."""
        inserted = self._path.start(
            connection, [(s.message_id, s.call_key, s.idempotency_key, s.node_id, s.at) for s in starts])
        return [(None, True) if (s.message_id, s.call_key) in inserted else self._start_again(connection, s)
                for s in starts]

    @staticmethod
    def _start_again(connection: sa.Connection, start: CallStart) -> tuple[ExternalCall | None, bool]:
        """:meth:`begin` of a call whose row the first INSERT met: done (OK) or held in doubt, it is not started;
        else STARTED again, attempts + 1."""
        c = external_call_table.c
        where = sa.and_(c.message_id == start.message_id, c.call_key == start.call_key)
        row = connection.execute(sa.select(*_CALL_COLUMNS).where(where)).first()
        previous = None if row is None else ExternalCall(**row._mapping)
        if previous is not None and (
            previous.status is ExternalCallStatus.OK
            or (start.hold_in_doubt and previous.status is ExternalCallStatus.STARTED)
        ):
            return previous, False
        if previous is None:  # deleted since the insert met it (retention): the call starts afresh
            connection.execute(sa.insert(external_call_table).values(**_first_row(start)))
        else:
            connection.execute(sa.update(external_call_table).where(where).values(
                status=ExternalCallStatus.STARTED, attempts=c.attempts + 1, idempotency_key=start.idempotency_key,
                node_id=start.node_id, started_at=start.at, updated_at=start.at,
            ))
        return previous, True

    def finish_many(self, connection: sa.Connection, ends: Sequence[CallEnd]) -> list[None]:
        """:meth:`finish` for each of ``ends`` in ``connection``'s transaction, one UPDATE run for every row (a call no
        longer STARTED is left as it is)."""
        ok, failed = ExternalCallStatus.OK, ExternalCallStatus.FAILED
        self._path.finish(connection, [(e.message_id, e.call_key, ok if e.ok else failed, e.result, e.error, e.at)
                                       for e in ends])
        return [None] * len(ends)

    def get(
        self, message_id: int, call_key: str, connection: sa.Connection | None = None
    ) -> ExternalCall | None:
        """The stored call ``call_key`` of ``message_id``, or None if it was never recorded."""
        c = external_call_table.c
        query = sa.select(*_CALL_COLUMNS).where(c.message_id == message_id, c.call_key == call_key)
        row = self.database.run(lambda conn: conn.execute(query).first(), connection)
        return None if row is None else ExternalCall(**row._mapping)

    def begin(
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
        :meth:`finish`.
        """
        start = CallStart(message_id, call_key, idempotency_key, node_id, now, hold_in_doubt)
        return self.database.run(lambda conn: self.begin_many(conn, [start])[0], connection)

    def finish(
        self,
        message_id: int,
        call_key: str,
        ok: bool,
        now: datetime,
        result: Any = None,
        error: str | None = None,
        connection: sa.Connection | None = None,
    ) -> bool:
        """Record the outcome of a call started with :meth:`begin`; False if it was not STARTED."""
        c = external_call_table.c
        held = (c.message_id == message_id, c.call_key == call_key, c.status == ExternalCallStatus.STARTED)
        return self._settle(external_call_table, held, ok, now, result, error, connection) == 1

    def refused(
        self, message_id: int, call_key: str, now: datetime, error: str, connection: sa.Connection | None = None
    ) -> bool:
        """Record that the circuit breaker refused the call started with :meth:`begin`: it was not made, so it
        leaves ``attempts`` (- 1) for ``refused`` (+ 1) and ends FAILED with ``error`` (made at the next attempt).
        False if it was not STARTED."""
        c = external_call_table.c
        held = (c.message_id == message_id, c.call_key == call_key, c.status == ExternalCallStatus.STARTED)
        return self._refuse(external_call_table, held, now, error, connection) == 1

    def in_doubt(self, message_id: int, connection: sa.Connection | None = None) -> list[ExternalCall]:
        """The calls of ``message_id`` started and never finished (status STARTED), by call key."""
        c = external_call_table.c
        query = (
            sa.select(*_CALL_COLUMNS)
            .where(c.message_id == message_id, c.status == ExternalCallStatus.STARTED)
            .order_by(c.call_key)
        )
        rows = self.database.run(lambda conn: conn.execute(query).all(), connection)
        return [ExternalCall(**r._mapping) for r in rows]

    def resolve_in_doubt(
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
        entity_conditions = [e.owner_message_id == message_id, e.status == _IN_PROGRESS]
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

        return self.database.run(work, connection)

    def record(
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
        statement = self.database.upsert(external_call_table).values(
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
        self.database.run(lambda conn: conn.execute(statement), connection)

    # -- entity-scoped calls ----------------------------------------------------------------
    def begin_entity(
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
    ) -> tuple[EntityCallStatus, Any]:
        """Try to take the call ``call_key`` of one entity for ``message_id``.

        Returns ``(DONE, result)`` when an earlier call succeeded (do not call again), ``(BUSY, None)`` when
        another message's attempt is making the call now (IN_PROGRESS since after ``stale_before``), and
        ``(RUN, None)`` when the caller now holds the call and must report with :meth:`finish_entity`.
        An IN_PROGRESS record of a dead attempt (this message's, or another's gone stale) is a call in doubt: with
        ``hold_in_doubt`` the caller takes it over still IN_PROGRESS (an operator resolves it through this
        message) and gets ``(IN_DOUBT, None)``.
        """
        c = entity_call_table.c
        where = sa.and_(c.entity_type == entity_type, c.object_id == object_id, c.call_key == call_key)

        def work(conn: sa.Connection) -> tuple[EntityCallStatus, Any]:
            query = sa.select(c.id, c.status, c.result, c.owner_message_id, c.updated_at).where(where)
            row = conn.execute(self.database.locked(query)).first()
            if row is None:
                # RETURNING, not rowcount: psycopg reports no reliable rowcount for ON CONFLICT DO NOTHING
                inserted = conn.execute(
                    self.database.upsert(entity_call_table)
                    .values(entity_type=entity_type, object_id=object_id, call_key=call_key, status=_IN_PROGRESS,
                            owner_message_id=message_id, attempts=1, created_at=now, updated_at=now)
                    .on_conflict_do_nothing(index_elements=["entity_type", "object_id", "call_key"])
                    .returning(c.id)
                ).scalar()
                return (EntityCallStatus.RUN if inserted is not None else EntityCallStatus.BUSY), None
            if row.status == ExternalCallStatus.OK:
                return EntityCallStatus.DONE, row.result
            if row.status == _IN_PROGRESS and row.owner_message_id != message_id and row.updated_at > stale_before:
                return EntityCallStatus.BUSY, None
            doubt = hold_in_doubt and row.status == _IN_PROGRESS
            taken = conn.execute(
                sa.update(entity_call_table)
                .where(c.id == row.id, c.status == row.status, c.updated_at == row.updated_at)
                .values(status=_IN_PROGRESS, owner_message_id=message_id,
                        attempts=c.attempts if doubt else c.attempts + 1, updated_at=now)
            ).rowcount
            if taken != 1:
                return EntityCallStatus.BUSY, None
            return (EntityCallStatus.IN_DOUBT if doubt else EntityCallStatus.RUN), None

        return self.database.run(work, connection)

    def finish_entity(
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
        """Record the outcome of a call taken with :meth:`begin_entity` (only by its holder)."""
        c = entity_call_table.c
        held = (c.entity_type == entity_type, c.object_id == object_id, c.call_key == call_key,
                c.owner_message_id == message_id, c.status == _IN_PROGRESS)
        self._settle(entity_call_table, held, ok, now, result, error, connection)

    def refused_entity(
        self, entity_type: str, object_id: str, call_key: str, message_id: int, now: datetime, error: str,
        connection: sa.Connection | None = None,
    ) -> None:
        """:meth:`refused` for a call taken with :meth:`begin_entity` (only by its holder)."""
        c = entity_call_table.c
        held = (c.entity_type == entity_type, c.object_id == object_id, c.call_key == call_key,
                c.owner_message_id == message_id, c.status == _IN_PROGRESS)
        self._refuse(entity_call_table, held, now, error, connection)

    def _refuse(self, table: sa.Table, held: tuple[sa.ColumnElement[bool], ...], now: datetime, error: str,
                connection: sa.Connection | None) -> int:
        """The call row ``held`` selects was not made: a refusal instead of an attempt; the rows changed."""
        statement = sa.update(table).where(*held).values(
            status=ExternalCallStatus.FAILED, attempts=table.c.attempts - 1, refused=table.c.refused + 1,
            last_error=error, updated_at=now,
        )
        return int(self.database.run(lambda conn: conn.execute(statement).rowcount, connection))

    def _settle(
        self, table: sa.Table, held: tuple[sa.ColumnElement[bool], ...], ok: bool, now: datetime, result: Any,
        error: str | None, connection: sa.Connection | None,
    ) -> int:
        """Record the outcome (OK or FAILED, result, error) of the call row ``held`` selects; the rows changed."""
        statement = sa.update(table).where(*held).values(
            status=ExternalCallStatus.OK if ok else ExternalCallStatus.FAILED, result=result, last_error=error,
            updated_at=now,
        )
        return int(self.database.run(lambda conn: conn.execute(statement).rowcount, connection))

    def of_entity(
        self, entity_type: str, object_id: str, connection: sa.Connection | None = None
    ) -> list[dict[str, Any]]:
        """The entity-scoped calls recorded for one entity (status, attempts, refused, result, owner)."""
        c = entity_call_table.c
        query = (
            sa.select(c.call_key, c.status, c.attempts, c.refused, c.result, c.last_error, c.owner_message_id)
            .where(c.entity_type == entity_type, c.object_id == object_id)
            .order_by(c.id)
        )
        return [dict(r._mapping) for r in self.database.run(lambda conn: conn.execute(query).all(), connection)]
