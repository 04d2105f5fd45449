"""Emitter: overflow strategies, acknowledgment futures, thread safety."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading

import pytest

from openroute.messaging import (
    ChannelClosedError,
    Emitter,
    EmitterOverflowError,
    Message,
    MessageDroppedError,
    MessagingApp,
    OnOverflow,
)
from tests.messaging.helpers import Collector


async def test_send_completes_on_ack_and_fails_on_nack() -> None:
    emitter: Emitter[int] = Emitter("c")
    collector = Collector(initial=2)
    emitter.subscribe(collector)
    acked, nacked = emitter.send(1), emitter.send(2)
    await collector.wait_for(2)
    await collector.items[0].ack()
    error = RuntimeError("rejected")
    await collector.items[1].nack(error)
    assert await asyncio.wait_for(acked, 1) is None
    with pytest.raises(RuntimeError) as raised:
        await asyncio.wait_for(nacked, 1)
    assert raised.value is error


async def test_send_of_a_message_chains_its_own_ack() -> None:
    emitter: Emitter[int] = Emitter("c")
    collector = Collector(initial=1)
    emitter.subscribe(collector)
    seen: list[str] = []
    future = emitter.send(Message(5, ack=lambda: seen.append("original")))
    await collector.wait_for(1)
    assert collector.items[0].payload == 5
    await collector.items[0].ack()
    await asyncio.wait_for(future, 1)
    assert seen == ["original"]


async def test_send_message_delivers_the_message_itself_and_returns_nothing() -> None:
    """The spec's void send(Message): the very message goes downstream, its own callbacks are the outcome."""
    emitter: Emitter[int] = Emitter("c")
    collector = Collector(initial=2)
    emitter.subscribe(collector)
    seen: list[object] = []
    first = Message(5, ack=lambda: seen.append("acked"))
    second = Message(6, nack=seen.append)
    assert emitter.send_message(first) is None
    emitter.send_message(second)
    await collector.wait_for(2)
    assert collector.items == [first, second]
    await collector.items[0].ack()
    error = RuntimeError("rejected")
    await collector.items[1].nack(error)
    assert seen == ["acked", error]


async def test_send_message_keeps_the_overflow_rules_and_takes_only_messages() -> None:
    emitter: Emitter[int] = Emitter("c", OnOverflow.THROW_EXCEPTION)
    emitter.subscribe(Collector(initial=0))
    with pytest.raises(EmitterOverflowError):
        emitter.send_message(Message(1))
    with pytest.raises(TypeError):
        emitter.send_message(1)  # type: ignore[arg-type]
    emitter.complete()
    with pytest.raises(ChannelClosedError):
        emitter.send_message(Message(2))


async def test_send_none_is_a_value_error() -> None:
    with pytest.raises(ValueError):
        Emitter("c").send(None)


def test_bad_construction_arguments() -> None:
    with pytest.raises(ValueError):
        Emitter("c", OnOverflow.BUFFER, 0)
    with pytest.raises(TypeError):
        Emitter("c", "buffer")  # type: ignore[arg-type]


async def test_buffer_refuses_the_message_beyond_its_size() -> None:
    emitter: Emitter[int] = Emitter("c", OnOverflow.BUFFER, buffer_size=3)
    for i in range(3):
        emitter.send(i)
    with pytest.raises(EmitterOverflowError, match="buffer of 3"):
        emitter.send(3)
    collector = Collector(initial=2)
    emitter.subscribe(collector)
    await collector.wait_for(2)
    emitter.send(3)  # two left the buffer: room again
    emitter.send(4)
    with pytest.raises(EmitterOverflowError):
        emitter.send(5)
    collector.request(10)
    await collector.wait_for(5)
    assert collector.payloads == [0, 1, 2, 3, 4]


async def test_default_buffer_size_is_128_and_configurable() -> None:
    assert MessagingApp(environ={}).emitter("a").buffer_size == 128
    app = MessagingApp({"openroute.messaging.emitter.default-buffer-size": "7"}, environ={})
    assert app.emitter("b").buffer_size == 7
    assert app.emitter("c", buffer_size=3).buffer_size == 3


async def test_unbounded_buffer_keeps_everything() -> None:
    emitter: Emitter[int] = Emitter("c", OnOverflow.UNBOUNDED_BUFFER, buffer_size=1)
    for i in range(1000):
        emitter.send(i)
    collector = Collector(initial=2000)
    emitter.subscribe(collector)
    await collector.wait_for(1000)
    assert collector.payloads == list(range(1000))


