"""Throughput of openroute.streams against reactivex (RxPY) and plain async generators.

Pushes N ints (default 1,000,000) through ``map -> filter -> collect`` in each, and through an openroute
subscriber that requests in batches of 1 and of 256. Prints items/s (best of ``--repeat`` runs) and ratios.

    python benchmarks/streams_bench.py [--n 1000000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from openroute import streams as rs
from openroute.streams import Subscriber, Subscription


def double(x: int) -> int:
    return x * 2


def keep(x: int) -> bool:
    return x % 3 != 0


def expected(n: int) -> int:
    return sum(1 for i in range(n) if keep(double(i)))


class BatchSubscriber(Subscriber[int]):
    """Requests ``batch`` elements, and ``batch`` more each time that many have arrived."""

    def __init__(self, batch: int, done: asyncio.Future[list[int]]) -> None:
        self.batch = batch
        self.items: list[int] = []
        self.left = 0
        self.done = done
        self.subscription: Subscription | None = None

    def on_subscribe(self, subscription: Subscription) -> None:
        self.subscription = subscription
        self.left = self.batch
        subscription.request(self.batch)

    def on_next(self, item: int) -> None:
        self.items.append(item)
        self.left -= 1
        if self.left == 0:
            self.left = self.batch
            self.subscription.request(self.batch)  # type: ignore[union-attr]

    def on_error(self, error: BaseException) -> None:
        self.done.set_exception(error)

    def on_complete(self) -> None:
        self.done.set_result(self.items)


async def openroute_to_list(n: int) -> int:
    result = await rs.from_iterable(range(n)).map(double).filter(keep).to_list()
    return len(result)


def openroute_batched(batch: int) -> Callable[[int], Any]:
    async def run(n: int) -> int:
        done: asyncio.Future[list[int]] = asyncio.get_running_loop().create_future()
        rs.from_iterable(range(n)).map(double).filter(keep).to(BatchSubscriber(batch, done)).run()
        return len(await done)

    return run


async def reactivex_chain(n: int) -> int:
    import reactivex
    from reactivex import operators as ops

    result: list[list[int]] = []
    reactivex.from_iterable(range(n)).pipe(ops.map(double), ops.filter(keep), ops.to_list()).subscribe(
        on_next=result.append
    )
    return len(result[0])


async def async_generators(n: int) -> int:
    async def source() -> AsyncIterator[int]:
        for i in range(n):
            yield i

    async def mapped(items: AsyncIterator[int]) -> AsyncIterator[int]:
        async for x in items:
            yield double(x)

    async def filtered(items: AsyncIterator[int]) -> AsyncIterator[int]:
        async for x in items:
            if keep(x):
                yield x

    return len([x async for x in filtered(mapped(source()))])


async def measure(name: str, run: Callable[[int], Any], n: int, repeat: int) -> float:
    best = float("inf")
    want = expected(n)
    for _ in range(repeat):
        start = time.perf_counter()
        got = await run(n)
        elapsed = time.perf_counter() - start
        if got != want:
            raise SystemExit(f"{name}: wrong result, {got} items instead of {want}")
        best = min(best, elapsed)
    rate = n / best
    print(f"{name:<42} {rate:>14,.0f} items/s   ({best:.3f} s)")
    return rate


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    print(f"{args.n:,} ints through map -> filter -> collect, best of {args.repeat}\n")
    cases: list[tuple[str, Callable[[int], Any]]] = [
        ("openroute to_list (unbounded demand)", openroute_to_list),
        ("openroute subscriber request(256)", openroute_batched(256)),
        ("openroute subscriber request(1)", openroute_batched(1)),
        ("reactivex (RxPY)", reactivex_chain),
        ("async generators", async_generators),
    ]
    rates = [await measure(name, run, args.n, args.repeat) for name, run in cases]
    to_list, batched, one, rx, agen = rates
    print()
    print(f"openroute to_list / reactivex          {to_list / rx:6.2f}x")
    print(f"openroute request(256) / reactivex     {batched / rx:6.2f}x   (goal >= 1)")
    print(f"openroute request(256) / async gens    {batched / agen:6.2f}x")
    print(f"request(256) / request(1) slowdown     {batched / one:6.2f}x   (goal <= 5)")

if __name__ == "__main__":
    asyncio.run(main())
