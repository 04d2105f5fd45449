"""Upgrading a store that holds messages: every migration after 0003 keeps the rows and adds what it promises."""

from __future__ import annotations

import sqlalchemy as sa
from alembic import command
from openroute.persistence import MessageState, MessageStore, NewMessage
from openroute.persistence.store import alembic_config

from openroute import states
from openroute.admin import parse_filters, search_messages
from tests.lifecycle.conftest import START

SEARCH_INDEXES = {
    "ix_message_receive": ["receive_ts", "id"],
    "ix_message_correlation": ["correlation_id"],
    "ix_message_object": ["object_id", "receive_ts"],
    "ix_message_process": ["process_id", "receive_ts"],
}


def test_upgrade_from_0003_with_messages_in_the_store(database_url: str) -> None:
    store = MessageStore(database_url)
    try:
        store.upgrade("0003")
        assert store.current_revision() == "0003"
        ids = []
        for i in range(5):
            new = NewMessage(service="s", operation="o", payload="{}", content_type="application/json",
                             correlation_id=f"m-{i}", source_system="crm", receive_ts=START, object_id=f"obj-{i % 2}",
                             process_id="p-1")
            ids.append(store.insert_message(new).message.id)
        done = states.transition(store, states.claim(store, [store.get(ids[0])], "n", START)[0], MessageState.OK,
                                 START)
        before = [store.get(i) for i in ids]

        store.upgrade()

        assert store.current_revision() == MessageStore.head_revision()
        assert [store.get(i) for i in ids] == before and before[0] == done
        indexes = {i["name"]: i["column_names"] for i in sa.inspect(store.engine).get_indexes("message")}
        for name, columns in SEARCH_INDEXES.items():
            assert indexes.get(name) == columns
        with store.engine.connect() as connection:
            page = search_messages(connection, parse_filters({"object_id": "obj-0", "process_id": "p-1"}))
        assert [m.id for m in page.items] == [ids[4], ids[2], ids[0]] and page.total == 3
        with store.engine.begin() as connection:  # and back down: the indexes go, the rows stay
            config = alembic_config(store.url)
            config.attributes["connection"] = connection
            command.downgrade(config, "0003")
        names = {i["name"] for i in sa.inspect(store.engine).get_indexes("message")}
        assert not names & set(SEARCH_INDEXES) and [store.get(i) for i in ids] == before
    finally:
        store.dispose()
