"""The funnel lock of the store under a takeover race on PostgreSQL (two transactions at once)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime

import pytest
import sqlalchemy as sa

from persistence import MessageState, MessageStore, NewMessage, message_table

NOW = datetime(2030, 1, 1, tzinfo=UTC)


@pytest.fixture
def pg_store(postgres_url: str) -> Iterator[MessageStore]:
    store = MessageStore(postgres_url)
    store.create_schema()
    yield store
    store.dispose()


def _insert(store: MessageStore, key: str) -> int:
    new = NewMessage(service="crm", operation="update", payload="{}", content_type="application/json",
                     correlation_id=key, source_system="crm", receive_ts=NOW, funnel_value="F")
    return store.insert_message(new).message.id


def _set_state(store: MessageStore, message_id: int, state: MessageState) -> None:
    with store.begin() as connection:
        connection.execute(sa.update(message_table).where(message_table.c.id == message_id).values(state=state))


def _waiting_on_a_lock(store: MessageStore) -> bool:
    query = sa.text("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                    "AND wait_event_type = 'Lock'")
    with store.engine.connect() as connection:
        return bool(connection.execute(query).scalar())


def test_a_holder_taken_again_waits_for_a_concurrent_takeover(pg_store: MessageStore) -> None:
    store = pg_store
    holder, taker = _insert(store, "H"), _insert(store, "A")
    _set_state(store, holder, MessageState.PROCESSING)
    assert store.acquire_funnel("F", holder, NOW) is None
    _set_state(store, holder, MessageState.PARTLY_FAILED)  # its attempt ended: the funnel may be taken over
    _set_state(store, taker, MessageState.PROCESSING)
    with ThreadPoolExecutor(1) as pool, store.engine.connect() as taking:
        with taking.begin():
            assert store.acquire_funnel("F", taker, NOW, taking) is None  # taken over, not committed yet
            _set_state(store, holder, MessageState.PROCESSING)  # meanwhile another node claims the old holder
            again = pool.submit(store.acquire_funnel, "F", holder, NOW)
            deadline = time.monotonic() + 10
            while not again.done() and not _waiting_on_a_lock(store):
                assert time.monotonic() < deadline, "the second acquire neither finished nor waited on the lock"
                time.sleep(0.01)
            assert not again.done(), "the old holder ran on while another message was taking its funnel over"
        assert again.result(timeout=10) == taker  # after the takeover committed: held by the taker