async def test_throw_exception_without_demand() -> None:
    emitter: Emitter[int] = Emitter("c", OnOverflow.THROW_EXCEPTION)
    with pytest.raises(EmitterOverflowError, match="no downstream demand"):
        emitter.send(1)
    collector = Collector(initial=1)
    emitter.subscribe(collector)
    assert emitter.has_requests()
    emitter.send(1)
    with pytest.raises(EmitterOverflowError):
        emitter.send(2)
    await collector.wait_for(1)
    assert collector.payloads == [1]


async def test_drop_fails_the_future_of_dropped_messages() -> None:
    emitter: Emitter[int] = Emitter("c", OnOverflow.DROP)
    collector = Collector(initial=1)
    emitter.subscribe(collector)
    kept = emitter.send(1)
    dropped = emitter.send(2)
    with pytest.raises(MessageDroppedError):
        await asyncio.wait_for(dropped, 1)
    await collector.wait_for(1)
    await collector.items[0].ack()
    await asyncio.wait_for(kept, 1)
    assert collector.payloads == [1]


async def test_fail_errors_the_stream_and_raises() -> None:
    emitter: Emitter[int] = Emitter("c", OnOverflow.FAIL)
    collector = Collector(initial=1)
    emitter.subscribe(collector)
    emitter.send(1)
    with pytest.raises(EmitterOverflowError):
        emitter.send(2)
    await collector.wait_terminated()
    assert collector.payloads == [1] and isinstance(collector.error, EmitterOverflowError)
    with pytest.raises(ChannelClosedError):
        emitter.send(3)


async def test_latest_keeps_only_the_newest_unrequested_message() -> None:
    emitter: Emitter[int] = Emitter("c", OnOverflow.LATEST)
    futures = [emitter.send(i) for i in range(5)]
    collector = Collector(initial=10)
    emitter.subscribe(collector)
    await collector.wait_for(1)
    assert collector.payloads == [4]
    for future in futures[:4]:
        with pytest.raises(MessageDroppedError):
            await asyncio.wait_for(future, 1)


async def test_none_ignores_demand() -> None:
    emitter: Emitter[int] = Emitter("c", OnOverflow.NONE)
    collector = Collector(initial=1)
    emitter.subscribe(collector)
    for i in range(5):
        emitter.send(i)
    await collector.wait_for(5)
    assert collector.payloads == [0, 1, 2, 3, 4]


async def test_complete_delivers_the_buffer_first_then_refuses_sends() -> None:
    emitter: Emitter[int] = Emitter("c")
    emitter.send(1)
    emitter.complete()
    with pytest.raises(ChannelClosedError, match="completed"):
        emitter.send(2)
    collector = Collector(initial=5)
    emitter.subscribe(collector)
    await collector.wait_terminated()
    assert collector.payloads == [1] and collector.completed


async def test_error_fails_downstream_and_nacks_buffered() -> None:
    emitter: Emitter[int] = Emitter("c")
    pending = emitter.send(1)
    boom = RuntimeError("boom")
    emitter.error(boom)
    collector = Collector()
    emitter.subscribe(collector)
    await collector.wait_terminated()
    assert collector.error is boom
    with pytest.raises(RuntimeError):
        await asyncio.wait_for(pending, 1)


async def test_cancel_nacks_buffered_and_refuses_sends() -> None:
    emitter: Emitter[int] = Emitter("c")
    collector = Collector()
    emitter.subscribe(collector)
    pending = emitter.send(1)
    collector.subscription.cancel()  # type: ignore[union-attr]
    assert emitter.is_cancelled()
    with pytest.raises(ChannelClosedError):
        await asyncio.wait_for(pending, 1)
    with pytest.raises(ChannelClosedError, match="cancelled"):
        emitter.send(2)


async def test_send_from_another_thread_returns_a_concurrent_future() -> None:
    emitter: Emitter[int] = Emitter("c", OnOverflow.UNBOUNDED_BUFFER)
    collector = Collector(initial=100)
    emitter.subscribe(collector)
    results: list[concurrent.futures.Future[None]] = []

    def produce() -> None:
        for i in range(50):
            results.append(emitter.send(i))  # type: ignore[arg-type]

    thread = threading.Thread(target=produce)
    thread.start()
    await asyncio.to_thread(thread.join)
    await collector.wait_for(50)
    assert sorted(collector.payloads) == list(range(50))
    assert all(isinstance(f, concurrent.futures.Future) for f in results)
    for item in collector.items:
        await item.ack()
    await asyncio.wait_for(asyncio.wrap_future(results[-1]), 1)


