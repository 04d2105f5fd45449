"""The ``confirmation`` table's SQL: one row per final message owed a confirmation, claimed under a lease by the node
that sends it (the service and its rules: ``openroute.confirmation``). :class:`ConfirmationRows` is this table as
one kind of the delivery family (:mod:`openroute.persistence.delivery`: claim, renew, settle, release).

Every function takes the caller's connection and runs in its transaction (the store's one transaction story, see
:mod:`openroute.persistence.database`): the confirmation service holds a SQLAlchemy engine and opens the
transactions, and the engine's final-state hook inserts a row in the very transaction that made its message final.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from openroute.persistence.database import upsert
from openroute.persistence.delivery import Claimed
from openroute.persistence.models import ConfirmationStatus, MessageState, confirmation_table, message_table

__all__ = [
    "ConfirmationClaim", "ConfirmationRows",
    "add_pending", "claim", "claim_of_messages", "counts", "due", "find", "get", "inserted_pending", "messages",
    "pending_row", "record", "record_sent", "release_claims", "renew", "reset_pending", "retry_failed",
    "without_confirmation",
]

_C = confirmation_table.c
_M = message_table.c
#: the columns of a due row the sender needs
_DUE_COLUMNS = (_C.id, _C.message_id, _C.outcome_state, _C.attempts, _C.next_attempt_at, _C.confirmation_id)


def pending_row(message_id: int, source_system: str, state: str, now: datetime) -> dict[str, Any]:
    """The values of a new PENDING row, due ``now``, with a fresh confirmation id."""
    return {
        "message_id": message_id, "source_system": source_system, "outcome_state": MessageState(state),
        "status": ConfirmationStatus.PENDING, "attempts": 0, "next_attempt_at": now, "created_at": now,
        "updated_at": now, "confirmation_id": str(uuid.uuid4()),
    }


# the INSERT of a PENDING row per dialect, built once: it runs in the engine's group commit for every final message,
# and building it with .values(**row) each time cost a quarter of the writer's time (a cache key and coercions)
_ADD_PENDING: dict[str, Any] = {}


def add_pending(connection: sa.Connection, rows: Sequence[dict[str, Any]]) -> int:
    """Insert ``rows`` (of :func:`pending_row`) but those whose message has a row already; returns how many."""
    return len(inserted_pending(connection, rows))


def inserted_pending(connection: sa.Connection, rows: Sequence[dict[str, Any]]) -> set[int]:
    """Insert ``rows`` (of :func:`pending_row`) in one statement but those whose message has a row already; the
    message ids of the rows inserted."""
    if not rows:
        return set()
    dialect = connection.dialect.name
    statement = _ADD_PENDING.get(dialect)
    if statement is None:
        insert = upsert(confirmation_table, dialect)
        statement = _ADD_PENDING[dialect] = insert.on_conflict_do_nothing(index_elements=["message_id"]).returning(
            _C.message_id)
    # RETURNING tells inserted from ignored rows (rowcount is -1 for these statements on some drivers); many rows go
    # as one multi-row INSERT (SQLAlchemy's insertmanyvalues)
    return set(connection.execute(statement, list(rows)).scalars().all())


def reset_pending(connection: sa.Connection, message_id: int, state: str, now: datetime) -> None:
    """Start the row of ``message_id`` over, PENDING with outcome ``state`` and a new confirmation id (a restarted
    message reached a new final state)."""
    connection.execute(
        sa.update(confirmation_table).where(_C.message_id == message_id).values(
            outcome_state=MessageState(state), status=ConfirmationStatus.PENDING, attempts=0, next_attempt_at=now,
            last_error=None, sent_at=None, updated_at=now, confirmation_id=str(uuid.uuid4()), claimed_by=None)
    )


def without_confirmation(
    connection: sa.Connection,
    states: Iterable[str],
    held_error_code: str,
    limit: int,
    updated_since: datetime | None = None,
    systems: Iterable[str] | None = None,
) -> list[sa.Row[Any]]:
    """(id, source_system, state) of top-level messages in ``states`` that have no row, but those held with
    ``held_error_code``; of ``systems`` only when given, updated at or after ``updated_since`` when given."""
    query: sa.Select[Any] = (
        sa.select(_M.id, _M.source_system, _M.state)
        .outerjoin(confirmation_table, _C.message_id == _M.id)
        .where(_C.id.is_(None), _M.parent_id.is_(None), _M.state.in_([MessageState(s) for s in sorted(states)]),
               sa.or_(_M.last_error_code.is_(None), _M.last_error_code != held_error_code))
        .order_by(_M.id)
        .limit(limit)
    )
    if updated_since is not None:
        query = query.where(_M.last_update_ts >= updated_since)
    if systems is not None:
        query = query.where(_M.source_system.in_(sorted(systems)))
    return list(connection.execute(query).all())


def due(connection: sa.Connection, now: datetime, after_id: int, limit: int,
        message_id: int | None = None) -> list[sa.Row[Any]]:
    """Up to ``limit`` PENDING rows due at ``now`` with id > ``after_id`` (or the one of ``message_id``), by id."""
    query: sa.Select[Any] = (
        sa.select(*_DUE_COLUMNS)
        .where(_C.status == ConfirmationStatus.PENDING, _C.next_attempt_at <= now, _C.id > after_id)
        .order_by(_C.id)
        .limit(limit)
    )
    if message_id is not None:
        query = query.where(_C.message_id == message_id)
    return list(connection.execute(query).all())


def claim(connection: sa.Connection, row: Any, now: datetime, lease_until: datetime, node_id: str) -> bool:
    """Claim the due ``row`` (read by :func:`due`) for ``node_id`` until ``lease_until``: attempts + 1; False when
    another node claimed it first."""
    return bool(connection.execute(
        sa.update(confirmation_table)
        .where(_C.id == row.id, _C.status == ConfirmationStatus.PENDING, _C.attempts == row.attempts,
               _C.next_attempt_at <= now)
        .values(attempts=row.attempts + 1, next_attempt_at=lease_until, updated_at=now, claimed_by=node_id)
    ).rowcount == 1)


def claim_of_messages(connection: sa.Connection, message_ids: Sequence[int], now: datetime, lease_until: datetime,
                      node_id: str) -> list[sa.Row[Any]]:
    """Claim the PENDING rows due at ``now`` of ``message_ids`` for ``node_id`` until ``lease_until`` in one
    statement (attempts + 1, as :func:`claim`); the rows claimed, with their new attempt count. A row another node
    claimed first is no longer due, so it is left out."""
    return list(connection.execute(
        sa.update(confirmation_table)
        .where(_C.message_id.in_(list(message_ids)), _C.status == ConfirmationStatus.PENDING,
               _C.next_attempt_at <= now)
        .values(attempts=_C.attempts + 1, next_attempt_at=lease_until, updated_at=now, claimed_by=node_id)
        .returning(*_DUE_COLUMNS)
    ).all())


def messages(connection: sa.Connection, ids: Iterable[int]) -> dict[int, sa.Row[Any]]:
    """The ``message`` rows of ``ids`` (those still in the store), by id."""
    return {m.id: m for m in connection.execute(sa.select(message_table).where(_M.id.in_(list(ids))))}


def record(connection: sa.Connection, row_id: int, attempt: int, **values: Any) -> bool:
    """Write ``values`` to the row claimed for ``attempt``; False when the claim is no longer this attempt's."""
    return bool(connection.execute(
        sa.update(confirmation_table)
        .where(_C.id == row_id, _C.status == ConfirmationStatus.PENDING, _C.attempts == attempt)
        .values(**values)
    ).rowcount == 1)


