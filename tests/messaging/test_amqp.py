"""The amqp connector against the real RabbitMQ broker (skipped on a laptop without it, a failure in CI)."""

from __future__ import annotations

import asyncio
import gc
import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

import aio_pika
import pytest

from openroute.messaging import Acknowledgment, Message, MessagingApp
from openroute.messaging.amqp import AmqpIncomingMetadata, AmqpOutgoingMetadata, _Delivery, decode, encode

pytestmark = pytest.mark.rabbitmq


class Broker:
    """A direct aio-pika connection for the test's own publishing, inspection and clean-up."""

    def __init__(self, url: str, connection: aio_pika.abc.AbstractConnection,
                 channel: aio_pika.abc.AbstractChannel) -> None:
        self.url = url
        self.connection = connection
        self.channel = channel
        self.prefix = f"openroute-t-{uuid.uuid4().hex[:10]}"
        self.queues: list[str] = []
        self.exchanges: list[str] = []

    def name(self, suffix: str) -> str:
        return f"{self.prefix}-{suffix}"

    async def queue(self, suffix: str, **arguments: Any) -> str:
        name = self.name(suffix)
        await self.channel.declare_queue(name, durable=True, arguments=arguments or None)
        self.queues.append(name)
        return name

    async def publish(self, queue: str, *bodies: Any) -> None:
        for body in bodies:
            data, content_type = encode(body)
            await self.channel.default_exchange.publish(aio_pika.Message(data, content_type=content_type), queue)

    async def count(self, queue: str) -> int:
        declared = await self.channel.declare_queue(queue, passive=True)
        return declared.declaration_result.message_count or 0

    async def get(self, queue: str, timeout: float = 5.0) -> aio_pika.abc.AbstractIncomingMessage:
        declared = await self.channel.get_queue(queue)

        async def poll() -> aio_pika.abc.AbstractIncomingMessage:
            async with declared.iterator() as iterator:
                async for message in iterator:
                    await message.ack()
                    return message
            raise AssertionError("queue iterator ended")

        return await asyncio.wait_for(poll(), timeout)


@pytest.fixture
async def broker(rabbitmq_url: str) -> AsyncIterator[Broker]:
    connection = await aio_pika.connect(rabbitmq_url)
    channel = await connection.channel()
    state = Broker(rabbitmq_url, connection, channel)
    try:
        yield state
    finally:
        cleanup = await connection.channel()
        for queue in state.queues:
            await cleanup.queue_delete(queue)
        for exchange in state.exchanges:
            await cleanup.exchange_delete(exchange)
        await connection.close()


def amqp_in(broker: Broker, channel: str, queue: str, **attributes: Any) -> dict[str, Any]:
    config = {f"openroute.messaging.incoming.{channel}.connector": "amqp",
              f"openroute.messaging.incoming.{channel}.queue": queue,
              "openroute.messaging.connector.amqp.url": broker.url}
    config.update({f"openroute.messaging.incoming.{channel}.{k}": v for k, v in attributes.items()})
    return config


def amqp_out(broker: Broker, channel: str, **attributes: Any) -> dict[str, Any]:
    config = {f"openroute.messaging.outgoing.{channel}.connector": "amqp",
              "openroute.messaging.connector.amqp.url": broker.url}
    config.update({f"openroute.messaging.outgoing.{channel}.{k}": v for k, v in attributes.items()})
    return config


def test_payload_encoding_round_trip() -> None:
    for payload in (b"\x00raw", "text ü", {"id": 1, "tags": ["a"]}, [1, 2]):
        assert decode(*encode(payload)) == payload


def test_json_bodies_decode_as_json_loads_does_whatever_their_encoding() -> None:
    value = {"name": "Zoë", "kana": "ｱ"}
    for body in (json.dumps(value).encode(), json.dumps(value, ensure_ascii=False).encode(),
                 json.dumps(value).encode("utf-8-sig"), json.dumps(value).encode("utf-16"),
                 json.dumps(value).encode("utf-32-le"), '"ｱ"'.encode()):
        assert decode(body, "application/json; charset=utf-8") == json.loads(body)
    assert decode(b"12", "application/vnd.openroute+json") == 12
    assert decode(b"Zo\xc3\xab", "TEXT/plain") == "Zoë"
    assert decode(b"\x00raw", "application/octet-stream") == decode(b"\x00raw", None) == b"\x00raw"
    with pytest.raises(ValueError):
        decode(b"{", "application/json")


