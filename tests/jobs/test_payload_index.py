"""The payload search's index behind the commit (migration 0018, ``openroute.persistence.payload_index``): a stored
message is found by its payload before and after its copy is indexed; moves follow deletions; a serving node indexes
what it accepts and tells how many wait. The moves' own guarantees (atomic, shared by sessions) are
tests/persistence/test_payload_index.py."""

from __future__ import annotations

import asyncio
import logging
import time
from datetime import timedelta

import httpx
import pytest
import sqlalchemy as sa
from openroute.persistence import MessageStore, NewMessage

from openroute.definitions.route import Route, RouteRegistry
from openroute.engine import Engine, EngineSettings
from openroute.jobs.payload_indexer import PayloadIndexer
from openroute.queries import parse_filters
from openroute.queries.search import narrowed, search_summaries
from openroute.server import create_app
from tests.lifecycle.conftest import START


def _new(n: int, payload: str | None = None) -> NewMessage:
    payload = payload or f'<order id="{n}"><line>plain</line></order>'
    return NewMessage(service="crm", operation="order", payload=payload, content_type="text/xml",
                      correlation_id=f"c-{n}", source_system="shop", receive_ts=START + timedelta(seconds=n))


def _copies(store: MessageStore) -> dict[int, str]:
    with store.engine.connect() as connection:
        return dict(connection.execute(sa.text("SELECT message_id, payload FROM message_payload_text")).all())


def _found(store: MessageStore, params: dict[str, object], limit: int = 5) -> tuple[list[int], int]:
    """Every id a search pages through (newest first) and its first page's total."""
    found: list[int] = []
    total = -1
    cursor = None
    with store.engine.connect() as connection:
        while True:
            page = search_summaries(connection, parse_filters(params), cursor, limit=limit)
            total = page.total if total < 0 else total
            found.extend(row.id for row in page.rows)
            cursor = page.next_cursor
            if cursor is None:
                return found, total


def test_a_message_is_found_by_its_payload_before_and_after_its_copy_is_indexed(store: MessageStore) -> None:
    """150 messages stored and indexed, 100 more stored and pending (PostgreSQL; SQLite indexes nothing and reads
    the payloads): a rare text in one of each is found in both, by the trigram page (more candidates than the first
    try reads), on every page, with its total; after the rest is moved, the same."""
    old = store.insert_messages([_new(n, '<order id="4711"/>' if n == 10 else None) for n in range(150)])
    postgresql = store.dialect == "postgresql"
    assert store.payload_index.pending() == (150 if postgresql else 0)
    assert store.payload_index.move() == (150 if postgresql else 0)
    assert store.payload_index.pending() == 0
    new = store.insert_messages([_new(n, '<order id="4711"/>' if n == 160 else None) for n in range(150, 250)])
    assert store.payload_index.pending() == (100 if postgresql else 0)
    expected = [new[10].message.id, old[10].message.id]
    with store.engine.connect() as connection:  # the trigram page, not the first try's rows, answers on PostgreSQL
        page_filters = narrowed(connection, parse_filters({"payload_text": 'id="4711"'}), None, 5)
        assert page_filters is not None and page_filters.payload_index == postgresql
    assert _found(store, {"payload_text": 'id="4711"'}) == (expected, 2)
    assert _found(store, {"payload_text": 'ID="4711"', "service": "crm"}) == (expected, 2)
    assert _found(store, {"payload_text": 'id="4712"'}) == ([], 0)
    if postgresql:
        copies = _copies(store)
        assert len(copies) == 150 and copies[old[10].message.id] == '<order id="4711"/>'
        assert store.payload_index.move() == 100 and store.payload_index.pending() == 0
        assert len(_copies(store)) == 250
    assert _found(store, {"payload_text": 'id="4711"'}) == (expected, 2)
    # a text with a word every payload holds ("order"): the index is asked for the rare word only, same matches
    assert _found(store, {"payload_text": 'order id="4711"'}) == (expected, 2)


