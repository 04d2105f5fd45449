"""The outbox table's SQL: events written in a state change's transaction, leased by one publishing node at a time,
deleted once the broker confirmed them, postponed with back-off when it did not.

Every function takes the caller's connection (its transaction): :func:`add_events` runs inside the transaction
of the state change it tells of, so an event exists exactly when that change was committed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

import sqlalchemy as sa
from openroute.persistence.models import outbox_table

__all__ = [
    "OutboxEvent", "add_events", "delete_events", "lease_due", "pending_count", "postpone_event", "release_leases",
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
              limit: int) -> list[OutboxEvent]:
    """Lease up to ``limit`` due events to ``node_id`` until ``now + lease``, oldest first, and return them.

    An event is due when its next attempt has come, no other node holds a live lease on it, and no older event of
    the same message is still waiting (events of one message are published in order). On PostgreSQL the rows are
    taken ``FOR UPDATE SKIP LOCKED``, so nodes leasing at the same time take different events.
    """
    t = outbox_table
    older = t.alias("older")
    query = (
        sa.select(t.c.id, t.c.event_id, t.c.channel, t.c.message_id, t.c.payload, t.c.attempts)
        .where(t.c.next_attempt_at <= now, sa.or_(t.c.lease_until.is_(None), t.c.lease_until < now))
        .where(~sa.exists().where(older.c.message_id == t.c.message_id, older.c.id < t.c.id))
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
