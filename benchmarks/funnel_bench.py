"""Funnel drain benchmark: messages of one funnel value behind a slow remote, one after the other.

    python benchmarks/funnel_bench.py [--count 50] [--remote-ms 50] [--repeat 3] [--databases postgres,sqlite]
                                      [--nodes 1]

All ``count`` messages are accepted at once for one funnel value (one object); the route's only step waits
``remote-ms`` (the remote call). A message that finds the funnel held waits in the funnel's queue; the holder's end
hands the funnel to the next, which the releasing node runs at once, whichever node queued it (``postpone_interval``
is an hour and repoll is off, so nothing else can run it). With ``--nodes 2`` the messages are accepted alternately
by two engines (two nodes in one process, each on its own connections) on the same PostgreSQL database.
Prints messages/s from the first accept to the last OK, and the floor ``1000 / remote-ms`` (goal: >= 10 msg/s
behind 50 ms). The machine is shared: read the spread over the repetitions, not one figure.
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import time
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from openroute.persistence import MessageState, MessageStore

from benchmarks._common import arguments, fresh_database
from openroute.definitions.message import InboundMessage
from openroute.definitions.route import Route, RouteRegistry
from openroute.engine import Engine, EngineSettings


async def drain(url: str, count: int, remote: float, nodes: int) -> float:
    async def call_remote(exchange: object) -> None:
        await asyncio.sleep(remote)

    stores = [MessageStore(url) for _ in range(nodes)]
    engines = [
        Engine(store, RouteRegistry([Route("orders", "create", [call_remote])]),
               EngineSettings(node_id=f"bench-{i}", repoll_interval=None, postpone_interval=timedelta(hours=1)))
        for i, store in enumerate(stores)
    ]
    for engine in engines:
        await engine.start()
    try:
        started = time.perf_counter()
        await asyncio.gather(*(
            engines[i % nodes].accept(InboundMessage(
                service="orders", operation="create", payload="{}", content_type="application/json",
                correlation_id=f"m-{i}", source_system="bench", funnel_value="one-object"))
            for i in range(count)
        ))
        while (await asyncio.to_thread(stores[0].count_by_state)).get(MessageState.OK, 0) < count:
            await asyncio.sleep(0.01)
        elapsed = time.perf_counter() - started
    finally:
        for engine in engines:
            await engine.stop()
        for store in stores:
            store.dispose()
    return count / elapsed


def main() -> None:
    parser = arguments(__doc__, count=50, databases="postgres,sqlite")
    parser.add_argument("--remote-ms", type=float, default=50.0)
    parser.add_argument("--nodes", type=int, default=1)
    args = parser.parse_args()
    folder = Path(__file__).resolve().parent / ".funnel-bench"
    folder.mkdir(exist_ok=True)
    print(f"{args.count} messages of one funnel value, remote {args.remote_ms:g} ms, {args.nodes} node(s); "
          f"floor {1000 / args.remote_ms:.1f} msg/s")
    for kind in args.databases.split(","):
        if kind == "sqlite" and args.nodes > 1:
            continue
        rates = []
        for _ in range(args.repeat):
            with fresh_database(kind, "funnel_bench", folder) as url:
                rates.append(asyncio.run(drain(url, args.count, args.remote_ms / 1000, args.nodes)))
        print(f"{kind:9} msg/s min {min(rates):6.1f}  median {statistics.median(rates):6.1f}  max {max(rates):6.1f}")


if __name__ == "__main__":
    main()
