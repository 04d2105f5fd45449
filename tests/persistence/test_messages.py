"""A message before and after it is stored (``persistence/messages.py``): the row a new message is inserted as,
and the stored message read back from a row, on each real database."""

from __future__ import annotations

import sqlalchemy as sa
from openroute.persistence import MessageState, MessageStore, message_table
from openroute.persistence.messages import insert_values, row_to_message

from tests.persistence.conftest import START, new_message, rows


def test_a_new_message_is_inserted_as_its_values_and_read_back_as_the_stored_message(store: MessageStore) -> None:
    new = new_message(headers={"endpoint": "json"}, object_id="o-1", entity_type="order", funnel_value="order-7",
                      process_id="p-1", msg_ts=START, traceparent="00-0af7651916cd43dd8448eb211c80319c-"
                                                               "b7ad6b7169203331-01")
    values = insert_values(new)
    with store.begin() as connection:
        message_id = connection.execute(
            message_table.insert().values(values).returning(message_table.c.id)).scalar_one()

    [row] = rows(store, message_table)
    assert {name: row[name] for name in values} == values
    assert (row["state"], row["version"], row["last_update_ts"], row["parent_id"]) == (
        MessageState.NEW, 0, START, None)
    with store.engine.connect() as connection:
        stored = row_to_message(connection.execute(sa.select(message_table)).one())
    assert stored.id == message_id and stored == store.get(message_id)
    assert (stored.correlation_id, stored.funnel_value, stored.headers, stored.custom_data,
            stored.business_errors) == ("c-1", "order-7", {"endpoint": "json"}, {}, [])


def test_empty_documents_of_a_row_read_back_empty_not_none(store: MessageStore) -> None:
    message_id = store.insert_message(new_message()).message.id
    with store.begin() as connection:
        connection.execute(sa.update(message_table).where(message_table.c.id == message_id)
                           .values(headers=None, custom_data=None, business_errors=None))
        stored = row_to_message(connection.execute(
            sa.select(message_table).where(message_table.c.id == message_id)).one())
    assert (stored.headers, stored.custom_data, stored.business_errors) == ({}, {}, [])
