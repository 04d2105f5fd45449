"""Behaviour of every factory, stage and terminal of the operators API, including errors and cleanup."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest

from openroute import streams as rs
from openroute.streams import StreamCancelledError, Subscriber, Subscription
from openroute.streams import stages as st
from openroute.streams.tck import ProbeSubscriber

T = 5  # seconds: upper bound of every wait


async def result(runner: rs.CompletionRunner[Any]) -> Any:
    return await asyncio.wait_for(runner.run(), T)


async def eventually(condition: Callable[[], bool]) -> None:
    """Let the loop run until ``condition()`` holds, at most T seconds."""

    async def poll() -> None:
        while not condition():
            await asyncio.sleep(0)  # one loop turn: the awaited work is scheduled on this loop

    await asyncio.wait_for(poll(), T)


class Tracked:
    """An iterable whose iterators record how far they got and whether they were closed (cleanup probe)."""

    def __init__(self, n: int | None = None) -> None:
        self.n = n
        self.started = 0
        self.closed = 0
        self.pulled = 0

    def __iter__(self) -> Iterator[int]:
        self.started += 1
        try:
            for i in itertools.count(1) if self.n is None else range(1, self.n + 1):
                self.pulled += 1
                yield i
        finally:
            self.closed += 1


class RecordingPublisher(rs.Publisher[int]):
    """Wraps a builder and records subscribe / request / cancel calls."""

    def __init__(self, builder: rs.PublisherBuilder[int], log: list[str], name: str) -> None:
        self._builder, self._log, self._name = builder, log, name

    def subscribe(self, subscriber: Subscriber[int]) -> None:
        self._log.append(f"{self._name}:subscribe")
        self._builder.build().subscribe(_Recorder(subscriber, self._log, self._name))


class _Recorder(Subscriber[int], Subscription):
    """Sits between a built publisher and its subscriber, passing every signal on and logging cancel and complete."""

    def __init__(self, subscriber: Subscriber[int], log: list[str], name: str) -> None:
        self._subscriber, self._log, self._name = subscriber, log, name
        self._upstream: Subscription | None = None

    def on_subscribe(self, subscription: Subscription) -> None:
        self._upstream = subscription
        self._subscriber.on_subscribe(self)

    def request(self, n: int) -> None:
        assert self._upstream is not None
        self._upstream.request(n)

    def cancel(self) -> None:
        assert self._upstream is not None
        self._log.append(f"{self._name}:cancel")
        self._upstream.cancel()

    def on_next(self, item: int) -> None:
        self._subscriber.on_next(item)

    def on_error(self, error: BaseException) -> None:
        self._subscriber.on_error(error)

    def on_complete(self) -> None:
        self._log.append(f"{self._name}:complete")
        self._subscriber.on_complete()


# --- factories -----------------------------------------------------------------------------------------------


async def test_of_and_from_iterable() -> None:
    assert await result(rs.of(1, 2, 3).to_list()) == [1, 2, 3]
    assert await result(rs.of().to_list()) == []
    assert await result(rs.from_iterable("abc").to_list()) == ["a", "b", "c"]


async def test_from_iterable_iterates_once_per_run() -> None:
    source = Tracked(3)
    builder = rs.from_iterable(source).to_list()
    assert await result(builder) == [1, 2, 3]
    assert await result(builder) == [1, 2, 3]
    assert source.started == 2


async def test_from_async_iterable() -> None:
    async def letters() -> AsyncIterator[str]:
        for letter in "xyz":
            await asyncio.sleep(0)
            yield letter

    assert await result(rs.from_async_iterable(letters()).map(str.upper).to_list()) == ["X", "Y", "Z"]


async def test_from_publisher_and_empty_and_failed_same_object() -> None:
    assert await result(rs.from_publisher(rs.of(4, 5).build()).to_list()) == [4, 5]
    assert await result(rs.empty().to_list()) == []
    error = KeyError("k")
    with pytest.raises(KeyError) as caught:
        await result(rs.failed(error).to_list())
    assert caught.value is error


async def test_generate_and_iterate_are_infinite_until_limited() -> None:
    counter = itertools.count(10)
    assert await result(rs.generate(lambda: next(counter)).limit(3).to_list()) == [10, 11, 12]
    assert await result(rs.iterate(1, lambda x: x * 2).take_while(lambda x: x < 20).to_list()) == [1, 2, 4, 8, 16]


async def test_concat_runs_second_after_first() -> None:
    log: list[str] = []
    first = RecordingPublisher(rs.of(1, 2), log, "a")
    second = RecordingPublisher(rs.of(3), log, "b")
    assert await result(rs.concat(first, second).to_list()) == [1, 2, 3]
    assert log == ["a:subscribe", "a:complete", "b:subscribe", "b:complete"]


async def test_concat_cancel_releases_the_second_source_that_never_started() -> None:
    log: list[str] = []
    second_source = Tracked(5)
    second = RecordingPublisher(rs.from_iterable(second_source), log, "b")
    assert await result(rs.concat(rs.iterate(1, lambda x: x + 1), second).limit(2).to_list()) == [1, 2]
    assert log == ["b:subscribe", "b:cancel"]
    assert second_source.pulled == 0


async def test_concat_failure_of_first_releases_second() -> None:
    log: list[str] = []
    second = RecordingPublisher(rs.of(3), log, "b")
    with pytest.raises(ZeroDivisionError):
        await result(rs.concat(rs.of(1).map(lambda x: x / 0), second).to_list())
    assert log == ["b:subscribe", "b:cancel"]


# --- stages --------------------------------------------------------------------------------------------------


async def test_map_filter_peek() -> None:
    peeked: list[int] = []
    runner = rs.of(1, 2, 3, 4).map(lambda x: x * 10).filter(lambda x: x != 20).peek(peeked.append).to_list()
    assert await result(runner) == [10, 30, 40]
    assert peeked == [10, 30, 40]


async def test_flat_map_subscribes_inner_publishers_one_at_a_time_in_order() -> None:
    log: list[str] = []

    def inner(x: int) -> RecordingPublisher:
        return RecordingPublisher(rs.of(x, x * 10), log, f"inner{x}")

    assert await result(rs.of(1, 2).flat_map(inner).to_list()) == [1, 10, 2, 20]
    assert log == ["inner1:subscribe", "inner1:complete", "inner2:subscribe", "inner2:complete"]


async def test_flat_map_accepts_builders_and_publishers_and_async_inners() -> None:
    async def twice(x: int) -> AsyncIterator[int]:
        for item in (x, x):
            await asyncio.sleep(0)
            yield item

    runner = rs.of(1, 2).flat_map(lambda x: rs.from_async_iterable(twice(x))).flat_map(lambda x: rs.of(x).build())
    assert await result(runner.to_list()) == [1, 1, 2, 2]


async def test_flat_map_async_keeps_order_and_runs_one_at_a_time() -> None:
    loop = asyncio.get_running_loop()
    futures: dict[int, asyncio.Future[str]] = {}
    calls: list[int] = []

    def start(x: int) -> asyncio.Future[str]:
        calls.append(x)
        futures[x] = loop.create_future()
        return futures[x]

    completion = rs.of(1, 2).flat_map_async(start).to_list().run()
    assert calls == [1]  # the source is synchronous: only one-at-a-time keeps the second item waiting
    futures[1].set_result("one")
    await eventually(lambda: 2 in futures)
    futures[2].set_result("two")
    assert await asyncio.wait_for(completion, T) == ["one", "two"]


async def test_flat_map_iterable() -> None:
    assert await result(rs.of(1, 2, 3).flat_map_iterable(lambda x: [x] * x).to_list()) == [1, 2, 2, 3, 3, 3]
    assert await result(rs.of(1, 2).flat_map_iterable(lambda x: []).to_list()) == []


async def test_limit_skip_take_while_drop_while_distinct() -> None:
    assert await result(rs.of(1, 2, 3).limit(2).to_list()) == [1, 2]
    assert await result(rs.of(1, 2, 3).skip(2).to_list()) == [3]
    assert await result(rs.of(1, 2, 3, 1).take_while(lambda x: x < 3).to_list()) == [1, 2]
    assert await result(rs.of(1, 2, 3, 1).drop_while(lambda x: x < 3).to_list()) == [3, 1]
    assert await result(rs.of(1, 2, 1, 3, 2).distinct().to_list()) == [1, 2, 3]


async def test_limit_never_requests_more_than_it_needs_and_closes_the_source() -> None:
    source = Tracked()
    assert await result(rs.from_iterable(source).limit(3).to_list()) == [1, 2, 3]
    assert source.pulled == 3
    assert source.closed == 1


async def test_limit_zero_completes_without_pulling() -> None:
    source = Tracked(5)
    assert await result(rs.from_iterable(source).limit(0).to_list()) == []
    assert source.pulled == 0


async def test_take_while_cancels_upstream() -> None:
    source = Tracked()
    assert await result(rs.from_iterable(source).take_while(lambda x: x < 4).to_list()) == [1, 2, 3]
    assert source.closed == 1


async def test_distinct_with_unhashable_item_fails_the_stream() -> None:
    with pytest.raises(TypeError):
        await result(rs.of([1], [1]).distinct().to_list())


async def test_on_error_sees_the_error_which_goes_on() -> None:
    seen: list[BaseException] = []
    error = RuntimeError("x")
    with pytest.raises(RuntimeError) as caught:
        await result(rs.failed(error).on_error(seen.append).to_list())
    assert caught.value is error
    assert seen == [error]


async def test_on_error_resume_and_resume_with() -> None:
    failing = rs.concat(rs.of(1), rs.failed(RuntimeError("x")))
    assert await result(failing.on_error_resume(lambda e: str(e)).to_list()) == [1, "x"]
    assert await result(failing.on_error_resume_with(lambda e: rs.of(7, 8)).to_list()) == [1, 7, 8]
    assert await result(rs.of(1, 2).on_error_resume(lambda e: 0).to_list()) == [1, 2]


async def test_on_error_resume_waits_for_demand() -> None:
    probe = ProbeSubscriber()
    rs.failed(RuntimeError("x")).on_error_resume(lambda e: "fallback").build().subscribe(probe)
    assert probe.items == [] and not probe.terminated
    probe.request(1)
    assert probe.items == ["fallback"] and probe.completed
    probe.check()


async def test_on_complete_and_on_terminate() -> None:
    log: list[str] = []
    runner = rs.of(1).on_complete(lambda: log.append("complete")).on_terminate(lambda: log.append("terminate"))
    assert await result(runner.to_list()) == [1]
    assert log == ["complete", "terminate"]
    log.clear()
    with pytest.raises(RuntimeError):
        await result(rs.failed(RuntimeError()).on_complete(lambda: log.append("complete"))
                     .on_terminate(lambda: log.append("terminate")).to_list())
    assert log == ["terminate"]


async def test_on_terminate_runs_on_cancel() -> None:
    log: list[str] = []
    assert await result(rs.iterate(1, lambda x: x + 1).on_terminate(lambda: log.append("t")).limit(2).to_list()) == [
        1,
        2,
    ]
    assert log == ["t"]


async def test_failing_hooks_fail_the_stream() -> None:
    error = RuntimeError("hook")

    def hook() -> None:
        raise error

    with pytest.raises(RuntimeError) as caught:
        await result(rs.of(1).on_complete(hook).to_list())
    assert caught.value is error


async def test_via_processor_builder_inlines_stages_and_via_processor() -> None:
    runner = rs.of(1, 2).via(rs.builder().map(lambda x: x + 1).filter(lambda x: x > 2))
    assert [type(s) for s in runner.stages] == [st.Of, st.Map, st.Filter]
    assert await result(runner.to_list()) == [3]
    processor = rs.builder().map(lambda x: -x).build()
    assert await result(rs.of(1, 2).via(processor).to_list()) == [-1, -2]
    assert await result(rs.of(1, 2).via(rs.from_processor(rs.builder().limit(1).build())).to_list()) == [1]


async def test_processor_builder_terminals_make_subscriber_builders() -> None:
    subscriber = rs.builder().map(lambda x: x * 2).reduce(lambda a, b: a + b).build()
    rs.of(1, 2, 3).build().subscribe(subscriber)
    assert await asyncio.wait_for(subscriber.completion, T) == 12


async def test_processor_is_unicast() -> None:
    processor = rs.builder().build()
    processor.subscribe(ProbeSubscriber())
    second = ProbeSubscriber()
    processor.subscribe(second)
    assert isinstance(second.error, RuntimeError)


# --- terminals -----------------------------------------------------------------------------------------------


async def test_collect_reduce_find_first_for_each_ignore_cancel() -> None:
    assert await result(rs.of(1, 2).collect(set, set.add)) == {1, 2}
    assert await result(rs.of(1, 2, 3).reduce(lambda a, b: a + b)) == 6
    assert await result(rs.of(1, 2, 3).reduce(lambda a, b: a + b, 10)) == 16
    assert await result(rs.empty().reduce(lambda a, b: a + b)) is None
    assert await result(rs.empty().reduce(lambda a, b: a + b, 0)) == 0
    assert await result(rs.of(5, 6).find_first()) == 5
    assert await result(rs.empty().find_first()) is None
    seen: list[int] = []
    assert await result(rs.of(1, 2).for_each(seen.append)) is None
    assert seen == [1, 2]
    assert await result(rs.of(1, 2).ignore()) is None
    source = Tracked(3)
    assert await result(rs.from_iterable(source).cancel()) is None
    assert source.pulled == 0


async def test_find_first_cancels_upstream() -> None:
    source = Tracked()
    assert await result(rs.from_iterable(source).find_first()) == 1
    assert source.closed == 1


async def test_runner_is_awaitable_and_reusable() -> None:
    runner = rs.of(1, 2).to_list()
    assert await runner == [1, 2]
    assert await runner == [1, 2]


async def test_to_subscriber_completes_with_none_and_fails_with_the_error() -> None:
    probe = ProbeSubscriber(request_on_subscribe=10)
    assert await result(rs.of(1, 2).to(probe)) is None
    assert probe.items == [1, 2] and probe.completed
    error = RuntimeError("e")
    failing = ProbeSubscriber(request_on_subscribe=10)
    with pytest.raises(RuntimeError) as caught:
        await result(rs.failed(error).to(failing))
    assert caught.value is error and failing.error is error


async def test_subscriber_that_cancels_fails_the_closed_graph_with_stream_cancelled_error() -> None:
    probe = ProbeSubscriber(request_on_subscribe=10, cancel_after=1)
    source = Tracked()
    with pytest.raises(StreamCancelledError):
        await result(rs.from_iterable(source).to(probe))
    assert probe.items == [1]
    assert source.closed == 1
    with pytest.raises(StreamCancelledError):
        await result(rs.of(1).to(rs.from_subscriber(ProbeSubscriber(cancel_after=0, request_on_subscribe=1))))


async def test_cancelling_the_run_future_cleans_up_every_stage() -> None:
    closed = asyncio.Event()
    log: list[str] = []

    async def endless() -> AsyncIterator[int]:
        try:
            for i in itertools.count():
                await asyncio.sleep(0)
                yield i
        finally:
            closed.set()

    inner_log: list[str] = []
    future = (
        rs.from_async_iterable(endless())
        .on_terminate(lambda: log.append("outer"))
        .flat_map(lambda x: RecordingPublisher(rs.of(x), inner_log, "inner"))
        .on_terminate(lambda: log.append("after flat_map"))
        .ignore()
        .run()
    )
    await eventually(lambda: len(inner_log) >= 6)
    future.cancel()
    await asyncio.wait_for(closed.wait(), T)
    assert sorted(log) == ["after flat_map", "outer"]


async def test_cancel_mid_flat_map_cancels_the_inner_publisher() -> None:
    log: list[str] = []
    probe = ProbeSubscriber(request_on_subscribe=1)
    rs.of(1, 2).flat_map(lambda x: RecordingPublisher(rs.of(1, 2, 3), log, "inner")).build().subscribe(probe)
    assert probe.items == [1]
    probe.cancel()
    assert log == ["inner:subscribe", "inner:cancel"]


async def test_async_for_iterates_and_breaking_out_closes_the_source() -> None:
    collected = [x async for x in rs.of(1, 2, 3).map(lambda x: x * 2)]
    assert collected == [2, 4, 6]
    source = Tracked()
    iterator = aiter(rs.from_iterable(source))
    assert await anext(iterator) == 1
    await iterator.aclose()  # what `async for ... break` triggers when the generator is finalized
    assert source.closed == 1


async def test_async_for_raises_the_stream_error() -> None:
    error = RuntimeError("in stream")
    with pytest.raises(RuntimeError) as caught:
        async for _ in rs.concat(rs.of(1), rs.failed(error)):
            pass
    assert caught.value is error


# --- errors --------------------------------------------------------------------------------------------------


async def test_user_exceptions_travel_downstream_never_out_of_build_or_run() -> None:
    error = ValueError("user")

    def boom(*_: Any) -> Any:
        raise error

    runners = [
        rs.of(1).map(boom).to_list(),
        rs.of(1).filter(boom).to_list(),
        rs.of(1).peek(boom).to_list(),
        rs.of(1).take_while(boom).to_list(),
        rs.of(1).drop_while(boom).to_list(),
        rs.of(1).flat_map(boom).to_list(),
        rs.of(1).flat_map_async(boom).to_list(),
        rs.of(1).flat_map_iterable(boom).to_list(),
        rs.failed(RuntimeError()).on_error_resume(boom).to_list(),
        rs.failed(RuntimeError()).on_error_resume_with(boom).to_list(),
        rs.of(1).collect(list, boom),
        rs.of(1, 2).reduce(boom),
        rs.of(1).for_each(boom),
        rs.generate(boom).to_list(),
        rs.from_iterable(Tracked(2)).map(boom).to_list(),
    ]
    for runner in runners:
        future = runner.run()  # must not raise
        with pytest.raises(ValueError) as caught:
            await asyncio.wait_for(future, T)
        assert caught.value is error, runner


async def test_none_as_element_fails_the_stream_with_type_error() -> None:
    async def none_result(_: int) -> None:
        return None

    runners = [
        rs.from_iterable([1, None]).to_list(),
        rs.of(1).map(lambda x: None).to_list(),
        rs.of(1).flat_map(lambda x: None).to_list(),
        rs.of(1).flat_map_async(none_result).to_list(),
        rs.of(1).flat_map_iterable(lambda x: [None]).to_list(),
        rs.failed(RuntimeError()).on_error_resume(lambda e: None).to_list(),
        rs.generate(lambda: None).to_list(),
    ]
    for runner in runners:
        with pytest.raises(TypeError):
            await result(runner)


def test_none_and_bad_arguments_raise_at_once() -> None:
    for call in (
        lambda: rs.of(1, None),
        lambda: rs.from_iterable(None),  # type: ignore[arg-type]
        lambda: rs.from_async_iterable([1]),  # type: ignore[arg-type]
        lambda: rs.from_publisher(None),  # type: ignore[arg-type]
        lambda: rs.from_publisher(object()),  # type: ignore[arg-type]
        lambda: rs.failed(None),  # type: ignore[arg-type]
        lambda: rs.failed("not an exception"),  # type: ignore[arg-type]
        lambda: rs.generate(None),  # type: ignore[arg-type]
        lambda: rs.iterate(None, lambda x: x),
        lambda: rs.concat(rs.of(1), None),  # type: ignore[arg-type]
        lambda: rs.of(1).map(None),  # type: ignore[arg-type]
        lambda: rs.of(1).filter(None),  # type: ignore[arg-type]
        lambda: rs.of(1).to(None),  # type: ignore[arg-type]
        lambda: rs.of(1).via(None),  # type: ignore[arg-type]
        lambda: rs.of(1).limit("2"),  # type: ignore[arg-type]
        lambda: rs.from_subscriber(None),  # type: ignore[arg-type]
        lambda: rs.of(1).build().subscribe(None),  # type: ignore[arg-type]
        lambda: rs.of(1).via(42),  # type: ignore[arg-type]
        lambda: rs.of(1).via(ProbeSubscriber()),  # type: ignore[arg-type]  (a subscriber is not a processor)
        lambda: rs.of(1).to(rs.of(2)),  # type: ignore[arg-type]
        lambda: rs.builder().to("x"),  # type: ignore[arg-type]
        lambda: rs.from_processor(rs.of(1).build()),  # type: ignore[arg-type]
        lambda: rs.from_subscriber(object()),  # type: ignore[arg-type]
        lambda: rs.of(1).skip(1.5),  # type: ignore[arg-type]
        lambda: rs.of(1).limit(True),
    ):
        with pytest.raises(TypeError):
            call()
    for call in (lambda: rs.of(1).limit(-1), lambda: rs.of(1).skip(-1), lambda: rs.builder().limit(-1)):
        with pytest.raises(ValueError):
            call()


async def test_non_positive_request_signals_value_error() -> None:
    for bad in (0, -5):
        probe = ProbeSubscriber()
        rs.of(1, 2).map(lambda x: x).build().subscribe(probe)
        probe.request(bad)
        assert isinstance(probe.error, ValueError)
        probe.check()


async def test_a_throwing_publisher_fails_only_the_future() -> None:
    class Throwing(rs.Publisher[int]):
        def subscribe(self, subscriber: Subscriber[int]) -> None:
            raise OSError("broken publisher")

    future = rs.from_publisher(Throwing()).to_list().run()
    with pytest.raises(OSError):
        await asyncio.wait_for(future, T)


# --- stack depth and graph ----------------------------------------------------------------------------------


async def test_a_million_items_requested_one_at_a_time_do_not_overflow_the_stack() -> None:
    n = 1_000_000
    probe = ProbeSubscriber(request_on_subscribe=1, request_in_on_next=1)
    rs.from_iterable(range(n)).map(lambda x: x + 1).filter(lambda x: True).flat_map_iterable(lambda x: [x]).build(
    ).subscribe(probe)
    assert probe.completed
    assert len(probe.items) == n and probe.items[-1] == n
    assert probe.max_depth == 1
    probe.check()


async def test_long_chain_of_processors_requested_one_at_a_time() -> None:
    builder = rs.from_iterable(range(10_000))
    for _ in range(50):
        builder = builder.flat_map(lambda x: rs.of(x)).limit(10**9)
    probe = ProbeSubscriber(request_on_subscribe=1, request_in_on_next=1)
    builder.build().subscribe(probe)
    assert probe.completed and len(probe.items) == 10_000
    probe.check()


def test_builders_are_immutable_and_expose_their_stages() -> None:
    base = rs.of(1)
    mapped = base.map(str)
    assert base.stages == (st.Of((1,)),)
    assert [type(s) for s in mapped.stages] == [st.Of, st.Map]
    runner = mapped.filter(bool).to_list()
    assert [type(s) for s in runner.stages] == [st.Of, st.Map, st.Filter, st.ToList]
    processor = rs.builder().map(str)
    subscriber = processor.to(rs.builder().ignore())
    assert [type(s) for s in subscriber.stages] == [st.Map, st.Ignore]
    assert [type(s) for s in rs.concat(rs.of(1), rs.empty()).stages] == [st.Concat]


async def test_a_built_publisher_is_cold() -> None:
    publisher = rs.of(1, 2).map(lambda x: x * 3).build()
    first, second = ProbeSubscriber(request_on_subscribe=5), ProbeSubscriber(request_on_subscribe=5)
    publisher.subscribe(first)
    publisher.subscribe(second)
    assert first.items == second.items == [3, 6]


async def test_async_source_cancels_a_subscriber_whose_on_next_raises() -> None:
    loop = asyncio.get_running_loop()
    reported: asyncio.Future[dict[str, Any]] = loop.create_future()
    loop.set_exception_handler(lambda _, context: reported.done() or reported.set_result(context))
    closed = asyncio.Event()

    async def numbers() -> AsyncIterator[int]:
        try:
            for i in itertools.count():
                yield i
        finally:
            closed.set()

    class Faulty(ProbeSubscriber):
        def on_next(self, item: Any) -> None:
            raise RuntimeError("subscriber bug")

    try:
        rs.from_async_iterable(numbers()).build().subscribe(Faulty(request_on_subscribe=5))
        context = await asyncio.wait_for(reported, T)
        await asyncio.wait_for(closed.wait(), T)
    finally:
        loop.set_exception_handler(None)
    assert str(context["exception"]) == "subscriber bug"


@pytest.mark.parametrize("fused_into_source", [True, False], ids=["fused_into_source", "fused_processor"])
async def test_dropping_stages_under_one_at_a_time_demand(fused_into_source: bool) -> None:
    stages = rs.builder().filter(lambda x: x % 2 == 0).skip(1).drop_while(lambda x: x < 4).distinct()
    source = rs.from_iterable([0, 1, 2, 3, 4, 4, 5, 6, 7, 8])
    publisher = (source.via(stages) if fused_into_source else source.via(stages.build())).build()
    probe = ProbeSubscriber(request_on_subscribe=1, request_in_on_next=1)
    publisher.subscribe(probe)
    assert probe.items == [4, 6, 8] and probe.completed
    probe.check()


async def test_user_stop_iteration_in_a_fused_map_fails_the_stream() -> None:
    def stop(_: int) -> int:
        raise StopIteration

    with pytest.raises(RuntimeError) as caught:  # a future cannot hold StopIteration; wrapped as PEP 479 does
        await result(rs.of(1, 2).map(stop).to_list())
    assert isinstance(caught.value.__cause__, StopIteration)


def test_a_subscriber_built_outside_a_loop_works_inside_one() -> None:
    subscriber = rs.builder().map(lambda x: x + 1).to_list().build()

    async def main() -> list[int]:
        rs.of(1, 2).build().subscribe(subscriber)
        return await asyncio.wait_for(subscriber.completion, T)

    assert asyncio.run(main()) == [2, 3]


def test_run_needs_a_running_loop() -> None:
    with pytest.raises(RuntimeError):
        rs.of(1).to_list().run()


@pytest.mark.parametrize("bad", [0, -1])
@pytest.mark.parametrize("name", ["identity", "map", "limit", "flat_map", "on_error_resume", "mixed_chain"])
async def test_bad_request_before_the_processor_has_an_upstream(name: str, bad: int) -> None:
    from .cases import PROCESSORS

    processor = PROCESSORS[name]()
    probe = ProbeSubscriber()
    processor.subscribe(probe)
    probe.request(bad)
    rs.of(1, 2).build().subscribe(processor)
    await probe.wait_until(lambda: probe.terminated, T, "3.9", "on_error")
    assert isinstance(probe.error, ValueError) and probe.items == []
    probe.check()


async def test_flat_map_iterable_closes_the_inner_generator_on_cancel() -> None:
    inner = Tracked()
    assert await result(rs.of(1).flat_map_iterable(lambda _: inner).limit(2).to_list()) == [1, 2]
    assert inner.closed == 1


async def test_callbacks_returning_the_wrong_kind_of_thing_fail_the_stream_with_type_error() -> None:
    runners = [
        rs.of(1).flat_map(lambda x: 42).to_list(),
        rs.of(1).flat_map_async(lambda x: 42).to_list(),
        rs.of(1).flat_map_iterable(lambda x: 42).to_list(),
        rs.failed(RuntimeError()).on_error_resume_with(lambda e: 42).to_list(),
    ]
    for runner in runners:
        with pytest.raises(TypeError):
            await result(runner)


async def test_a_generator_source_is_used_up_by_the_first_run() -> None:
    runner = rs.from_iterable(x for x in (1, 2)).to_list()
    assert await result(runner) == [1, 2]
    assert await result(runner) == []


@pytest.mark.parametrize("plan", ["bare", "fused"])
def test_an_iterable_source_lets_a_subscriber_failure_in_on_next_out_of_its_request(plan: str) -> None:
    """A subscriber's on_next that raises breaks rule 2.13: the iterable source does not turn that into the stream's
    on_error (it was not the source's failure); it propagates from the ``request`` that drove the emission."""
    errors: list[BaseException] = []
    seen: list[int] = []

    class Faulty(Subscriber[int]):
        def on_subscribe(self, subscription: Subscription) -> None:
            self.subscription = subscription

        def on_next(self, item: int) -> None:
            seen.append(item)
            if item == 2:
                raise RuntimeError("subscriber bug")

        def on_error(self, error: BaseException) -> None:
            errors.append(error)

        def on_complete(self) -> None:
            errors.append(AssertionError("completed"))

    source = rs.from_iterable([1, 2, 3])
    if plan == "fused":
        source = source.map(lambda x: x * 1)
    subscriber = Faulty()
    source.build().subscribe(subscriber)
    with pytest.raises(RuntimeError, match="subscriber bug"):
        subscriber.subscription.request(5)
    assert seen == [1, 2] and errors == []