def test_a_deleted_message_takes_its_copy_and_a_pending_id_of_a_deleted_message_is_dropped(
    postgres_store: MessageStore,
) -> None:
    store = postgres_store
    stored = [outcome.message.id for outcome in store.insert_messages([_new(n) for n in range(4)])]
    assert store.payload_index.move() == 4
    more = [outcome.message.id for outcome in store.insert_messages([_new(n) for n in range(4, 6)])]
    with store.engine.begin() as connection:
        connection.execute(sa.text("DELETE FROM message WHERE id = ANY(:ids)"), {"ids": [stored[0], more[0]]})
    assert sorted(_copies(store)) == stored[1:]  # ON DELETE CASCADE
    assert store.payload_index.pending() == 2  # the deleted one's id is still there ...
    assert store.payload_index.move() == 2  # ... taken by the move, which copies only the message that exists
    assert sorted(_copies(store)) == [*stored[1:], more[1]] and store.payload_index.pending() == 0
    assert _found(store, {"payload_text": 'id="5"'}) == ([more[1]], 1)


def test_the_payload_index_refuses_a_batch_below_one(postgres_store: MessageStore) -> None:
    from openroute.persistence.payload_index import PayloadIndex

    with pytest.raises(ValueError, match="batch must be >= 1"):
        PayloadIndex(postgres_store, batch=0)
    with pytest.raises(Exception, match="interval must be > 0"):
        PayloadIndexer(postgres_store, interval=0)


async def test_a_serving_node_indexes_what_it_accepts_and_shows_how_many_wait(postgres_store: MessageStore) -> None:
    """The app's lifespan runs the indexer: 40 messages accepted through the JSON endpoint are copied within a few
    of its intervals (bounded wait), /metrics shows the gauge, and the indexer's loop stops with the app."""
    store = postgres_store
    engine = Engine(store, RouteRegistry([Route("crm", "order", [lambda exchange: None])]),
                    EngineSettings(repoll_interval=None, node_id="n1"))
    app = create_app(engine, payload_indexer=PayloadIndexer(store, interval=0.05))
    transport = httpx.ASGITransport(app=app)
    async with app.router.lifespan_context(app), httpx.AsyncClient(transport=transport,
                                                                    base_url="http://testserver") as client:
        for n in range(40):
            answer = await client.post("/api/crm/order", json={"orderId": f"O-{n}"},
                                       headers={"X-Correlation-Id": f"c-{n}", "X-Source-System": "shop"})
            assert answer.status_code == 202, answer.text
        deadline = time.monotonic() + 10
        while store.payload_index.pending() and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert store.payload_index.pending() == 0
        copies = _copies(store)
        assert len(copies) == 40 and all('"orderId"' in payload for payload in copies.values())
        metrics = (await client.get("/metrics")).text
        assert "openroute_payload_index_pending 0.0" in metrics
        assert isinstance(app.state.payload_indexer, PayloadIndexer)
    assert _found(store, {"payload_text": '"O-17"'})[1] == 1


async def test_a_failure_that_repeats_every_pass_shows_its_traceback_once(
    postgres_store: MessageStore, caplog: pytest.LogCaptureFixture
) -> None:
    """A store that lost the pending table (not an outage: the database answers) fails every pass the same way: the
    loop goes on, logs each failure in one line and its traceback once (the log's rule for repeated errors)."""
    from openroute.jobs.payload_indexer import FAILURE

    with postgres_store.engine.begin() as connection:
        connection.exec_driver_sql("DROP TABLE message_payload_pending")
    indexer = PayloadIndexer(postgres_store, interval=0.01)
    stop = asyncio.Event()
    running = asyncio.create_task(indexer.run(stop))

    def failures() -> list[logging.LogRecord]:
        return [r for r in caplog.records if r.name == "openroute.jobs.payload_indexer" and FAILURE in r.getMessage()]

    deadline = time.monotonic() + 10
    while len(failures()) < 5 and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    stop.set()
    await asyncio.wait_for(running, 10)
    assert len(failures()) >= 5, caplog.text
    assert sum(record.exc_info is not None for record in failures()) == 1
    assert not indexer.outage.down  # the database answered: not an outage
