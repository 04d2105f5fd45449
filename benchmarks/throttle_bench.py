"""Throttling benchmark: what the shared throttling counter costs per inbound message, interleaved with a run
without throttling.

    python benchmarks/throttle_bench.py [--count 2000] [--senders 32] [--repeat 3] [--databases postgres,sqlite]

Each run: a fresh database, one started engine (trivial route), the inbound JSON endpoint in process (httpx's ASGI
transport, no sockets), ``senders`` concurrent clients posting ``count`` messages; messages/s = count / time until
the last one is OK. ``throttled`` runs have the rule ``"*.*" = "1000000/60"`` (never reached: every request is
counted, none refused). Repetitions interleave the two modes on each database; prints min / median / max and the
ratio of the medians (the issue's goal: the cost stays under 10%). The machine is shared: read the spread.
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
from openroute.engine import Engine, EngineSettings
from openroute.inbound.throttling import Throttling
from openroute.route import Route, RouteRegistry
from openroute.server import create_app


async def run(url: str, count: int, senders: int, throttled: bool) -> float:
    store = MessageStore(url)
    engine = Engine(store, RouteRegistry([Route("orders", "create", [lambda exchange: None])]),
                    EngineSettings(node_id="bench", repoll_interval=timedelta(seconds=30)))
    throttling = Throttling.from_rules({"*.*": "1000000/60"}, store) if throttled else None
    app = create_app(engine, manage_engine=False, throttling=throttling)
    await engine.start()
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://node") as http:
            async def send(number: int) -> None:
                answer = await http.post("/api/orders/create", content=f'{{"n": {number}}}'.encode(),
                                         headers={"Content-Type": "application/json", "X-Source-System": "CRM"})
                assert answer.status_code == 202, answer.text

            started = time.perf_counter()
            await concurrently(count, senders, send)
            while (await asyncio.to_thread(store.count_by_state)).get(MessageState.OK, 0) < count:
                await asyncio.sleep(0.01)
            elapsed = time.perf_counter() - started
    finally:
        await engine.stop()
        store.dispose()
    return count / elapsed


def main() -> None:
    args = arguments(__doc__, count=2000, senders=32, databases="postgres,sqlite").parse_args()
    folder = Path(__file__).resolve().parent / ".throttle-bench"
    folder.mkdir(exist_ok=True)
    print(f"{args.count} JSON messages, {args.senders} senders, {args.repeat} interleaved repetitions")
    for kind in args.databases.split(","):
        rates: dict[bool, list[float]] = {False: [], True: []}
        for _ in range(args.repeat):
            for throttled in (False, True):
                with fresh_database(kind, "throttle_bench", folder) as url:
                    rates[throttled].append(asyncio.run(run(url, args.count, args.senders, throttled)))
        for throttled, values in rates.items():
            print(f"{kind:9} {'throttled' if throttled else 'plain':9} msg/s min {min(values):7.1f}  "
                  f"median {statistics.median(values):7.1f}  max {max(values):7.1f}")
        ratio = statistics.median(rates[True]) / statistics.median(rates[False])
        print(f"{kind:9} throttled / plain (medians): {ratio:.2f}")


if __name__ == "__main__":
    main()
