"""Throttling benchmark: what the shared throttling counter costs per inbound message, interleaved with a run
without throttling.

    python benchmarks/throttle_bench.py [--count 2000] [--senders 32] [--repeat 3] [--databases postgres,sqlite]

Each run: a fresh database, one started engine (trivial route), the inbound JSON endpoint in process (httpx's ASGI
transport, no sockets), ``senders`` concurrent clients posting ``count`` messages; messages/s = count / time until
the last one is OK. ``throttled`` runs have the rule ``"*.*" = "1000000/60"`` (never reached: every request is
counted, none refused). Repetitions interleave the two modes on each database (in alternating order); prints min /
median / max, the ratio of the medians and min / median / max of the ratio per repetition (the issue's goal: the
cost stays under 10%), and the benchmark process's CPU time per message (all its threads; the database server's is
not in it), which a loaded machine disturbs less than the rate. The machine is shared: read the spread.
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import time
from datetime import timedelta
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from openroute.persistence import MessageState, MessageStore

from benchmarks._common import arguments, concurrently, fresh_database
from openroute.definitions.route import Route, RouteRegistry
from openroute.engine import Engine, EngineSettings
from openroute.inbound.throttling import Throttling
from openroute.node import Node


async def run(url: str, count: int, senders: int, throttled: bool) -> tuple[float, float]:
    """(messages/s, this process's CPU milliseconds per message) of one run."""
    store = MessageStore(url)
    engine = Engine(store, RouteRegistry([Route("orders", "create", [lambda exchange: None])]),
                    EngineSettings(node_id="bench", repoll_interval=timedelta(seconds=30)))
    throttling = Throttling.from_rules({"*.*": "1000000/60"}, store) if throttled else None
    app = Node(engine, manage_engine=False, throttling=throttling).app
    await engine.start()
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://node") as http:
            async def send(number: int) -> None:
                answer = await http.post("/api/orders/create", content=f'{{"n": {number}}}'.encode(),
                                         headers={"Content-Type": "application/json", "X-Source-System": "CRM"})
                assert answer.status_code == 202, answer.text

            started, cpu = time.perf_counter(), time.process_time()
            await concurrently(count, senders, send)
            while (await asyncio.to_thread(store.count_by_state)).get(MessageState.OK, 0) < count:
                await asyncio.sleep(0.01)
            elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
    finally:
        await engine.stop()
        store.dispose()
    if throttling is not None:
        print(f"  throttled run: {throttling.reservations} counting transactions for {count} messages, "
              f"{throttling.waits} requests waited for one")
    return count / elapsed, cpu * 1000 / count


def main() -> None:
    args = arguments(__doc__, count=2000, senders=32, databases="postgres,sqlite").parse_args()
    folder = Path(__file__).resolve().parent / ".throttle-bench"
    folder.mkdir(exist_ok=True)
    print(f"{args.count} JSON messages, {args.senders} senders, {args.repeat} interleaved repetitions")
    for kind in args.databases.split(","):
        rates: dict[bool, list[float]] = {False: [], True: []}
        cpu: dict[bool, list[float]] = {False: [], True: []}
        for repetition in range(args.repeat):
            # the order alternates, so a slower first (or second) run of a pair falls on both modes
            for throttled in (False, True) if repetition % 2 == 0 else (True, False):
                with fresh_database(kind, "throttle_bench", folder) as url:
                    rate, millis = asyncio.run(run(url, args.count, args.senders, throttled))
                    rates[throttled].append(rate)
                    cpu[throttled].append(millis)
        for throttled, values in rates.items():
            print(f"{kind:9} {'throttled' if throttled else 'plain':9} msg/s min {min(values):7.1f}  "
                  f"median {statistics.median(values):7.1f}  max {max(values):7.1f}   process CPU ms/msg min "
                  f"{min(cpu[throttled]):.2f}  median {statistics.median(cpu[throttled]):.2f}  "
                  f"max {max(cpu[throttled]):.2f}")
        ratio = statistics.median(rates[True]) / statistics.median(rates[False])
        pairs = [throttled / plain for plain, throttled in zip(rates[False], rates[True], strict=True)]
        print(f"{kind:9} throttled / plain (medians): {ratio:.2f}; per repetition min {min(pairs):.2f}  "
              f"median {statistics.median(pairs):.2f}  max {max(pairs):.2f}")


if __name__ == "__main__":
    main()
