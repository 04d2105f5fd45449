"""The outbox publisher on the real RabbitMQ: publisher confirms, two nodes sharing the rows (SKIP LOCKED on
PostgreSQL) without publishing one twice, a refused publish retried with back-off."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import aio_pika
import pytest
import sqlalchemy as sa
from openroute.persistence import MessageStore
from openroute.persistence import outbox as outbox_sql

from openroute.definitions.clock import ManualClock
from openroute.engine.outbox import EVENT_HEADER, OutboxPublisher, OutboxSettings, OutcomeEvents
from tests.channels.amqp_helpers import delete, take_all, unique

pytestmark = pytest.mark.rabbitmq


@pytest.fixture
async def events_queue(rabbitmq_url: str) -> AsyncIterator[str]:
    name = unique("events")
    yield name
    await delete(rabbitmq_url, name)


def add(store: MessageStore, count: int, messages: int) -> list[str]:
    """``count`` events spread over ``messages`` messages, in the outbox as a final state's transaction leaves them."""
    now = datetime.now(UTC)
    rows = []
    for index in range(count):
        event_id = str(uuid.uuid4())
        rows.append({"event_id": event_id, "channel": "events", "message_id": index % messages,
                     "payload": json.dumps({"eventId": event_id, "seq": index}), "created_at": now})
    with store.begin() as connection:
        outbox_sql.add_events(connection, rows)
    return [row["event_id"] for row in rows]  # type: ignore[misc]


def publisher(store: MessageStore, config: dict[str, Any], node: str, clock: Any = None,
              **settings: Any) -> OutboxPublisher:
    return OutboxPublisher(store, [OutcomeEvents("events")], config, node_id=node,
                           settings=OutboxSettings(**settings), environ={}, clock=clock)


async def test_two_nodes_publish_every_event_once_in_order_per_message(
    postgres_store: MessageStore, rabbitmq_url: str, events_queue: str
) -> None:
    ids = add(postgres_store, 300, 60)
    config = {"openroute.messaging.outgoing.events.connector": "amqp",
              "openroute.messaging.outgoing.events.url": rabbitmq_url,
              "openroute.messaging.outgoing.events.queue": events_queue}
    nodes = [publisher(postgres_store, config, f"node-{n}", batch=16) for n in (1, 2)]
    for node in nodes:
        await node.start()
    try:
        async def drain(node: OutboxPublisher) -> None:
            while await node.publish_once():
                pass

        for _ in range(20):  # rounds until every event is out (one event per message per round: order)
            await asyncio.gather(*(drain(node) for node in nodes))
            with postgres_store.engine.connect() as connection:
                if outbox_sql.pending_count(connection) == 0:
                    break
        assert all(node.stats.published > 0 for node in nodes)
        assert sum(node.stats.published for node in nodes) == 300
    finally:
        for node in nodes:
            await node.stop()
    received = await take_all(rabbitmq_url, events_queue)
    assert sorted(m.message_id for m in received) == sorted(ids)  # each once, the event id as AMQP message id
    assert all(m.headers[EVENT_HEADER] == m.message_id for m in received)
    order: dict[int, list[int]] = {}
    for received_message in received:
        seq = json.loads(received_message.body)["seq"]
        order.setdefault(seq % 60, []).append(seq)
    assert all(seqs == sorted(seqs) for seqs in order.values())  # per message, in the order written


async def test_a_refused_publish_stays_in_the_outbox_and_is_retried_with_back_off(
    sqlite_url: str, rabbitmq_url: str, events_queue: str
) -> None:
    store = MessageStore(sqlite_url)
    store.create_schema()
    [event_id] = add(store, 1, 1)
    config = {"openroute.messaging.outgoing.events.connector": "amqp",
              "openroute.messaging.outgoing.events.url": rabbitmq_url,
              "openroute.messaging.outgoing.events.exchange": "amq.direct",
              "openroute.messaging.outgoing.events.declare": False,
              "openroute.messaging.outgoing.events.routing-key": events_queue}
    clock = ManualClock(datetime.now(UTC))
    node = publisher(store, config, "node-1", clock, backoff=timedelta(seconds=10))
    await node.start()
    try:
        assert await node.publish_once() == 0  # no queue bound: unroutable, the broker returns it
        with store.engine.connect() as connection:
            attempts, error = connection.execute(sa.text("SELECT attempts, last_error FROM outbox")).one()
        assert attempts == 1 and error
        connection_ = await aio_pika.connect(rabbitmq_url)
        channel = await connection_.channel()
        queue = await channel.declare_queue(events_queue, durable=True)
        await queue.bind("amq.direct", routing_key=events_queue)
        await connection_.close()
        assert await node.publish_once() == 0  # still backing off
        clock.advance(timedelta(seconds=11))
        assert await node.publish_once() == 1
    finally:
        await node.stop()
        store.dispose()
    [received] = await take_all(rabbitmq_url, events_queue)
    assert received.message_id == event_id
