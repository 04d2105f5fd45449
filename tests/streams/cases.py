"""Every publisher, processor and subscriber the streams package ships, as factories for the rule checks."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from typing import Any

from openroute import streams as rs
from openroute.streams import Processor, Publisher, Subscriber
from openroute.streams.tck import ProbeSubscriber


def _raising(n: int) -> Iterator[int]:
    yield from range(1, n + 1)
    raise RuntimeError("iterable failure")


async def _arange(n: int) -> AsyncIterator[int]:
    for i in range(1, n + 1):
        await asyncio.sleep(0)
        yield i


async def _araising(n: int) -> AsyncIterator[int]:
    async for i in _arange(n):
        yield i
    raise RuntimeError("async iterable failure")


async def _echo(x: int) -> int:
    await asyncio.sleep(0)
    return x


def _counter() -> Callable[[], int]:
    state = {"n": 0}

    def supplier() -> int:
        state["n"] += 1
        return state["n"]

    return supplier


def _failing_after(n: int) -> Callable[[], int]:
    counter = _counter()

    def supplier() -> int:
        value = counter()
        if value > n:
            raise RuntimeError("supplier failure")
        return value

    return supplier


def _span(n: int) -> rs.PublisherBuilder[int]:
    return rs.from_iterable(range(1, n + 1))


@dataclass(frozen=True)
class PublisherCase:
    """``make(n)``: a publisher of exactly n elements; ``failed()``: one that fails after on_subscribe."""

    name: str
    make: Callable[[int], Publisher[Any]]
    failed: Callable[[], Publisher[Any]] | None = None
    max_elements: int | None = None


# Each operator stage, shaped to keep one output element per input element so stream sizes stay known.
STAGES: dict[str, Callable[[Any], Any]] = {
    "identity": lambda b: b,
    "map": lambda b: b.map(lambda x: x * 2),
    "filter": lambda b: b.filter(lambda x: x > 0),
    "flat_map": lambda b: b.flat_map(lambda x: rs.of(x)),
    "flat_map_publisher": lambda b: b.flat_map(lambda x: rs.of(x).build()),
    "flat_map_async": lambda b: b.flat_map_async(_echo),
    "flat_map_iterable": lambda b: b.flat_map_iterable(lambda x: [x]),
    "limit": lambda b: b.limit(10**9),
    "skip": lambda b: b.skip(0),
    "take_while": lambda b: b.take_while(lambda x: x > 0),
    "drop_while": lambda b: b.drop_while(lambda x: x < 0),
    "distinct": lambda b: b.distinct(),
    "peek": lambda b: b.peek(lambda x: None),
    "on_error": lambda b: b.on_error(lambda e: None),
    "on_error_resume": lambda b: b.on_error_resume(lambda e: -1),
    "on_error_resume_with": lambda b: b.on_error_resume_with(lambda e: rs.empty()),
    "on_complete": lambda b: b.on_complete(lambda: None),
    "on_terminate": lambda b: b.on_terminate(lambda: None),
    "fused_chain": lambda b: b.map(lambda x: x + 1).filter(lambda x: x > 0).peek(lambda x: None).skip(0),
    "mixed_chain": lambda b: b.map(lambda x: x + 1).flat_map(lambda x: rs.of(x)).limit(10**9).distinct(),
}

RECOVERING = {"on_error_resume", "on_error_resume_with"}


def _reraise(error: BaseException) -> Any:
    raise error


# The recovering stages fail only when the recovery itself fails: their failing case for rules 1.4 / 1.7.
FAILING_RECOVERY: dict[str, Callable[[Any], Any]] = {
    "on_error_resume": lambda b: b.on_error_resume(_reraise),
    "on_error_resume_with": lambda b: b.on_error_resume_with(lambda e: rs.failed(e)),
}


def _stage_case(name: str, stage: Callable[[Any], Any]) -> PublisherCase:
    failing_stage = FAILING_RECOVERY.get(name, stage)

    def failed() -> Publisher[Any]:
        return failing_stage(rs.concat(rs.of(1), rs.failed(RuntimeError("upstream failure")))).build()

    return PublisherCase(f"stage:{name}", lambda n: stage(_span(n)).build(), failed)


def _completed_future(value: Any) -> asyncio.Future[Any]:
    future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
    future.set_result(value)
    return future


def _failed_future() -> asyncio.Future[Any]:
    future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
    future.set_exception(RuntimeError("future failure"))
    return future


PUBLISHERS: list[PublisherCase] = [
    PublisherCase("of", lambda n: rs.of(*range(1, n + 1)).build(), lambda: rs.failed(RuntimeError("x")).build()),
    PublisherCase("from_iterable", lambda n: _span(n).build(), lambda: rs.from_iterable(_raising(2)).build()),
    PublisherCase(
        "from_async_iterable",
        lambda n: rs.from_async_iterable(_arange(n)).build(),
        lambda: rs.from_async_iterable(_araising(2)).build(),
    ),
    PublisherCase(
        "from_publisher",
        lambda n: rs.from_publisher(_span(n).build()).build(),
        lambda: rs.from_publisher(rs.failed(RuntimeError("x")).build()).build(),
    ),
    PublisherCase("empty", lambda n: rs.empty().build(), max_elements=0),
    PublisherCase(
        "of_nullable",
        lambda n: rs.of_nullable(1 if n else None).build(),
        lambda: rs.of_nullable(1).map(lambda x: 1 // 0).build(),
        max_elements=1,
    ),
    PublisherCase(
        "from_completion_stage",
        # a non-nullable stage cannot be empty: n == 0 uses the same publisher in its nullable form
        lambda n: (rs.from_completion_stage(_completed_future(1)) if n
                   else rs.from_completion_stage_nullable(_completed_future(None))).build(),
        lambda: rs.from_completion_stage(_failed_future()).build(),
        max_elements=1,
    ),
    PublisherCase(
        "from_completion_stage_nullable",
        lambda n: rs.from_completion_stage_nullable(_completed_future(1 if n else None)).build(),
        lambda: rs.from_completion_stage_nullable(_failed_future()).build(),
        max_elements=1,
    ),
    PublisherCase(
        "generate",
        lambda n: rs.generate(_counter()).limit(n).build(),
        lambda: rs.generate(_failing_after(2)).build(),
    ),
    PublisherCase(
        "iterate",
        lambda n: rs.iterate(1, lambda x: x + 1).limit(n).build(),
        lambda: rs.iterate(1, lambda x: x + 1 if x < 2 else 1 // 0).build(),
    ),
    PublisherCase(
        "concat",
        lambda n: rs.concat(_span(n // 2), rs.from_iterable(range(n // 2, n))).build(),
        lambda: rs.concat(rs.of(1), rs.failed(RuntimeError("second failed"))).build(),
    ),
    PublisherCase(
        "via_processor",
        lambda n: _span(n).via(rs.builder().map(lambda x: x).build()).build(),
        lambda: rs.from_iterable(_raising(2)).via(rs.builder().map(lambda x: x).build()).build(),
    ),
    *(_stage_case(name, stage) for name, stage in STAGES.items() if name != "identity"),
]


PROCESSORS: dict[str, Callable[[], Processor[Any, Any]]] = {
    name: (lambda stage=stage: stage(rs.builder()).build()) for name, stage in STAGES.items()
}
PROCESSORS["from_processor"] = lambda: rs.from_processor(rs.builder().map(lambda x: x).build()).build()


SUBSCRIBERS: dict[str, Callable[[], Subscriber[Any]]] = {
    "to_list": lambda: rs.builder().to_list().build(),
    "collect": lambda: rs.builder().collect(list, list.append).build(),
    "reduce": lambda: rs.builder().reduce(lambda a, b: a + b).build(),
    "reduce_identity": lambda: rs.builder().reduce(lambda a, b: a + b, 0).build(),
    "find_first": lambda: rs.builder().find_first().build(),
    "for_each": lambda: rs.builder().for_each(lambda x: None).build(),
    "ignore": lambda: rs.builder().ignore().build(),
    "cancel": lambda: rs.builder().cancel().build(),
    "with_stages": lambda: rs.builder().map(lambda x: x).flat_map(lambda x: rs.of(x)).to_list().build(),
    "from_subscriber": lambda: rs.from_subscriber(ProbeSubscriber(request_on_subscribe=10)).build(),
    "collect_collector": lambda: rs.builder().collect(rs.Collector(list, list.append, tuple)).build(),
    "reduce_none_identity": lambda: rs.builder().reduce(lambda a, b: b, None).build(),
}
