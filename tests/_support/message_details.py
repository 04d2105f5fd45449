"""The details a message page shows beyond the message row, written straight into a store for the admin API and
console tests."""

from __future__ import annotations

from datetime import UTC, datetime

import sqlalchemy as sa
from openroute.persistence import ConfirmationStatus, ExternalCallStatus, MessageState, MessageStore, NewMessage
from openroute.persistence import confirmation_table as confirmations


def add_child_call_and_confirmation(store: MessageStore, failed_id: int) -> int:
    """Gives the FAILED message ``failed_id`` a child message ``child-1``, an OK external call ``billing.charge``
    (result ``{"invoice": 7}``) and a FAILED confirmation after 3 attempts; returns the child's id."""
    now = datetime.now(UTC)
    child = store.insert_message(NewMessage(service="orders", operation="create", payload="{}",
                                            content_type="application/json", correlation_id="child-1",
                                            source_system="CRM", receive_ts=now, parent_id=failed_id))
    store.calls.record(failed_id, "billing.charge", ExternalCallStatus.OK, now, result={"invoice": 7})
    with store.begin() as connection:
        connection.execute(sa.insert(confirmations).values(
            message_id=failed_id, source_system="CRM", outcome_state=MessageState.FAILED,
            status=ConfirmationStatus.FAILED, attempts=3, last_error="HTTP 500: down", created_at=now,
            updated_at=now))
    return child.message.id
