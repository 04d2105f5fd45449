"""Acknowledgment strategies, their defaults per shape, and nack propagation back to the source connector."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from openroute.messaging import Acknowledgment, DefinitionError, Message, MessagingApp
from openroute.streams import Subscriber

IN = {"openroute.messaging.incoming.in.connector": "memory"}
OUT_MANUAL = {"openroute.messaging.outgoing.out.connector": "memory",
              "openroute.messaging.outgoing.out.auto-ack": False}


def make_app(**extra: Any) -> MessagingApp:
    return MessagingApp({**IN, **extra}, environ={})


async def settle_all(futures: list[Any]) -> list[Any]:
    return await asyncio.wait_for(asyncio.gather(*futures, return_exceptions=True), 2)


async def test_payload_consumer_post_processing_by_default() -> None:
    app = make_app()
    acked_during_call: list[bool] = []
    futures: list[Any] = []

    @app.incoming("in")
    async def consume(payload: int) -> None:
        acked_during_call.append(futures[payload].done())

    async with app:
        source = app.connector("memory").source("in")
        futures.extend(source.send(i) for i in range(2))
        assert await settle_all(futures) == [None, None]
    assert acked_during_call == [False, False]


async def test_exception_nacks_with_the_same_exception_at_the_source() -> None:
    app = make_app()
    error = ValueError("bad payload")

    @app.incoming("in")
    def consume(payload: int) -> None:
        if payload == 1:
            raise error

    async with app:
        source = app.connector("memory").source("in")
        results = await settle_all([source.send(0), source.send(1), source.send(2)])
    assert results[0] is None and results[1] is error and results[2] is None
    assert source.nacked == [(1, error)] and source.acked == [0, 2]


async def test_failed_coroutine_nacks() -> None:
    app = make_app()

    @app.incoming("in")
    async def consume(payload: int) -> None:
        await asyncio.sleep(0)
        raise KeyError(payload)

    async with app:
        source = app.connector("memory").source("in")
        [result] = await settle_all([source.send(5)])
    assert isinstance(result, KeyError)


async def test_pre_processing_acks_before_the_call_and_ignores_failure() -> None:
    app = make_app()
    futures: list[Any] = []
    acked_during_call: list[bool] = []

    @app.incoming("in", acknowledgment=Acknowledgment.PRE_PROCESSING)
    def consume(payload: int) -> None:
        acked_during_call.append(futures[payload].done())
        raise RuntimeError("too late to nack")

    async with app:
        source = app.connector("memory").source("in")
        futures.append(source.send(0))
        assert await settle_all(futures) == [None]
    assert acked_during_call == [True] and source.nacked == []


async def test_none_never_acks_or_nacks() -> None:
    app = make_app()
    called = asyncio.Event()

    @app.incoming("in", acknowledgment=Acknowledgment.NONE)
    async def consume(payload: int) -> None:
        called.set()
        raise RuntimeError("ignored")

    async with app:
        source = app.connector("memory").source("in")
        future = source.send(1)
        await asyncio.wait_for(called.wait(), 2)
        await asyncio.sleep(0)
        assert not future.done() and source.acked == [] and source.nacked == []


async def test_manual_message_consumer_that_raises_is_nacked() -> None:
    app = make_app()
    error = RuntimeError("crash before ack")

    @app.incoming("in")
    async def consume(message: Message[int]) -> None:
        raise error

    async with app:
        source = app.connector("memory").source("in")
        assert await settle_all([source.send(1)]) == [error]


async def test_post_processing_on_a_message_consumer() -> None:
    app = make_app()

    @app.incoming("in", acknowledgment=Acknowledgment.POST_PROCESSING)
    async def consume(message: Message[int]) -> None:
        pass

    async with app:
        source = app.connector("memory").source("in")
        assert await settle_all([source.send(1)]) == [None]


async def test_consumer_returning_a_value_at_runtime_is_nacked_with_type_error() -> None:
    app = make_app()

    @app.incoming("in")
    def consume(payload):  # type: ignore[no-untyped-def]
        return payload

    async with app:
        source = app.connector("memory").source("in")
        [result] = await settle_all([source.send(1)])
    assert isinstance(result, TypeError)


async def test_processor_post_processing_chains_ack_and_nack_to_the_source() -> None:
    app = make_app(**OUT_MANUAL)

    @app.incoming("in")
    @app.outgoing("out")
    def increment(value: int) -> int:
        return value + 1

    async with app:
        source = app.connector("memory").source("in")
        sink = app.connector("memory").sink("out")
        first, second = source.send(1), source.send(2)
        await sink.wait_for(2)
        assert sink.payloads == [2, 3] and not first.done() and not second.done()
        await sink.received[0].ack()
        error = ConnectionError("downstream refused")
        await sink.received[1].nack(error)
        results = await settle_all([first, second])
    assert results == [None, error]
    assert source.acked == [1] and source.nacked == [(2, error)]


async def test_processor_none_nacks_with_type_error_and_exception_nacks() -> None:
    app = make_app(**OUT_MANUAL)
    boom = ArithmeticError("boom")

    @app.incoming("in")
    @app.outgoing("out")
    async def check(value: int) -> int | None:
        if value == 0:
            return None
        if value == 1:
            raise boom
        return value

    async with app:
        source = app.connector("memory").source("in")
        futures = [source.send(i) for i in range(3)]
        none_result, error_result = await settle_all(futures[:2])
        sink = app.connector("memory").sink("out")
        await sink.wait_for(1)
    assert isinstance(none_result, TypeError) and error_result is boom
    assert sink.payloads == [2]


async def test_processor_pre_processing_acks_on_entry() -> None:
    app = make_app(**OUT_MANUAL)

    @app.incoming("in", acknowledgment=Acknowledgment.PRE_PROCESSING)
    @app.outgoing("out")
    def same(value: int) -> int:
        return value

    async with app:
        source = app.connector("memory").source("in")
        assert await settle_all([source.send(1)]) == [None]
        sink = app.connector("memory").sink("out")
        await sink.wait_for(1)
        assert not sink.received[0].settled


async def test_message_processor_exception_nacks() -> None:
    app = make_app(**OUT_MANUAL)
    error = LookupError("no route")

    @app.incoming("in")
    @app.outgoing("out")
    async def route(message: Message[int]) -> Message[int]:
        raise error

    async with app:
        source = app.connector("memory").source("in")
        assert await settle_all([source.send(1)]) == [error]


async def test_flattening_processor_failure_nacks_under_manual() -> None:
    app = make_app(**OUT_MANUAL)
    error = RuntimeError("generator broke")

    @app.incoming("in")
    @app.outgoing("out")
    async def explode(message: Message[int]):  # type: ignore[no-untyped-def]
        yield message.payload
        raise error

    async with app:
        source = app.connector("memory").source("in")
        assert await settle_all([source.send(1)]) == [error]
        source.send(2)
        assert await app.connector("memory").sink("out").wait_for(2) == [1, 2]  # the channel goes on


@pytest.mark.parametrize(("strategy", "message"), [(Acknowledgment.MANUAL, False),
                                                  (Acknowledgment.POST_PROCESSING, True)])
async def test_unsupported_strategy_is_a_definition_error(strategy: Acknowledgment, message: bool) -> None:
    app = make_app(**OUT_MANUAL)
    if message:
        @app.incoming("in", acknowledgment=strategy)
        @app.outgoing("out")
        def process(m: Message[int]) -> Message[int]:
            return m
    else:
        @app.incoming("in", acknowledgment=strategy)
        @app.outgoing("out")
        def process(value: int) -> int:
            return value
    with pytest.raises(DefinitionError, match=strategy.name):
        await app.start()


class _SeeingSubscriber(Subscriber[Any]):
    """A plain subscriber that records, for each element, whether its message was already acked."""

    def __init__(self, futures: list[Any], key: Any = lambda item: item) -> None:
        self.futures, self.key = futures, key
        self.seen: list[tuple[Any, bool]] = []

    def on_subscribe(self, subscription: Any) -> None:
        subscription.request(100)

    def on_next(self, item: Any) -> None:
        index = self.key(item)
        self.seen.append((index, self.futures[index].done()))

    def on_error(self, error: BaseException) -> None:
        pass

    def on_complete(self) -> None:
        pass


async def test_acknowledgment_5_2_subscriber_builder_of_payloads_is_post_processing_by_default() -> None:
    from openroute import streams as rs

    app = make_app()
    futures: list[Any] = []
    seeing = _SeeingSubscriber(futures)

    @app.incoming("in")
    def consume() -> rs.SubscriberBuilder[int, None]:
        return rs.builder().to(seeing)

    async with app:
        source = app.connector("memory").source("in")
        futures.extend(source.send(i) for i in range(3))
        assert await settle_all(futures) == [None, None, None]
    assert seeing.seen == [(0, False), (1, False), (2, False)]
    assert source.acked == [0, 1, 2]


@pytest.mark.parametrize("strategy", [Acknowledgment.POST_PROCESSING, Acknowledgment.PRE_PROCESSING])
async def test_acknowledgment_5_2_subscriber_of_messages_allows_post_processing(strategy: Acknowledgment) -> None:
    from openroute import streams as rs

    app = make_app()
    futures: list[Any] = []
    seeing = _SeeingSubscriber(futures, key=lambda message: message.payload)

    @app.incoming("in", acknowledgment=strategy)
    def consume() -> rs.Subscriber[Message[int]]:
        return seeing

    async with app:
        source = app.connector("memory").source("in")
        futures.extend(source.send(i) for i in range(2))
        assert await settle_all(futures) == [None, None]
    acked_before = strategy is Acknowledgment.PRE_PROCESSING
    assert seeing.seen == [(0, acked_before), (1, acked_before)]


async def test_acknowledgment_5_2_post_processing_nacks_when_on_next_raises() -> None:
    from openroute import streams as rs

    app = make_app()
    error = ValueError("subscriber broke")

    class Raising(_SeeingSubscriber):
        def on_next(self, item: Any) -> None:
            raise error

    @app.incoming("in", acknowledgment=Acknowledgment.POST_PROCESSING)
    def consume() -> rs.SubscriberBuilder[int, None]:
        return rs.builder().to(Raising([]))

    async with app:
        source = app.connector("memory").source("in")
        [result] = await settle_all([source.send(7)])
    assert result is error and source.nacked == [(7, error)]
