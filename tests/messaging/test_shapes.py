"""Every function shape: producers, consumers, processors, wired through emitters and the memory connector."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from openroute import streams as rs
from openroute.messaging import Message, MessagingApp
from openroute.streams import ProcessorBuilder, PublisherBuilder, SubscriberBuilder

OUT = {"openroute.messaging.outgoing.out.connector": "memory"}
IN = {"openroute.messaging.incoming.in.connector": "memory"}


def app_with(*configs: dict[str, Any]) -> MessagingApp:
    merged: dict[str, Any] = {}
    for config in configs:
        merged.update(config)
    return MessagingApp(merged, environ={})


async def produced(app: MessagingApp, count: int) -> list[Any]:
    """Run ``app`` until its outgoing memory channel 'out' got ``count`` messages; returns their payloads."""
    async with app:
        return await app.connector("memory").sink("out").wait_for(count)


# -- producers -------------------------------------------------------------------------------------------

async def test_async_generator_producer() -> None:
    app = app_with(OUT)

    @app.outgoing("out")
    async def produce() -> AsyncIterator[int]:
        for i in range(3):
            yield i

    assert await produced(app, 3) == [0, 1, 2]


async def test_sync_generator_producer_of_messages() -> None:
    app = app_with(OUT)

    @app.outgoing("out")
    def produce() -> Any:
        yield Message("a")
        yield "b"

    assert await produced(app, 2) == ["a", "b"]


async def test_value_producer_is_called_on_demand() -> None:
    app = app_with(OUT)
    counter = iter(range(1000))

    @app.outgoing("out")
    def produce() -> int:
        return next(counter)

    payloads = await produced(app, 5)
    assert payloads[:5] == [0, 1, 2, 3, 4]


async def test_coroutine_producer_is_called_sequentially() -> None:
    app = app_with(OUT)
    running = 0
    overlaps = 0
    values = iter(range(1000))

    @app.outgoing("out")
    async def produce() -> int:
        nonlocal running, overlaps
        running += 1
        overlaps += running > 1
        await asyncio.sleep(0)
        running -= 1
        return next(values)

    payloads = await produced(app, 5)
    assert payloads[:5] == [0, 1, 2, 3, 4] and overlaps == 0


async def test_producer_returning_a_builder_called_once() -> None:
    app = app_with(OUT)
    calls = 0

    @app.outgoing("out")
    def produce() -> PublisherBuilder[int]:
        nonlocal calls
        calls += 1
        return rs.of(1, 2, 3)

    assert await produced(app, 3) == [1, 2, 3]
    assert calls == 1


async def test_unannotated_producer_returning_a_publisher() -> None:
    app = app_with(OUT)

    @app.outgoing("out")
    def produce():  # type: ignore[no-untyped-def]
        return rs.of("x", "y").build()

    assert await produced(app, 2) == ["x", "y"]


async def test_unannotated_producer_returning_values() -> None:
    app = app_with(OUT)
    values = iter(range(100))

    @app.outgoing("out")
    def produce():  # type: ignore[no-untyped-def]
        return next(values)

    payloads = await produced(app, 3)
    assert payloads[:3] == [0, 1, 2]


# -- consumers ---------------------------------------------------------------------------------------------

async def test_plain_consumer_gets_payloads() -> None:
    app = app_with(IN)
    seen: list[int] = []

    @app.incoming("in")
    def consume(payload: int) -> None:
        seen.append(payload)

    async with app:
        source = app.connector("memory").source("in")
        await asyncio.wait_for(asyncio.gather(*(source.send(i) for i in range(3))), 2)
    assert seen == [0, 1, 2] and source.acked == [0, 1, 2]


async def test_coroutine_consumer_of_messages_acks_manually() -> None:
    app = app_with(IN)
    seen: list[Any] = []

    @app.incoming("in")
    async def consume(message: Message[int]) -> None:
        seen.append(message.payload)
        if message.payload % 2:
            await message.nack(ValueError("odd"))
        else:
            await message.ack()

    async with app:
        source = app.connector("memory").source("in")
        futures = [source.send(i) for i in range(4)]
        results = await asyncio.wait_for(asyncio.gather(*futures, return_exceptions=True), 2)
    assert seen == [0, 1, 2, 3]
    assert results[0] is None and isinstance(results[1], ValueError)
    assert source.acked == [0, 2] and [p for p, _ in source.nacked] == [1, 3]


async def test_consumer_returning_a_subscriber_builder() -> None:
    app = app_with(IN)
    collected: list[list[int]] = []

    @app.incoming("in")
    def consume() -> SubscriberBuilder[int, None]:
        return rs.builder().map(lambda x: x * 10).to(rs.from_subscriber(_ListSubscriber(collected)))

    async with app:
        source = app.connector("memory").source("in")
        await asyncio.wait_for(asyncio.gather(*(source.send(i) for i in range(3))), 2)  # acked after on_next
    assert collected == [[0, 10, 20]]


class _ListSubscriber(rs.Subscriber[Any]):
    def __init__(self, into: list[list[Any]], arrived: asyncio.Event | None = None) -> None:
        self.items: list[Any] = []
        self.arrived = arrived or asyncio.Event()
        into.append(self.items)

    def on_subscribe(self, subscription: rs.Subscription) -> None:
        subscription.request(rs.UNBOUNDED)

    def on_next(self, item: Any) -> None:
        self.items.append(item)
        self.arrived.set()

    def on_error(self, error: BaseException) -> None:
        pass

    def on_complete(self) -> None:
        pass


async def test_consumer_returning_a_message_subscriber() -> None:
    app = app_with(IN)
    collected: list[list[Any]] = []
    arrived = asyncio.Event()

    @app.incoming("in")
    def consume() -> rs.Subscriber[Message[int]]:
        return _ListSubscriber(collected, arrived)

    async with app:
        source = app.connector("memory").source("in")
        future = source.send(7)
        await asyncio.wait_for(arrived.wait(), 2)
        message = collected[0][0]
        assert isinstance(message, Message) and not future.done()  # MANUAL: nothing acked for us
        await message.ack()
        await asyncio.wait_for(future, 1)


# -- processors --------------------------------------------------------------------------------------------

async def test_payload_processor_sync_and_chained_ack() -> None:
    app = app_with(OUT, {"openroute.messaging.outgoing.out.auto-ack": "false"})
    emitter = app.emitter("in")

    @app.incoming("in")
    @app.outgoing("out")
    def upper(text: str) -> str:
        return text.upper()

    async with app:
        future = emitter.send("a")
        sink = app.connector("memory").sink("out")
        await sink.wait_for(1)
        assert sink.payloads == ["A"] and not future.done()  # acked only when the outgoing one is
        await sink.received[0].ack()
        await asyncio.wait_for(future, 1)


async def test_coroutine_processor() -> None:
    app = app_with(OUT)
    emitter = app.emitter("in")

    @app.incoming("in")
    @app.outgoing("out")
    async def double(value: int) -> int:
        await asyncio.sleep(0)
        return value * 2

    async with app:
        await asyncio.wait_for(asyncio.gather(*(emitter.send(i) for i in range(4))), 2)
        assert app.connector("memory").sink("out").payloads == [0, 2, 4, 6]


async def test_message_processor_and_none_forwards_nothing() -> None:
    app = app_with(OUT)
    emitter = app.emitter("in")

    @app.incoming("in")
    @app.outgoing("out")
    def keep_even(message: Message[int]) -> Message[int] | None:
        if message.payload % 2:
            return None
        return message.with_payload(message.payload + 100)

    async with app:
        futures = [emitter.send(i) for i in range(4)]
        sink = app.connector("memory").sink("out")
        await sink.wait_for(2)
        assert sink.payloads == [100, 102]
        await asyncio.wait_for(asyncio.gather(futures[0], futures[2]), 1)
        assert not futures[1].done()  # MANUAL and dropped by the function: nobody acked it


async def test_async_generator_processor_is_flattened_in_order() -> None:
    app = app_with(OUT)
    emitter = app.emitter("in")

    @app.incoming("in")
    @app.outgoing("out")
    async def repeat(value: int) -> AsyncIterator[int]:
        for _ in range(value):
            await asyncio.sleep(0)
            yield value

    async with app:
        for i in (1, 2, 3):
            emitter.send(i)
        assert await app.connector("memory").sink("out").wait_for(6) == [1, 2, 2, 3, 3, 3]


async def test_processor_returning_a_builder_per_item() -> None:
    app = app_with(OUT)
    emitter = app.emitter("in")

    @app.incoming("in")
    @app.outgoing("out")
    def split(text: str) -> PublisherBuilder[str]:
        return rs.from_iterable(text.split())

    async with app:
        emitter.send("a b")
        emitter.send("c")
        assert await app.connector("memory").sink("out").wait_for(3) == ["a", "b", "c"]


async def test_stream_transformer_called_once() -> None:
    app = app_with(OUT)
    emitter = app.emitter("in")
    calls = 0

    @app.incoming("in")
    @app.outgoing("out")
    def transform(stream: PublisherBuilder[int]) -> PublisherBuilder[int]:
        nonlocal calls
        calls += 1
        return stream.filter(lambda x: x > 1).map(lambda x: x * 3)

    async with app:
        futures = [emitter.send(i) for i in range(4)]
        assert await app.connector("memory").sink("out").wait_for(2) == [6, 9]
        await asyncio.wait_for(asyncio.gather(*futures), 1)  # PRE_PROCESSING: acked on entry
    assert calls == 1


async def test_async_iterator_transformer() -> None:
    app = app_with(OUT)
    emitter = app.emitter("in")

    @app.incoming("in")
    @app.outgoing("out")
    async def pairs(stream: AsyncIterator[int]) -> AsyncIterator[tuple[int, int]]:
        previous = None
        async for item in stream:
            if previous is not None:
                yield (previous, item)
            previous = item

    async with app:
        for i in range(3):
            emitter.send(i)
        assert await app.connector("memory").sink("out").wait_for(2) == [(0, 1), (1, 2)]


async def test_processor_returning_a_processor_builder() -> None:
    app = app_with(OUT)
    emitter = app.emitter("in")

    @app.incoming("in")
    @app.outgoing("out")
    def negate() -> ProcessorBuilder[int, int]:
        return rs.builder().map(lambda x: -x)

    async with app:
        emitter.send(1)
        emitter.send(2)
        assert await app.connector("memory").sink("out").wait_for(2) == [-1, -2]


async def test_injected_channel_publisher() -> None:
    app = app_with(IN)
    stream = app.channel("in")
    async with app:
        source = app.connector("memory").source("in")
        future = source.send("hello")
        source.send("world")
        source.complete()
        assert await asyncio.wait_for(stream.builder().to_list().run(), 2) == ["hello", "world"]
        await asyncio.wait_for(future, 1)


async def test_injected_channel_of_messages_and_async_for() -> None:
    app = MessagingApp(environ={})
    emitter = app.emitter("events")
    messages = app.channel("events", messages=True)
    async with app:
        future = emitter.send(1)
        emitter.complete()
        received = [m async for m in messages]
        assert [m.payload for m in received] == [1] and not future.done()
        await received[0].ack()
        await asyncio.wait_for(future, 1)


async def test_injected_channel_before_start_signals_an_error() -> None:
    app = MessagingApp(environ={})
    app.emitter("events")
    stream = app.channel("events")
    result = stream.builder().to_list().run()
    try:
        await asyncio.wait_for(result, 1)
    except RuntimeError as error:
        assert "not running" in str(error)
    else:
        raise AssertionError("subscribing before start must fail")
