"""The outbox table's SQL: events written in a state change's transaction, leased by one publishing node at a time,
deleted once the broker confirmed them, postponed with back-off when it did not. :class:`OutboxRows` is this table as
one kind of the delivery family (:mod:`openroute.persistence.delivery`: claim, renew, settle, release).

Every function takes the caller's connection (its transaction): :func:`add_events` runs inside the transaction
of the state change it tells of, so an event exists exactly when that change was committed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

import sqlalchemy as sa
from openroute.persistence.delivery import Claimed
from openroute.persistence.models import outbox_table

__all__ = [
    "OutboxEvent", "OutboxRows",
    "add_events", "delete_events", "lease_due", "pending_count", "postpone_event", "release_leases",
]


@dataclass(frozen=True)
class OutboxEvent:
    """One event to publish: its stable ``event_id``, the target ``channel``, the message it tells of and its JSON
    ``payload``; ``attempts`` counts the failed publishes so far."""

    id: int
    event_id: str
    channel: str
    message_id: int
    payload: str
    attempts: int


def add_events(connection: sa.Connection, rows: Sequence[dict[str, object]]) -> None:
    """Insert events (``event_id``, ``channel``, ``message_id``, ``payload``, ``created_at``) due at once."""
    if rows:
        connection.execute(outbox_table.insert(), [
            {**row, "attempts": 0, "next_attempt_at": row["created_at"]} for row in rows
        ])


def lease_due(connection: sa.Connection, node_id: str, now: datetime, lease: timedelta,
              limit: int, after_id: int = 0) -> list[OutboxEvent]:
    """Lease up to ``limit`` due events (id > ``after_id``) to ``node_id`` until ``now + lease``, oldest first, and
    return them.

    An event is due when its next attempt has come, no other node holds a live lease on it, and no older event of
    the same message is still waiting (events of one message are published in order). On PostgreSQL the rows are
    taken ``FOR UPDATE SKIP LOCKED``, so nodes leasing at the same time take different events.
    """
    t = outbox_table
    older = t.alias("older")
    query = (
        sa.select(t.c.id, t.c.event_id, t.c.channel, t.c.message_id, t.c.payload, t.c.attempts)
        .where(t.c.next_attempt_at <= now, sa.or_(t.c.lease_until.is_(None), t.c.lease_until < now))
        .where(~sa.exists().where(older.c.message_id == t.c.message_id, older.c.id < t.c.id), t.c.id > after_id)
        .order_by(t.c.id)
        .limit(limit)
    )
    if connection.dialect.name == "postgresql":
        query = query.with_for_update(skip_locked=True, of=t)
    events = [OutboxEvent(*row) for row in connection.execute(query)]
    if events:
        connection.execute(t.update().where(t.c.id.in_([e.id for e in events]))
                           .values(lease_node=node_id, lease_until=now + lease))
    return events


def delete_events(connection: sa.Connection, ids: Sequence[int]) -> int:
    """Remove published events; returns how many rows went."""
    if not ids:
        return 0
    return int(connection.execute(outbox_table.delete().where(outbox_table.c.id.in_(list(ids)))).rowcount or 0)


def postpone_event(connection: sa.Connection, event_id: int, next_attempt_at: datetime, error: str) -> None:
    """A publish failed: count it, release the lease and try again at ``next_attempt_at``."""
    t = outbox_table
    connection.execute(t.update().where(t.c.id == event_id).values(
        attempts=t.c.attempts + 1, next_attempt_at=next_attempt_at, lease_node=None, lease_until=None,
        last_error=error[:2000]))


def release_leases(connection: sa.Connection, node_id: str) -> int:
    """Give up every lease ``node_id`` holds (it restarted: nothing it leased is being published any more), so its
    events are due again at once instead of after the lease; returns how many were released."""
    t = outbox_table
    return int(connection.execute(t.update().where(t.c.lease_node == node_id)
                                  .values(lease_node=None, lease_until=None)).rowcount or 0)


def pending_count(connection: sa.Connection) -> int:
    """Events not yet published."""
    return int(connection.execute(sa.select(sa.func.count()).select_from(outbox_table)).scalar_one())


class OutboxRows:
    """The ``outbox`` table as a kind of the delivery family (``LeasedRows``): a claim leases the row to a node
    (``lease_node``, ``lease_until``; ``FOR UPDATE SKIP LOCKED`` on PostgreSQL) in the order of each message's
    events; a published event is deleted; a failed one counts an attempt and is due again at its back-off. Events
    are never given up."""

    def claim_due(self, connection: sa.Connection, node_id: str, now: datetime, lease_until: datetime, limit: int,
                  after_id: int) -> Claimed[OutboxEvent]:
        """:func:`lease_due`."""
        events = lease_due(connection, node_id, now, lease_until - now, limit, after_id)
        return Claimed(events, len(events), events[-1].id if events else after_id)

    def renew(self, connection: sa.Connection, claim: OutboxEvent, node_id: str, lease_until: datetime) -> bool:
        """Push the lease of ``claim`` while ``node_id`` holds it."""
        t = outbox_table
        return bool(connection.execute(t.update().where(t.c.id == claim.id, t.c.lease_node == node_id)
                                       .values(lease_until=lease_until)).rowcount == 1)

    def sent(self, connection: sa.Connection, claims: Sequence[OutboxEvent], now: datetime) -> list[bool]:
        """Delete the published events (one statement)."""
        delete_events(connection, [event.id for event in claims])
        return [True] * len(claims)

    def failed(self, connection: sa.Connection, claim: OutboxEvent, now: datetime, retry_at: datetime | None,
               error: str) -> bool:
        """:func:`postpone_event` to ``retry_at``."""
        if retry_at is None:
            raise ValueError("outcome events are retried until published: a failed one needs a retry time")
        postpone_event(connection, claim.id, retry_at, error)
        return True

    def release(self, connection: sa.Connection, node_id: str, now: datetime, leased_before: datetime) -> int:
        """:func:`release_leases`: an outbox row keeps no time of its lease, so every lease of ``node_id`` goes (the
        publisher releases at start, before it leased anything)."""
        return release_leases(connection, node_id)
