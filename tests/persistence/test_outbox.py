"""The outcome-event kind's own SQL (persistence/outbox.py): events written due at once, deleted once published,
postponed with their error, a restarted node's leases given up. What the kind shares with the confirmations (claim,
renew, settle, release) is tests/persistence/test_delivery.py."""

from __future__ import annotations

import uuid
from datetime import timedelta

from openroute.persistence import MessageStore
from openroute.persistence import outbox as outbox_sql
from openroute.persistence.models import outbox_table

from tests.persistence.conftest import START, new_message, rows


def _events(store: MessageStore, count: int) -> list[int]:
    with store.begin() as connection:
        [outcome] = store.insert_messages([new_message("c-1")], connection)
        outbox_sql.add_events(connection, [
            {"event_id": str(uuid.uuid4()), "channel": "events", "message_id": outcome.message.id, "payload": "{}",
             "created_at": START} for _ in range(count)])
    return [row["id"] for row in rows(store, outbox_table, outbox_table.c.id)]


def test_events_are_due_at_once_and_go_once_published(store: MessageStore) -> None:
    ids = _events(store, 3)
    assert [(row["attempts"], row["next_attempt_at"]) for row in rows(store, outbox_table)] == [(0, START)] * 3
    with store.begin() as connection:
        assert outbox_sql.delete_events(connection, ids[:2]) == 2
        assert outbox_sql.delete_events(connection, []) == 0
        assert outbox_sql.pending_count(connection) == 1
    assert [row["id"] for row in rows(store, outbox_table)] == ids[2:]


def test_a_failed_publish_is_postponed_and_a_restarted_nodes_leases_given_up(store: MessageStore) -> None:
    [event] = _events(store, 1)
    later = START + timedelta(seconds=30)
    with store.begin() as connection:
        outbox_sql.postpone_event(connection, event, later, "broker away " + "x" * 3000)
    [row] = rows(store, outbox_table)
    assert (row["attempts"], row["next_attempt_at"], len(row["last_error"])) == (1, later, 2000)
    with store.begin() as connection:
        assert [e.id for e in outbox_sql.lease_due(connection, "node-a", later, timedelta(seconds=60), 10)] == [event]
        assert outbox_sql.release_leases(connection, "node-b") == 0
        assert outbox_sql.release_leases(connection, "node-a") == 1
    [row] = rows(store, outbox_table)
    assert row["lease_node"] is None and row["lease_until"] is None
