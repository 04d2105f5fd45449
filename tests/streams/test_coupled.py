"""``coupled(subscriber, publisher)``: the spec TCK's CoupledStageVerification scenarios, and the rule checks."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from openroute import streams as rs
from openroute.streams import StreamCancelledError
from openroute.streams.tck import ProbeSubscriber, verify_publisher, verify_subscriber

T = 5.0


def idle_publisher() -> rs.PublisherBuilder[Any]:
    """A publisher that subscribes but never signals (the TCK's idlePublisher)."""
    never: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
    return rs.from_completion_stage(never)


def event_setter(event: asyncio.Event) -> Any:
    return lambda *args: event.set()


async def wait(*events: asyncio.Event) -> None:
    await asyncio.wait_for(asyncio.gather(*(event.wait() for event in events)), T)


async def test_coupled_stage_should_cancel_and_complete_upstream_when_downstream_cancels() -> None:
    subscriber_completed, upstream_cancelled = asyncio.Event(), asyncio.Event()
    runner = idle_publisher().on_terminate(event_setter(upstream_cancelled)).via(
        rs.coupled(rs.builder().on_complete(event_setter(subscriber_completed)).ignore(), idle_publisher())
    ).cancel().run()
    await wait(subscriber_completed, upstream_cancelled)
    await asyncio.wait_for(runner, T)


async def test_coupled_stage_should_cancel_and_complete_upstream_when_publisher_completes() -> None:
    subscriber_completed, upstream_cancelled = asyncio.Event(), asyncio.Event()
    runner = idle_publisher().on_terminate(event_setter(upstream_cancelled)).via(
        rs.coupled(rs.builder().on_complete(event_setter(subscriber_completed)).ignore(), rs.empty())
    ).ignore().run()
    await wait(subscriber_completed, upstream_cancelled)
    assert await asyncio.wait_for(runner, T) is None


async def test_coupled_stage_should_cancel_and_complete_upstream_when_publisher_fails() -> None:
    failures: list[BaseException] = []
    subscriber_failed, upstream_cancelled = asyncio.Event(), asyncio.Event()
    error = RuntimeError("failed")

    def on_error(raised: BaseException) -> None:
        failures.append(raised)
        subscriber_failed.set()

    runner = idle_publisher().on_terminate(event_setter(upstream_cancelled)).via(
        rs.coupled(rs.builder().on_error(on_error).ignore(), rs.failed(error))
    ).ignore().run()
    await wait(subscriber_failed, upstream_cancelled)
    assert failures == [error]
    with pytest.raises(RuntimeError):
        await asyncio.wait_for(runner, T)


async def test_coupled_stage_should_cancel_and_complete_downstream_when_upstream_completes() -> None:
    publisher_cancelled, downstream_completed = asyncio.Event(), asyncio.Event()
    runner = rs.empty().via(
        rs.coupled(rs.builder().ignore(), idle_publisher().on_terminate(event_setter(publisher_cancelled)))
    ).on_complete(event_setter(downstream_completed)).ignore().run()
    await wait(publisher_cancelled, downstream_completed)
    assert await asyncio.wait_for(runner, T) is None


async def test_coupled_stage_should_cancel_and_fail_downstream_when_upstream_fails() -> None:
    publisher_cancelled = asyncio.Event()
    error = RuntimeError("failed")
    runner = rs.failed(error).via(
        rs.coupled(rs.builder().ignore(), idle_publisher().on_terminate(event_setter(publisher_cancelled)))
    ).ignore().run()
    with pytest.raises(RuntimeError) as raised:
        await asyncio.wait_for(runner, T)
    assert raised.value is error
    await wait(publisher_cancelled)


async def test_coupled_stage_should_cancel_and_complete_downstream_when_subscriber_cancels() -> None:
    publisher_cancelled, downstream_completed = asyncio.Event(), asyncio.Event()
    runner = idle_publisher().via(
        rs.coupled(rs.builder().cancel(), idle_publisher().on_terminate(event_setter(publisher_cancelled)))
    ).on_complete(event_setter(downstream_completed)).ignore().run()
    await wait(publisher_cancelled, downstream_completed)
    assert await asyncio.wait_for(runner, T) is None


async def test_coupled_stage_should_be_reusable() -> None:
    coupled = rs.coupled(rs.builder().ignore(), rs.of(1, 2, 3))
    assert await asyncio.wait_for(idle_publisher().via(coupled).to_list().run(), T) == [1, 2, 3]
    assert await asyncio.wait_for(idle_publisher().via(coupled).to_list().run(), T) == [1, 2, 3]


async def test_coupled_stage_passes_the_subscriber_s_input_through_to_its_result() -> None:
    collected = rs.builder().to_list().build()
    out = await asyncio.wait_for(rs.of(1, 2).via(rs.coupled(collected, rs.of("a"))).to_list().run(), T)
    assert out == ["a"]
    # the publisher completed first: the subscriber was completed with what it had received by then
    assert collected.completion.done()


async def test_coupled_stage_as_a_publisher_passes_the_publisher_rules() -> None:
    def make(n: int) -> rs.Publisher[Any]:
        return rs.coupled(rs.builder().ignore(), rs.from_iterable(range(1, n + 1))).build()

    def make_failed() -> rs.Publisher[Any]:
        return rs.coupled(rs.builder().ignore(), rs.failed(RuntimeError("failed"))).build()

    # each publisher gets an upstream that never ends, as in the TCK's StagePublisherVerification
    def subscribed(processor: rs.Processor[Any, Any]) -> rs.Processor[Any, Any]:
        idle_publisher().build().subscribe(processor)
        return processor

    assert await verify_publisher(lambda n: subscribed(make(n)), make_failed_publisher=lambda: subscribed(
        make_failed())) == []


async def test_coupled_stage_as_a_subscriber_passes_the_subscriber_rules() -> None:
    def make() -> rs.Processor[Any, Any]:
        processor = rs.coupled(rs.from_subscriber(ProbeSubscriber(request_on_subscribe=10)), idle_publisher()).build()
        processor.subscribe(ProbeSubscriber(request_on_subscribe=1))
        return processor

    assert await verify_subscriber(make) == []


async def test_coupled_refuses_none() -> None:
    with pytest.raises(TypeError):
        rs.coupled(None, rs.empty())  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        rs.coupled(rs.builder().ignore(), None)  # type: ignore[arg-type]


async def test_a_cancelled_coupled_run_is_a_stream_cancelled_error() -> None:
    runner = idle_publisher().via(rs.coupled(rs.builder().ignore(), idle_publisher())).to_list().run()
    runner.cancel()
    with pytest.raises((asyncio.CancelledError, StreamCancelledError)):
        await runner
