"""The tables of the store (``persistence/models.py``): the message's unique key and what goes with a deleted
message, on each real database (that the migrations build exactly these tables: test_migrations.py)."""

from __future__ import annotations

import pytest
import sqlalchemy as sa
from openroute.persistence import ExternalCallStatus, MessageState, MessageStore, message_table
from openroute.persistence.call_records import CallOutcome, CallRecord, CallRecordStore
from openroute.persistence.models import call_record_table, external_call_table, message_transition_table

from tests.persistence.conftest import START, new_message, rows


def test_unique_source_and_correlation_is_a_database_constraint(store: MessageStore) -> None:
    store.insert_message(new_message())
    values = {c.name: None for c in message_table.c if c.name != "id"}
    values.update(correlation_id="c-1", source_system="crm", service="s", operation="o", payload="p",
                  content_type="t", headers={}, state=MessageState.NEW, failed_count=0, receive_ts=START,
                  last_update_ts=START, custom_data={}, business_errors=[], version=0)
    with pytest.raises(sa.exc.IntegrityError), store.begin() as connection:
        connection.execute(message_table.insert().values(values))



def test_a_deleted_message_takes_its_transitions_calls_and_call_records_along(store: MessageStore) -> None:
    gone, kept = (store.insert_message(new_message(key)).message.id for key in ("c-1", "c-2"))
    for message_id in (gone, kept):
        store.calls.record(message_id, "pay", ExternalCallStatus.OK, START)
        CallRecordStore(store).add(CallRecord(message_id, "bank", "pay", START, 5, CallOutcome.OK))
    with store.begin() as connection:
        connection.execute(sa.delete(message_table).where(message_table.c.id == gone))
    for table in (message_transition_table, external_call_table, call_record_table):
        assert {row["message_id"] for row in rows(store, table)} == {kept}, table.name
    assert [row["state"] for row in rows(store, message_table)] == [MessageState.NEW]