def record_sent(connection: sa.Connection, claims: Sequence[tuple[int, int]], now: datetime) -> set[int]:
    """Record the ``claims`` (row id, attempt) SENT at ``now`` in one statement (a group of confirmations ends
    together: one round trip, not one per row); the ids of the rows that were still their attempt's."""
    if not claims:
        return set()
    return set(connection.execute(
        sa.update(confirmation_table)
        # ``id IN`` finds the rows by the primary key; the pairs keep those whose claim is still this attempt's
        .where(_C.id.in_([row_id for row_id, _attempt in claims]), _C.status == ConfirmationStatus.PENDING,
               sa.tuple_(_C.id, _C.attempts).in_(list(claims)))
        .values(status=ConfirmationStatus.SENT, sent_at=now, next_attempt_at=None, updated_at=now)
        .returning(_C.id)
    ).scalars())


def renew(connection: sa.Connection, row_id: int, attempt: int, lease_until: datetime) -> bool:
    """Push the lease of the claim of ``attempt`` to ``lease_until``; False when the claim is no longer its own."""
    return record(connection, row_id, attempt, next_attempt_at=lease_until)


def release_claims(connection: sa.Connection, node_id: str, now: datetime, claimed_before: datetime) -> int:
    """Make the PENDING rows ``node_id`` claimed before ``claimed_before`` due ``now``; returns how many."""
    return int(connection.execute(
        sa.update(confirmation_table)
        .where(_C.status == ConfirmationStatus.PENDING, _C.claimed_by == node_id, _C.next_attempt_at > now,
               _C.updated_at < claimed_before)
        .values(next_attempt_at=now, claimed_by=None, updated_at=now)
    ).rowcount)