async def test_consume_and_ack(broker: Broker) -> None:
    queue = await broker.queue("in")
    await broker.publish(queue, {"n": 1}, {"n": 2}, "three")
    app = MessagingApp(amqp_in(broker, "orders", queue), environ={})
    seen: list[Any] = []
    done = asyncio.Event()

    @app.incoming("orders")
    async def handle(message: Message[Any]) -> None:
        metadata = message.get_metadata(AmqpIncomingMetadata)
        assert metadata is not None and metadata.routing_key == queue
        seen.append(message.payload)
        await message.ack()
        if len(seen) == 3:
            done.set()

    async with app:
        await asyncio.wait_for(done.wait(), 5)
    assert seen == [{"n": 1}, {"n": 2}, "three"]
    assert await broker.count(queue) == 0
    assert app.counters() == {"orders": 3}


async def test_settled_deliveries_are_freed_without_the_cycle_collector(broker: Broker) -> None:
    queue = await broker.queue("in")
    await broker.publish(queue, *range(50))
    app = MessagingApp(amqp_in(broker, "orders", queue), environ={})
    seen: list[int] = []
    done = asyncio.Event()

    @app.incoming("orders", concurrency=8)
    def handle(value: int) -> None:
        seen.append(value)
        if len(seen) == 50:
            done.set()

    gc.collect()
    gc.disable()  # a delivery that only the collector could free would still be there after the stop
    try:
        async with app:
            await asyncio.wait_for(done.wait(), 10)
        left = [o for o in gc.get_objects() if isinstance(o, _Delivery)]
    finally:
        gc.enable()
    assert sorted(seen) == list(range(50))
    assert left == []


async def test_nack_dead_letters_by_default(broker: Broker) -> None:
    dead = await broker.queue("dead")
    queue = await broker.queue("in", **{"x-dead-letter-exchange": "", "x-dead-letter-routing-key": dead})
    await broker.publish(queue, "poison")
    app = MessagingApp(amqp_in(broker, "orders", queue, declare="false"), environ={})
    failed = asyncio.Event()

    @app.incoming("orders")
    def handle(payload: str) -> None:
        failed.set()
        raise ValueError("cannot process")

    async with app:
        await asyncio.wait_for(failed.wait(), 5)
        message = await broker.get(dead)
    assert message.body == b"poison"
    assert await broker.count(queue) == 0


async def test_dead_letter_queue_declared_from_attributes(broker: Broker) -> None:
    dead = await broker.queue("dead")
    queue = broker.name("declared")
    broker.queues.append(queue)
    await broker.channel.declare_queue(dead, passive=True)
    app = MessagingApp(amqp_in(broker, "orders", queue, **{
        "dead-letter-exchange": "", "dead-letter-routing-key": dead}), environ={})

    @app.incoming("orders")
    async def handle(payload: str) -> None:
        raise RuntimeError("no")

    async with app:
        await broker.publish(queue, "declared-poison")
        message = await broker.get(dead)
    assert message.body == b"declared-poison"


async def test_nack_requeues_when_configured(broker: Broker) -> None:
    queue = await broker.queue("in")
    await broker.publish(queue, "again")
    app = MessagingApp(amqp_in(broker, "orders", queue, **{"failure-strategy": "requeue"}), environ={})
    deliveries: list[bool] = []
    acked = asyncio.Event()

    @app.incoming("orders")
    async def handle(message: Message[str]) -> None:
        metadata = message.get_metadata(AmqpIncomingMetadata)
        assert metadata is not None
        deliveries.append(metadata.redelivered)
        if not metadata.redelivered:
            await message.nack(RuntimeError("try later"))
        else:
            await message.ack()
            acked.set()

    async with app:
        await asyncio.wait_for(acked.wait(), 5)
    assert deliveries == [False, True]
    assert await broker.count(queue) == 0


