"""Application lifecycle: concurrency, counters, independence of apps, start/stop."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from openroute.messaging import Acknowledgment, ChannelClosedError, MessagingApp, OnOverflow


class Gate:
    """Counts calls in flight and lets the test release them."""

    def __init__(self) -> None:
        self.running = 0
        self.peak = 0
        self.release = asyncio.Event()
        self.changed = asyncio.Event()

    async def enter(self) -> None:
        self.running += 1
        self.peak = max(self.peak, self.running)
        self.changed.set()
        await self.release.wait()
        self.running -= 1

    async def until_running(self, count: int) -> None:
        async def wait() -> None:
            while self.running < count:
                self.changed.clear()
                await self.changed.wait()
        await asyncio.wait_for(wait(), 2)


@pytest.mark.parametrize(("config", "declared", "sent", "bound"), [
    ({}, 8, 20, 8),
    ({"openroute.messaging.incoming.processing.concurrency": "3"}, 1, 6, 3),
], ids=["declared", "from-configuration-wins"])
async def test_concurrency_bounds_calls_in_flight(config: dict[str, str], declared: int, sent: int, bound: int) -> None:
    app = MessagingApp(config, environ={})
    emitter = app.emitter("processing", OnOverflow.BUFFER, buffer_size=100)
    gate = Gate()

    @app.incoming("processing", concurrency=declared)
    async def handle(payload: int) -> None:
        await gate.enter()

    async with app:
        futures = [emitter.send(i) for i in range(sent)]
        await gate.until_running(bound)
        await asyncio.sleep(0)  # a turn for any (wrong) further call to start
        assert gate.running == bound
        gate.release.set()
        await asyncio.wait_for(asyncio.gather(*futures), 2)
    assert gate.peak == bound
    assert app.counters() == {"processing": sent}


async def test_default_is_one_call_at_a_time() -> None:
    app = MessagingApp(environ={})
    emitter = app.emitter("in")
    gate = Gate()
    gate.release.set()
    order: list[int] = []

    @app.incoming("in")
    async def handle(payload: int) -> None:
        order.append(payload)
        await gate.enter()
        await asyncio.sleep(0)

    async with app:
        await asyncio.wait_for(asyncio.gather(*(emitter.send(i) for i in range(10))), 2)
    assert gate.peak == 1 and order == list(range(10))




async def test_concurrent_processor_keeps_order() -> None:
    app = MessagingApp({"openroute.messaging.outgoing.out.connector": "memory"}, environ={})
    emitter = app.emitter("in")

    @app.incoming("in", concurrency=4)
    @app.outgoing("out")
    async def slow_first(value: int) -> int:
        for _ in range(10 - value):  # earlier items take more loop turns
            await asyncio.sleep(0)
        return value

    async with app:
        for i in range(10):
            emitter.send(i)
        assert await app.connector("memory").sink("out").wait_for(10) == list(range(10))


async def test_counters_per_channel() -> None:
    app = MessagingApp({"openroute.messaging.outgoing.out.connector": "memory"}, environ={})
    emitter = app.emitter("in")

    @app.incoming("in")
    @app.outgoing("out")
    def keep_even(value: int) -> Any:
        return value if value % 2 == 0 else None

    async with app:
        await asyncio.wait_for(asyncio.gather(*(emitter.send(i) for i in range(6)), return_exceptions=True), 2)
        assert app.counters() == {"in": 6, "out": 3}


async def test_two_apps_are_independent() -> None:
    first, second = MessagingApp(environ={}), MessagingApp(environ={})
    seen: dict[str, list[int]] = {"first": [], "second": []}
    e1, e2 = first.emitter("c"), second.emitter("c")

    @first.incoming("c")
    def one(payload: int) -> None:
        seen["first"].append(payload)

    @second.incoming("c")
    def two(payload: int) -> None:
        seen["second"].append(payload)

    async with first, second:
        await asyncio.wait_for(asyncio.gather(e1.send(1), e2.send(2), e2.send(3)), 2)
    assert seen == {"first": [1], "second": [2, 3]}
    assert first.connector("memory") is not second.connector("memory")


async def test_start_once_and_declare_before_start() -> None:
    app = MessagingApp(environ={})
    app.emitter("c")
    app.channel("c")
    await app.start()
    with pytest.raises(RuntimeError):
        await app.start()
    with pytest.raises(RuntimeError):
        app.emitter("d")
    with pytest.raises(RuntimeError):
        app.incoming("d")(lambda payload: None)
    await app.stop()
    await app.stop()  # idempotent


async def test_stop_drains_the_emitter_buffer() -> None:
    app = MessagingApp(environ={})
    emitter = app.emitter("in")
    seen: list[int] = []

    @app.incoming("in")
    async def handle(payload: int) -> None:
        await asyncio.sleep(0)
        seen.append(payload)

    await app.start()
    futures = [emitter.send(i) for i in range(50)]
    await app.stop()
    assert seen == list(range(50))
    assert all(f.done() and f.exception() is None for f in futures)
    with pytest.raises(ChannelClosedError):
        emitter.send(99)


async def test_stop_cancels_an_endless_producer_and_lets_the_consumer_finish() -> None:
    app = MessagingApp(environ={})
    started = asyncio.Event()
    finished: list[int] = []

    @app.outgoing("ticks")
    async def ticks() -> AsyncIterator[int]:
        n = 0
        while True:
            n += 1
            yield n

    @app.incoming("ticks", acknowledgment=Acknowledgment.NONE)
    async def handle(payload: int) -> None:
        started.set()
        await asyncio.sleep(0)
        finished.append(payload)

    await app.start()
    await asyncio.wait_for(started.wait(), 2)
    await asyncio.wait_for(app.stop(timeout=2), 3)
    count = len(finished)
    assert count >= 1
    await asyncio.sleep(0)
    assert len(finished) == count  # nothing runs after stop


async def test_stop_with_timeout_cancels_stuck_handlers() -> None:
    app = MessagingApp(environ={})
    emitter = app.emitter("in")
    entered = asyncio.Event()

    @app.incoming("in")
    async def stuck(payload: int) -> None:
        entered.set()
        await asyncio.Event().wait()

    await app.start()
    emitter.send(1)
    await asyncio.wait_for(entered.wait(), 2)
    await asyncio.wait_for(app.stop(timeout=0.05), 2)


async def test_emitter_overflow_through_the_app() -> None:
    app = MessagingApp(environ={})
    emitter = app.emitter("in", OnOverflow.BUFFER, buffer_size=2)
    gate = Gate()

    @app.incoming("in")
    async def handle(payload: int) -> None:
        await gate.enter()

    async with app:
        emitter.send(0)
        await gate.until_running(1)
        from openroute.messaging._stages import DEFAULT_PREFETCH

        for i in range(DEFAULT_PREFETCH):  # requested ahead by the consumer (its prefetch), queued there
            emitter.send(1 + i)

        async def handed_over() -> None:  # the emitter delivers on a later loop turn
            while emitter.buffered:
                await asyncio.sleep(0)

        await asyncio.wait_for(handed_over(), 2)
        emitter.send(100)
        emitter.send(101)
        from openroute.messaging import EmitterOverflowError

        with pytest.raises(EmitterOverflowError):
            emitter.send(3)
        gate.release.set()


async def test_stop_drains_through_a_processor() -> None:
    app = MessagingApp(environ={})
    emitter = app.emitter("in")
    seen: list[int] = []

    @app.incoming("in", concurrency=2)
    @app.outgoing("mid")
    async def double(value: int) -> int:
        await asyncio.sleep(0)
        return value * 2

    @app.incoming("mid")
    def collect(value: int) -> None:
        seen.append(value)

    await app.start()
    futures = [emitter.send(i) for i in range(30)]
    await app.stop()
    assert seen == [i * 2 for i in range(30)]
    assert all(f.done() and f.exception() is None for f in futures)


async def test_overflow_none_never_runs_a_function_concurrently() -> None:
    app = MessagingApp(environ={})
    emitter = app.emitter("in", OnOverflow.NONE)
    gate = Gate()
    gate.release.set()

    @app.incoming("in")
    async def handle(payload: int) -> None:
        await gate.enter()
        await asyncio.sleep(0)

    async with app:
        await asyncio.wait_for(asyncio.gather(*(emitter.send(i) for i in range(20))), 2)
    assert gate.peak == 1
