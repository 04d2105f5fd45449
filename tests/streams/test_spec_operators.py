"""The Reactive Streams Operators factories and terminals the spec names: of_nullable, from_completion_stage(_nullable),
collect with a Collector (finisher), reduce with a None identity. Test names follow the spec's TCK scenarios."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from openroute import streams as rs
from openroute.streams import StreamCancelledError, Subscriber, Subscription

T = 5.0


async def result(runner: rs.CompletionRunner[Any]) -> Any:
    return await asyncio.wait_for(runner.run(), T)


async def test_of_nullable_stage_should_return_empty_for_null() -> None:
    assert await result(rs.of_nullable(None).to_list()) == []


async def test_of_nullable_stage_should_return_single_value() -> None:
    assert await result(rs.of_nullable("foo").to_list()) == ["foo"]


async def test_from_completion_stage_should_emit_a_future_s_value() -> None:
    future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    runner = rs.from_completion_stage(future).to_list().run()
    future.set_result(10)
    assert await asyncio.wait_for(runner, T) == [10]


async def test_from_completion_stage_should_await_a_coroutine() -> None:
    async def compute() -> str:
        await asyncio.sleep(0)
        return "done"

    assert await result(rs.from_completion_stage(compute()).map(str.upper).to_list()) == ["DONE"]


async def test_from_completion_stage_should_fail_with_the_future_s_exception() -> None:
    future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    error = KeyError("missing")
    future.set_exception(error)
    with pytest.raises(KeyError) as raised:
        await result(rs.from_completion_stage(future).to_list())
    assert raised.value is error


async def test_from_completion_stage_should_fail_on_null() -> None:
    future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    future.set_result(None)
    with pytest.raises(TypeError, match="result was None"):
        await result(rs.from_completion_stage(future).to_list())


async def test_from_completion_stage_nullable_should_be_empty_on_null() -> None:
    future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    future.set_result(None)
    assert await result(rs.from_completion_stage_nullable(future).to_list()) == []


async def test_from_completion_stage_nullable_should_emit_a_value() -> None:
    future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    future.set_result(3)
    assert await result(rs.from_completion_stage_nullable(future).to_list()) == [3]


async def test_from_completion_stage_should_fail_when_the_future_is_cancelled() -> None:
    future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    runner = rs.from_completion_stage(future).to_list().run()
    future.cancel()
    with pytest.raises(StreamCancelledError):
        await asyncio.wait_for(runner, T)


async def test_from_completion_stage_serves_every_subscriber_of_a_future() -> None:
    future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    future.set_result(7)
    publisher = rs.from_completion_stage(future)
    assert await result(publisher.to_list()) == [7]
    assert await result(publisher.to_list()) == [7]


@pytest.mark.parametrize("bad", [None, 42, "text"])
def test_from_completion_stage_refuses_what_cannot_be_awaited(bad: Any) -> None:
    for factory in (rs.from_completion_stage, rs.from_completion_stage_nullable):
        with pytest.raises(TypeError):
            factory(bad)


async def test_collect_stage_should_apply_the_collector_s_finisher() -> None:
    collector = rs.Collector(list, list.append, lambda items: ",".join(map(str, items)))
    assert await result(rs.of(1, 2, 3).collect(collector)) == "1,2,3"


async def test_collect_stage_with_a_collector_without_finisher_gives_the_container() -> None:
    assert await result(rs.of(1, 2, 1).collect(rs.Collector(set, set.add))) == {1, 2}


async def test_collect_stage_should_propagate_errors_from_the_finisher() -> None:
    error = ValueError("finisher failed")

    def finish(items: list[int]) -> Any:
        raise error

    with pytest.raises(ValueError) as raised:
        await result(rs.of(1).collect(rs.Collector(list, list.append, finish)))
    assert raised.value is error


async def test_collect_stage_with_a_collector_in_a_subscriber_builder() -> None:
    subscriber = rs.builder().map(lambda x: x * 2).collect(rs.Collector(list, list.append, sum)).build()
    rs.of(1, 2, 3).build().subscribe(subscriber)
    assert await asyncio.wait_for(subscriber.completion, T) == 12


def test_collector_refuses_bad_parts_and_mixed_arguments() -> None:
    with pytest.raises(TypeError, match="supplier"):
        rs.Collector(None, list.append)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="finisher"):
        rs.Collector(list, list.append, 3)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="not both"):
        rs.of(1).collect(rs.Collector(list, list.append), list.append)  # type: ignore[arg-type]


async def test_reduce_stage_should_allow_a_null_identity() -> None:
    def add(total: int | None, item: int) -> int:
        return item if total is None else total + item

    assert await result(rs.of(1, 2, 3).reduce(add, None)) == 6
    assert await result(rs.empty().reduce(add, None)) is None


class _NoDemand(Subscriber[Any]):
    """Records the signals and never requests."""

    def __init__(self) -> None:
        self.signals: list[str] = []
        self.error: BaseException | None = None
        self.terminated = asyncio.Event()

    def on_subscribe(self, subscription: Subscription) -> None:
        self.signals.append("on_subscribe")

    def on_next(self, item: Any) -> None:
        self.signals.append("on_next")

    def on_error(self, error: BaseException) -> None:
        self.signals.append("on_error")
        self.error = error
        self.terminated.set()

    def on_complete(self) -> None:
        self.signals.append("on_complete")
        self.terminated.set()


async def test_rule_1_4_1_9_from_completion_stage_already_failed_signals_on_error_without_demand() -> None:
    """Rules 1.4 and 1.9: a failed future is signalled by on_error right after on_subscribe, without request(n)."""
    future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    failure = RuntimeError("failed before the subscription")
    future.set_exception(failure)
    subscriber = _NoDemand()
    rs.from_completion_stage(future).build().subscribe(subscriber)
    await asyncio.wait_for(subscriber.terminated.wait(), T)
    assert subscriber.signals == ["on_subscribe", "on_error"] and subscriber.error is failure


async def test_rule_1_4_from_completion_stage_failing_later_is_signalled_without_demand() -> None:
    """Rule 1.4: a future that fails after the subscription is signalled too, though nothing was requested."""
    future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    subscriber = _NoDemand()
    rs.from_completion_stage_nullable(future).build().subscribe(subscriber)
    await asyncio.sleep(0)
    assert subscriber.signals == ["on_subscribe"]
    failure = RuntimeError("failed later")
    future.set_exception(failure)
    await asyncio.wait_for(subscriber.terminated.wait(), T)
    assert subscriber.signals == ["on_subscribe", "on_error"] and subscriber.error is failure


async def test_rule_1_1_from_completion_stage_value_waits_for_demand() -> None:
    """Rule 1.1: the future's value is not signalled before it is requested (only failures are)."""
    future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    future.set_result(7)
    subscriber = _NoDemand()
    rs.from_completion_stage(future).build().subscribe(subscriber)
    for _ in range(3):
        await asyncio.sleep(0)
    assert subscriber.signals == ["on_subscribe"]