async def test_acks_sent_together_never_cover_an_undecided_delivery(broker: Broker) -> None:
    """Acks go out as one basic.ack with multiple=True: one of a later delivery must not settle an earlier one that is
    still undecided, and is then given back (it comes again, redelivered)."""
    from openroute.messaging.errors import RedeliverError

    queue = await broker.queue("in")
    await broker.publish(queue, "first", "second", "third")
    app = MessagingApp(amqp_in(broker, "orders", queue), environ={})
    held: asyncio.Future[Message[str]] = asyncio.get_running_loop().create_future()
    later_acked = asyncio.Event()
    again = asyncio.Event()
    seen: list[tuple[str, bool]] = []

    @app.incoming("orders", acknowledgment=Acknowledgment.MANUAL, concurrency=3)
    async def handle(message: Message[str]) -> None:
        metadata = message.get_metadata(AmqpIncomingMetadata)
        assert metadata is not None
        seen.append((message.payload, metadata.redelivered))
        if message.payload == "first" and not metadata.redelivered:
            held.set_result(message)  # undecided while the later two are acked
            return
        await message.ack()
        if message.payload == "first":
            again.set()
        elif len(seen) == 3:
            later_acked.set()

    async with app:
        first = await asyncio.wait_for(held, 5)
        await asyncio.wait_for(later_acked.wait(), 5)
        await first.nack(RedeliverError("given back"))
        await asyncio.wait_for(again.wait(), 5)
    assert sorted(seen) == [("first", False), ("first", True), ("second", False), ("third", False)]
    assert await broker.count(queue) == 0


async def test_prefetch_follows_downstream_demand(broker: Broker) -> None:
    queue = await broker.queue("in")
    await broker.publish(queue, *range(10))
    app = MessagingApp(amqp_in(broker, "orders", queue), environ={})
    release = asyncio.Event()
    running: list[int] = []
    three, ten = asyncio.Event(), asyncio.Event()

    @app.incoming("orders", concurrency=3)
    async def handle(payload: int) -> None:
        running.append(payload)
        if len(running) == 3:
            three.set()
        if len(running) == 10:
            ten.set()
        await release.wait()

    async with app:
        await asyncio.wait_for(three.wait(), 5)
        [source] = app.connector("amqp").sources
        assert source.prefetch == 3
        assert await broker.count(queue) == 7  # the broker holds back what nobody asked for
        release.set()
        await asyncio.wait_for(ten.wait(), 5)
    assert sorted(running) == list(range(10))


async def test_outgoing_acks_after_broker_confirm(broker: Broker) -> None:
    queue = await broker.queue("out")
    app = MessagingApp(amqp_out(broker, "results", queue=queue), environ={})
    emitter = app.emitter("results")
    async with app:
        futures = [emitter.send({"i": i}) for i in range(5)]
        futures.append(emitter.send(Message("meta", (AmqpOutgoingMetadata(headers={"x-kind": "test"}),))))
        await asyncio.wait_for(asyncio.gather(*futures), 5)
        assert await broker.count(queue) == 6  # every ack came after the message was in the queue
    bodies = [await broker.get(queue) for _ in range(6)]
    assert [decode(m.body, m.content_type) for m in bodies[:5]] == [{"i": i} for i in range(5)]
    assert bodies[5].headers.get("x-kind") == "test"


async def test_unroutable_publish_is_nacked(broker: Broker) -> None:
    exchange = broker.name("nowhere")
    broker.exchanges.append(exchange)
    app = MessagingApp(amqp_out(broker, "results", exchange=exchange, **{"routing-key": "none"}), environ={})
    emitter = app.emitter("results")
    async with app:
        future = emitter.send("lost?")
        with pytest.raises(Exception) as raised:
            await asyncio.wait_for(future, 5)
    assert not isinstance(raised.value, TimeoutError)


async def test_amqp_to_amqp_through_a_processor_with_chained_acks(broker: Broker) -> None:
    source_queue = await broker.queue("src")
    target_queue = await broker.queue("dst")
    await broker.publish(source_queue, *range(20))
    config = {**amqp_in(broker, "in", source_queue), **amqp_out(broker, "out", queue=target_queue)}
    app = MessagingApp(config, environ={})

    @app.incoming("in", acknowledgment=Acknowledgment.POST_PROCESSING)
    @app.outgoing("out")
    def square(value: int) -> int:
        return value * value

    async with app:
        received = [decode((await broker.get(target_queue)).body, "application/json") for _ in range(20)]
        assert received == [i * i for i in range(20)]

        async def source_acked() -> None:  # the broker offers no event for this: poll its count
            while await broker.count(source_queue) != 0:
                await asyncio.sleep(0.02)
        await asyncio.wait_for(source_acked(), 5)


