"""Messages written straight into a store, for the tests of the store's queries behind the patterns."""

from __future__ import annotations

from datetime import datetime

import sqlalchemy as sa
from openroute.persistence import MessageState, MessageStore, NewMessage, message_table


def insert_message(store: MessageStore, key: str, *, at: datetime, operation: str = "setCustomer",
                   **extra: object) -> int:
    """Store a NEW crm message with correlation id ``key`` received ``at``; returns its id."""
    new = NewMessage(service="crm", operation=operation, payload="{}", content_type="application/json",
                     correlation_id=key, source_system="crm", receive_ts=at, **extra)  # type: ignore[arg-type]
    return store.insert_message(new).message.id


def set_state(store: MessageStore, message_id: int, state: MessageState) -> None:
    """Put a message in ``state`` directly (setting up a situation, not a transition under test)."""
    with store.begin() as connection:
        connection.execute(sa.update(message_table).where(message_table.c.id == message_id).values(state=state))
