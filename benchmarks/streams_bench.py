"""Throughput of openroute.streams against reactivex (RxPY) and plain async generators.

Pushes N ints (default 3,000,000: a run of about a second, long enough that a hiccup of the machine does not decide
a repetition's ratio, as it did at 1,000,000) through ``map -> filter -> collect`` in each, and through an openroute
subscriber that requests in batches of 1 and of 256. The cases run interleaved, ``--repeat`` times (each
repetition runs every case once, in a rotated order); prints items/s (min / median / max) and each ratio's
min / median / max over the repetitions. Each run has the garbage collector off, as ``timeit`` does.

    python benchmarks/streams_bench.py [--n 3000000] [--repeat 5]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import resource
import statistics
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


async def timed(name: str, run: Callable[[int], Any], n: int, want: int) -> float:
    """Items per second of one run of ``run`` (a wrong result ends the benchmark). The garbage collector is off
    while it runs, as ``timeit`` does: the collected list of a million ints made its passes land in one case's run
    or another's at random (the same case varied 1.5x between repetitions)."""
    gc.collect()
    gc.disable()
    try:
        start = time.perf_counter()
        got = await run(n)
        elapsed = time.perf_counter() - start
    finally:
        gc.enable()
    if got != want:
        raise SystemExit(f"{name}: wrong result, {got} items instead of {want}")
    return n / elapsed


def spread(values: list[float]) -> str:
    return f"{min(values):6.2f} / {statistics.median(values):6.2f} / {max(values):6.2f}"


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=3_000_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    cases: list[tuple[str, Callable[[int], Any]]] = [
        ("openroute to_list (unbounded demand)", openroute_to_list),
        ("openroute subscriber request(256)", openroute_batched(256)),
        ("openroute subscriber request(1)", openroute_batched(1)),
        ("reactivex (RxPY)", reactivex_chain),
        ("async generators", async_generators),
    ]
    want = expected(args.n)
    print(f"{args.n:,} ints through map -> filter -> collect; {args.repeat} repetitions, the cases interleaved "
          "(each repetition runs every case once, in a rotated order)\n")
    for name, run in cases:  # warm-up: imports (reactivex's inside its case) and first-call costs out of the figures
        await timed(name, run, 1_000, expected(1_000))
    rates: dict[str, list[float]] = {name: [] for name, _ in cases}
    for repetition in range(args.repeat):
        shift = repetition % len(cases)
        for name, run in cases[shift:] + cases[:shift]:
            rates[name].append(await timed(name, run, args.n, want))
    print(f"{'chain':<42} {'items/s min / median / max':>40}")
    for name, values in rates.items():
        print(f"{name:<42} {min(values):>12,.0f} {statistics.median(values):>12,.0f} {max(values):>12,.0f}")
    to_list, batched, one, rx, agen = rates.values()

    def ratios(numerator: list[float], denominator: list[float]) -> list[float]:
        return [a / b for a, b in zip(numerator, denominator, strict=True)]

    print("\nratios per repetition, min / median / max")
    print(f"openroute to_list / reactivex          {spread(ratios(to_list, rx))}")
    print(f"openroute request(256) / reactivex     {spread(ratios(batched, rx))}   (goal: min >= 1.2)")
    print(f"openroute request(256) / async gens    {spread(ratios(batched, agen))}")
    print(f"request(256) / request(1) slowdown     {spread(ratios(batched, one))}   (goal <= 5)")
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"\npeak memory (max RSS of the process): {peak:,.0f} MiB")


if __name__ == "__main__":
    asyncio.run(main())