def get(connection: sa.Connection, message_id: int) -> sa.Row[Any] | None:
    """The row of ``message_id``, or None."""
    return connection.execute(sa.select(confirmation_table).where(_C.message_id == message_id)).first()


def find(connection: sa.Connection, status: ConfirmationStatus | None, limit: int, offset: int) -> list[sa.Row[Any]]:
    """Rows (of ``status`` when given), most recently updated first."""
    query = sa.select(confirmation_table).order_by(_C.updated_at.desc(), _C.id.desc()).limit(limit).offset(offset)
    if status is not None:
        query = query.where(_C.status == status)
    return list(connection.execute(query))


def counts(connection: sa.Connection) -> dict[str, int]:
    """The number of rows per status, every status present (zero included)."""
    rows = connection.execute(sa.select(_C.status, sa.func.count()).group_by(_C.status)).all()
    found = {ConfirmationStatus(status).value: count for status, count in rows}
    return {s.value: found.get(s.value, 0) for s in ConfirmationStatus}


def retry_failed(connection: sa.Connection, message_ids: Sequence[int], now: datetime) -> int:
    """Make the FAILED rows of ``message_ids`` PENDING again with fresh attempts, due ``now``; returns how many."""
    return int(connection.execute(
        sa.update(confirmation_table)
        .where(_C.message_id.in_(list(message_ids)), _C.status == ConfirmationStatus.FAILED)
        .values(status=ConfirmationStatus.PENDING, attempts=0, next_attempt_at=now, updated_at=now)
    ).rowcount)


@dataclass(frozen=True)
class ConfirmationClaim:
    """A due row (of :func:`due`) claimed by this node for its ``attempt``-th attempt."""

    row: sa.Row[Any]
    attempt: int


@dataclass(frozen=True)
class ConfirmationRows:
    """The ``confirmation`` table as a kind of the delivery family (``LeasedRows``): a claim bumps ``attempts`` and
    leases the row by pushing ``next_attempt_at`` (``claimed_by``: the node); a claim is this node's while
    ``attempts`` is its attempt; sent rows are kept as SENT. With ``message_id``: that message's row only."""

    message_id: int | None = None

    def claim_due(self, connection: sa.Connection, node_id: str, now: datetime, lease_until: datetime, limit: int,
                  after_id: int) -> Claimed[ConfirmationClaim]:
        """Claim the due rows one conditional update each: of two nodes racing for a row exactly one update
        matches."""
        rows = due(connection, now, after_id, limit, self.message_id)
        claims = [ConfirmationClaim(row, row.attempts + 1) for row in rows
                  if claim(connection, row, now, lease_until, node_id)]
        return Claimed(claims, len(rows), rows[-1].id if rows else after_id)

    def renew(self, connection: sa.Connection, claim: ConfirmationClaim, node_id: str, lease_until: datetime) -> bool:
        """Push the lease of ``claim``; False when its attempt is no longer the row's."""
        return renew(connection, claim.row.id, claim.attempt, lease_until)

    def sent(self, connection: sa.Connection, claims: Sequence[ConfirmationClaim], now: datetime) -> list[bool]:
        """SENT with ``sent_at``: never selected again (:func:`record_sent`: one statement for them all)."""
        held = record_sent(connection, [(c.row.id, c.attempt) for c in claims], now)
        return [c.row.id in held for c in claims]

    def failed(self, connection: sa.Connection, claim: ConfirmationClaim, now: datetime, retry_at: datetime | None,
               error: str) -> bool:
        """``last_error`` and due at ``retry_at``; FAILED (kept for the admin API) when given up."""
        if retry_at is None:  # SENT and FAILED are not tried again: no next attempt
            return record(connection, claim.row.id, claim.attempt, status=ConfirmationStatus.FAILED,
                          last_error=error, next_attempt_at=None, updated_at=now)
        return record(connection, claim.row.id, claim.attempt, next_attempt_at=retry_at, last_error=error,
                      updated_at=now)

    def release(self, connection: sa.Connection, node_id: str, now: datetime, leased_before: datetime) -> int:
        """The PENDING rows ``node_id`` claimed before ``leased_before`` due ``now``."""
        return release_claims(connection, node_id, now, leased_before)
