"""A route fed by a RabbitMQ queue (the real broker): persist then ack, duplicates, dead letters, redelivery, two
nodes on one queue."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
from openroute.persistence import MessageStore

from openroute.engine import Engine, EngineSettings
from openroute.inbound.channel import CODE_HEADER, REASON_HEADER, ChannelInbound
from tests.channels.amqp_helpers import delete, publish, ready, take_all, unique
from tests.channels.channel_app import app as application
from tests.channels.run_config import with_schema

pytestmark = pytest.mark.rabbitmq


def config(url: str, queue: str, dlq: str) -> dict[str, Any]:
    return {
        "openroute.messaging.connector.amqp.url": url,
        "openroute.messaging.incoming.crm-in.connector": "amqp",
        "openroute.messaging.incoming.crm-in.queue": queue,
        "openroute.messaging.incoming.crm-in.source-system": "CRM",
        "openroute.messaging.incoming.crm-in.dead-letter-channel": "crm-dlq",
        "openroute.messaging.outgoing.crm-dlq.connector": "amqp",
        "openroute.messaging.outgoing.crm-dlq.queue": dlq,
    }


class Node:
    """An engine and its channels on one store."""

    def __init__(self, url: str, settings: dict[str, Any], broker: str, queue: str, dlq: str,
                 **attributes: Any) -> None:
        self.store = MessageStore(url)
        self.engine = Engine(self.store, application.routes, EngineSettings(repoll_interval=None, **settings))
        extra = {f"openroute.messaging.incoming.crm-in.{k.replace('_', '-')}": v for k, v in attributes.items()}
        self.channels = ChannelInbound(self.engine, application.channels, {**config(broker, queue, dlq), **extra},
                                       environ={})
        self._down = False
        self._accept = self.engine.accept

    async def start(self) -> None:
        await self.engine.start()
        await self.channels.start()

    async def stop(self) -> None:
        await self.channels.stop()
        await self.engine.stop()
        self.store.dispose()

    def store_down(self) -> None:
        """From now on the store refuses every delivery as a database that is down would, until :meth:`store_up`."""
        self._down = True
        self.engine.accept = self._flaky_accept  # type: ignore[method-assign]

    async def _flaky_accept(self, inbound: Any) -> Any:
        if self._down:
            raise sa.exc.OperationalError("INSERT", {}, ConnectionRefusedError("the database is down"))
        return await self._accept(inbound)

    def store_up(self) -> None:
        """The store takes deliveries again."""
        self._down = False

    def count(self) -> int:
        with self.store.engine.connect() as connection:
            return int(connection.execute(sa.text("SELECT count(*) FROM message")).scalar_one())


@pytest.fixture
async def queues(rabbitmq_url: str) -> AsyncIterator[tuple[str, str]]:
    names = unique("in"), unique("dlq")
    yield names
    await delete(rabbitmq_url, *names)


async def until(check: Callable[[], Awaitable[bool] | bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if not isinstance(value, bool):
            value = await value
        if value:
            return
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.05)


async def test_n_published_are_n_rows_and_the_queue_is_empty(
    sqlite_url: str, rabbitmq_url: str, queues: tuple[str, str]
) -> None:
    queue, dlq = queues
    await publish(rabbitmq_url, queue, [({"customer": {"id": f"C{i}"}}, f"m-{i}") for i in range(200)])
    node = Node(with_schema(sqlite_url), {}, rabbitmq_url, queue, dlq)
    await node.start()
    try:
        assert node.channels.health() == {"crm-in": "connected"}
        await until(lambda: node.channels.stats("crm-in").accepted == 200)
        assert node.count() == 200
    finally:
        await node.stop()
    assert await ready(rabbitmq_url, queue) == 0  # every delivery acked (unacked ones would be back after stop)


async def test_duplicates_are_acked_without_second_rows_and_invalid_ones_are_dead_lettered_with_the_reason(
    sqlite_url: str, rabbitmq_url: str, queues: tuple[str, str]
) -> None:
    queue, dlq = queues
    good = [({"customer": {"id": f"C{i}"}}, f"m-{i}") for i in range(20)]
    await publish(rabbitmq_url, queue, [*good, *good])
    await publish(rabbitmq_url, queue, [("{broken", "bad-1"), ({"customer": {}}, "bad-2")])
    node = Node(with_schema(sqlite_url), {}, rabbitmq_url, queue, dlq)
    await node.start()
    try:
        stats = node.channels.stats("crm-in")
        await until(lambda: stats.accepted + stats.duplicates + stats.dead_lettered == 42)
        assert (stats.accepted, stats.duplicates, stats.dead_lettered) == (20, 20, 2)
        assert node.count() == 20
    finally:
        await node.stop()
    assert await ready(rabbitmq_url, queue) == 0
    dead = {m.message_id: m for m in await take_all(rabbitmq_url, dlq)}
    assert sorted(dead) == ["bad-1", "bad-2"]
    assert dead["bad-1"].headers[CODE_HEADER] == "MALFORMED_PAYLOAD"
    assert "malformed JSON" in str(dead["bad-1"].headers[REASON_HEADER]) and dead["bad-1"].body == b"{broken"
    assert "required $.customer.id" in str(dead["bad-2"].headers[REASON_HEADER])


async def test_a_store_that_is_down_leaves_the_deliveries_in_the_queue_and_the_channel_resumes(
    sqlite_url: str, rabbitmq_url: str, queues: tuple[str, str]
) -> None:
    queue, dlq = queues
    await publish(rabbitmq_url, queue, [({"customer": {"id": f"C{i}"}}, f"m-{i}") for i in range(20)])
    node = Node(with_schema(sqlite_url), {}, rabbitmq_url, queue, dlq, backoff=0.05, max_backoff=0.1)
    node.store_down()
    await node.start()
    try:
        stats = node.channels.stats("crm-in")
        await until(lambda: stats.requeued >= 30)  # deliveries refused and given back, again and again
        assert node.count() == 0 and stats.accepted == 0
        node.store_up()
        await until(lambda: stats.accepted == 20)  # resumed by itself after the back-off
        assert node.count() == 20
    finally:
        await node.stop()
    assert await ready(rabbitmq_url, queue) == 0


async def test_two_nodes_on_one_queue_store_each_message_once(
    postgres_url: str, rabbitmq_url: str, queues: tuple[str, str]
) -> None:
    queue, dlq = queues
    messages = [({"customer": {"id": f"C{i}"}}, f"m-{i}") for i in range(150)]
    with_schema(postgres_url)
    nodes = [Node(postgres_url, {"node_id": f"node-{n}", "write_batch": 16}, rabbitmq_url, queue, dlq, concurrency=8)
             for n in (1, 2)]
    for node in nodes:
        await node.start()
    try:
        await publish(rabbitmq_url, queue, [*messages, *messages])  # each one twice: the copies may reach either node
        def settled() -> int:
            return sum(n.channels.stats("crm-in").accepted + n.channels.stats("crm-in").duplicates for n in nodes)

        await until(lambda: settled() == 300, timeout=60)
        assert all(n.channels.stats("crm-in").accepted > 0 for n in nodes)  # both took their share
        assert sum(n.channels.stats("crm-in").accepted for n in nodes) == 150
        with nodes[0].store.engine.connect() as connection:
            ids = connection.execute(sa.text("SELECT correlation_id FROM message")).scalars().all()
        assert sorted(ids) == sorted(m for _, m in messages)
    finally:
        for node in nodes:
            await node.stop()
    assert await ready(rabbitmq_url, queue) == 0


async def test_headers_not_of_their_documented_type_are_dead_lettered_with_the_reason(
    sqlite_url: str, rabbitmq_url: str, queues: tuple[str, str]
) -> None:
    """The headers a channel reads are text: a number, a table, a list, a boolean, bytes that are not UTF-8 or a
    NUL in the source system sends the delivery to the dead-letter queue with its reason, never into the store."""
    queue, dlq = queues
    wrong: dict[str, dict[str, Any]] = {
        "int": {"x-source-system": 12345},
        "table": {"x-source-system": {"a": [1, 2]}},
        "list": {"x-source-system": ["CRM"]},
        "bool": {"x-process-id": True},
        "bytes": {"x-source-system": bytearray(b"\xff\xfe")},
        "nul": {"x-source-system": "CR\x00M"},
    }
    for name, headers in wrong.items():
        await publish(rabbitmq_url, queue, [({"customer": {"id": name}}, f"bad-{name}")], headers=headers)
    await publish(rabbitmq_url, queue, [({"customer": {"id": "ok"}}, "good")], headers={"x-source-system": "ERP"})
    node = Node(with_schema(sqlite_url), {}, rabbitmq_url, queue, dlq)
    await node.start()
    try:
        stats = node.channels.stats("crm-in")
        await until(lambda: stats.accepted + stats.dead_lettered == len(wrong) + 1)
        assert (stats.accepted, stats.dead_lettered, stats.requeued) == (1, len(wrong), 0)
        [stored] = node.store.find()
        assert (stored.correlation_id, stored.source_system) == ("good", "ERP")
    finally:
        await node.stop()
    dead = {m.message_id: m for m in await take_all(rabbitmq_url, dlq)}
    assert sorted(dead) == sorted(f"bad-{name}" for name in wrong)
    reasons = {key.removeprefix("bad-"): str(m.headers[REASON_HEADER]) for key, m in dead.items()}
    assert all(dead[f"bad-{name}"].headers[CODE_HEADER] == "VALIDATION_ERROR" for name in wrong)
    assert "header x-source-system must be a string, got int 12345" in reasons["int"]
    assert "got dict" in reasons["table"] and "got list" in reasons["list"]
    assert "header x-process-id must be a string, got bool True" in reasons["bool"]
    assert "header x-source-system is not UTF-8 text" in reasons["bytes"]
    assert "source_system holds a NUL character" in reasons["nul"]


async def test_metrics_and_the_dashboard_count_each_channels_deliveries_by_outcome(
    sqlite_url: str, rabbitmq_url: str, queues: tuple[str, str]
) -> None:
    """Issue 42: ``openroute_channel_deliveries_total{channel, outcome}`` on /metrics and the dashboard's channel
    table count what the real broker delivered: stored, duplicates, dead-lettered, and given back while the store
    was down (requeued), read over HTTP from the node."""
    from prometheus_client.parser import text_string_to_metric_families

    from openroute.inbound import AdminAuth, AdminUser
    from openroute.server import create_app
    from tests._support.servers import served

    queue, dlq = queues
    good = [({"customer": {"id": f"C{i}"}}, f"m-{i}") for i in range(5)]
    await publish(rabbitmq_url, queue, [*good, *good, ("{broken", "bad-1"), ({"customer": {}}, "bad-2")])
    node = Node(with_schema(sqlite_url), {}, rabbitmq_url, queue, dlq, backoff=0.05, max_backoff=0.1)
    node.store_down()
    app = create_app(node.engine, channels=node.channels, manage_engine=False,
                     admin_auth=AdminAuth([AdminUser("ops", "ops-secret")]))
    await node.start()
    try:
        stats = node.channels.stats("crm-in")
        await until(lambda: stats.requeued >= 3 and stats.dead_lettered == 2)
        node.store_up()
        await until(lambda: stats.accepted + stats.duplicates == 10)
        assert (stats.accepted, stats.duplicates, stats.dead_lettered, stats.rejected) == (5, 5, 2, 0)
        async with served(app) as url, httpx.AsyncClient(base_url=url, auth=("ops", "ops-secret")) as client:
            scraped = (await client.get("/metrics")).text
            dashboard = (await client.get("/console/")).text
    finally:
        await node.stop()
    [family] = [f for f in text_string_to_metric_families(scraped) if f.name == "openroute_channel_deliveries"]
    counted = {(s.labels["channel"], s.labels["outcome"]): s.value for s in family.samples
               if s.name.endswith("_total")}
    assert counted == {("crm-in", "accepted"): 5, ("crm-in", "duplicate"): 5, ("crm-in", "dead_lettered"): 2,
                       ("crm-in", "rejected"): 0, ("crm-in", "requeued"): stats.requeued}
    for outcome, count in (("accepted", 5), ("duplicate", 5), ("requeued", stats.requeued)):
        assert f'id="channel-crm-in-{outcome}">{count}<' in dashboard
    assert 'id="channel-crm-in-dead_lettered" class="refused">2 <small>to crm-dlq</small>' in dashboard
    # the last refusal, with its code and reason (the deliveries may come in any order)
    assert (stats.last_refused_code, stats.last_refused_reason) in {
        ("MALFORMED_PAYLOAD", "malformed JSON: Expecting property name enclosed in double quotes at line 1 column 2"),
        ("VALIDATION_ERROR", "required $.customer.id is missing or empty")}
    assert f"<b>{stats.last_refused_code}</b> {stats.last_refused_reason}</td>" in dashboard
    assert len(await take_all(rabbitmq_url, dlq)) == 2