async def test_overflow_raised_synchronously_in_the_sending_thread() -> None:
    emitter: Emitter[int] = Emitter("c", OnOverflow.THROW_EXCEPTION)
    errors: list[BaseException] = []

    def produce() -> None:
        try:
            emitter.send(1)
        except EmitterOverflowError as error:
            errors.append(error)

    await asyncio.to_thread(produce)
    assert len(errors) == 1


async def test_second_subscriber_gets_an_error() -> None:
    emitter: Emitter[int] = Emitter("c")
    emitter.subscribe(Collector())
    second = Collector()
    emitter.subscribe(second)
    assert isinstance(second.error, RuntimeError)


async def test_emitter_3_x_is_cancelled_after_complete() -> None:
    emitter: Emitter[int] = Emitter("c")
    collector = Collector(initial=5)
    emitter.subscribe(collector)
    assert emitter.has_requests() and not emitter.is_cancelled()
    emitter.complete()
    assert emitter.is_cancelled() and not emitter.has_requests()
    await collector.wait_terminated()
    assert collector.completed


async def test_emitter_3_x_is_cancelled_after_error() -> None:
    emitter: Emitter[int] = Emitter("c")
    collector = Collector(initial=5)
    emitter.subscribe(collector)
    failure = RuntimeError("boom")
    emitter.error(failure)
    assert emitter.is_cancelled() and not emitter.has_requests()
    await collector.wait_terminated()
    assert collector.error is failure


async def test_latest_overflow_strategy_test_normal() -> None:
    """The TCK's LatestOverflowStrategyTest: 1, 2, 3 through a stream processor reach a consumer in full."""
    from openroute.messaging import MessagingApp
    from openroute.streams import PublisherBuilder

    app = MessagingApp({}, environ={})
    emitter = app.emitter("hello", OnOverflow.LATEST)
    output: list[str] = []
    done = asyncio.Event()

    @app.incoming("hello")
    @app.outgoing("out")
    def consume(values: PublisherBuilder[str]) -> PublisherBuilder[str]:
        return values

    @app.incoming("out")
    def out(value: str) -> None:
        output.append(value)
        if len(output) == 3:
            done.set()

    async with app:
        for value in ("1", "2", "3"):
            emitter.send(value)
        emitter.complete()
        await asyncio.wait_for(done.wait(), 5)
    assert output == ["1", "2", "3"]


async def _latest_through_a_slow_processor(count: int) -> tuple[list[str], list[asyncio.Future[None]]]:
    """``count`` payloads sent at once through a LATEST emitter to an ``@incoming @outgoing`` method that is
    busy with the first one until every send has been made (the TCK's 1 s per item, held by an event here)."""
    app = MessagingApp({}, environ={})
    emitter = app.emitter("hello", OnOverflow.LATEST)
    busy, release = asyncio.Event(), asyncio.Event()
    output: list[str] = []
    done = asyncio.Event()

    @app.incoming("hello")
    @app.outgoing("out")
    async def slow(value: str) -> str:
        busy.set()
        await release.wait()
        return value

    @app.incoming("out")
    def out(value: str) -> None:
        output.append(value)
        if value == str(count):
            done.set()

    async with app:
        futures = [emitter.send("1")]
        await asyncio.wait_for(busy.wait(), 2)
        futures += [emitter.send(str(i)) for i in range(2, count + 1)]
        release.set()
        await asyncio.wait_for(done.wait(), 5)
        await asyncio.wait_for(asyncio.gather(*futures, return_exceptions=True), 5)
    return output, futures


async def test_mp_emitter_latest_keeps_what_the_slow_method_requested() -> None:
    """MicroProfile Reactive Messaging, Emitter ``OnOverflow.Strategy.LATEST`` (SmallRye's
    ``onOverflow().dropPreviousItems()``): only items that outrun the downstream's demand are dropped. A busy
    incoming method has requested its prefetch, so three items sent at once all arrive."""
    output, futures = await _latest_through_a_slow_processor(3)
    assert output == ["1", "2", "3"]
    assert all(future.exception() is None for future in futures)


async def test_mp_emitter_latest_flood_drops_most_and_keeps_the_latest() -> None:
    """The TCK's overflow case: 999 items sent while the method is busy; those beyond its demand are replaced by
    the latest (their futures fail with ``MessageDroppedError``), and the last one always arrives."""
    output, futures = await _latest_through_a_slow_processor(999)
    assert len(output) < 100 and output[0] == "1" and output[-1] == "999"
    dropped = [future for future in futures if isinstance(future.exception(), MessageDroppedError)]
    assert len(dropped) == 999 - len(output)