async def test_unreachable_broker_is_a_deployment_error() -> None:
    from openroute.messaging import DeploymentError

    app = MessagingApp({"openroute.messaging.incoming.x.connector": "amqp",
                        "openroute.messaging.incoming.x.queue": "q",
                        "openroute.messaging.incoming.x.url": "amqp://guest:secret@127.0.0.1:1/"}, environ={})

    @app.incoming("x")
    def handle(payload: Any) -> None: ...

    with pytest.raises(DeploymentError, match="cannot connect") as raised:
        await asyncio.wait_for(app.start(), 30)
    assert "secret" not in str(raised.value)
    assert type(raised.value) is DeploymentError  # a broker problem, not a definition problem


async def test_stop_returns_unfinished_messages_to_the_queue(broker: Broker) -> None:
    queue = await broker.queue("in")
    await broker.publish(queue, *range(5))
    app = MessagingApp(amqp_in(broker, "orders", queue), environ={})
    entered = asyncio.Event()

    @app.incoming("orders", concurrency=2)
    async def stuck(payload: int) -> None:
        entered.set()
        await asyncio.Event().wait()

    await app.start()
    await asyncio.wait_for(entered.wait(), 5)
    await asyncio.wait_for(app.stop(timeout=0.1), 10)

    async def all_back() -> None:  # the broker requeues asynchronously after the channel closed: poll its count
        while await broker.count(queue) != 5:
            await asyncio.sleep(0.02)
    await asyncio.wait_for(all_back(), 5)


@pytest.mark.parametrize(("direction", "attribute", "value", "expected"), [
    ("incoming", "failure-strategy", "explode", "failure-strategy must be"),
    ("outgoing", "max-inflight", "0", "max-inflight must be positive"),
    ("incoming", "prefetch", "0", "prefetch and max-prefetch must be positive"),
])
async def test_bad_amqp_attributes_are_deployment_errors(broker: Broker, direction: str, attribute: str,
                                                         value: str, expected: str) -> None:
    from openroute.messaging import DeploymentError

    queue = await broker.queue("q")
    if direction == "incoming":
        app = MessagingApp(amqp_in(broker, "c", queue, **{attribute: value}), environ={})

        @app.incoming("c")
        def handle(payload: Any) -> None: ...
    else:
        app = MessagingApp(amqp_out(broker, "c", queue=queue, **{attribute: value}), environ={})
        app.emitter("c")
    with pytest.raises(DeploymentError, match=expected):
        await app.start()


async def test_undecodable_body_is_rejected_without_requeue(broker: Broker) -> None:
    dead = await broker.queue("dead")
    queue = await broker.queue("in", **{"x-dead-letter-exchange": "", "x-dead-letter-routing-key": dead})
    await broker.channel.default_exchange.publish(
        aio_pika.Message(b"{not json", content_type="application/json"), queue)
    await broker.publish(queue, "fine")
    app = MessagingApp(amqp_in(broker, "orders", queue, declare="false"), environ={})
    seen: list[Any] = []
    done = asyncio.Event()

    @app.incoming("orders")
    def handle(payload: Any) -> None:
        seen.append(payload)
        done.set()

    async with app:
        await asyncio.wait_for(done.wait(), 5)
        assert (await broker.get(dead)).body == b"{not json"
    assert seen == ["fine"]


async def test_amqp_source_passes_the_publisher_rules(broker: Broker) -> None:
    """The connector's publisher through the rule-test helper, on real queues filled with n messages each."""
    from itertools import count

    from openroute.messaging import MessagingConfig
    from openroute.messaging.amqp import AmqpConnector
    from openroute.streams.tck import verify_publisher

    connector = AmqpConnector()
    numbers = count()

    async def make(n: int) -> Any:
        queue = await broker.queue(f"tck-{next(numbers)}")
        await broker.publish(queue, *range(1, n + 1))
        config = MessagingConfig(amqp_in(broker, "tck", queue), environ={}).channel("incoming", "tck", ["amqp"])
        return await connector.create_publisher(config)

    try:
        # a queue consumer never completes: the rules watching for on_complete do not apply (see the skip reasons)
        skipped = await verify_publisher(make, max_elements=20, completes=False)
    finally:
        await connector.close()
    assert "rule_1_1_on_next_not_more_than_requested" not in skipped
    assert "rule_3_9_non_positive_request_from_on_next" not in skipped
    assert "rule_3_13_cancel_drops_the_subscriber" not in skipped
