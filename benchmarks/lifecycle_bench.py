"""Lifecycle benchmark: accepted and completed messages per second, accept latency, and the cost floor.

    python benchmarks/lifecycle_bench.py [--count 20000] [--senders 64] [--databases sqlite,postgres]

For each database it runs, on a fresh database:

* the cost floor: ``count`` bare single-row INSERT transactions and ``count`` single-row UPDATE
  transactions through SQLAlchemy, on the store's own engine (same pragmas / driver), one after another;
  the floor rate is ``count / (insert time + update time)``, i.e. messages per second if each message
  cost exactly one INSERT and one UPDATE commit;
* the engine: ``senders`` concurrent clients accept ``count`` messages of a trivial route while one
  node processes them (NEW -> PROCESSING -> OK). Accepted msgs/s = count / time until the last accept
  returned; completed msgs/s = count / time until the last message was OK; accept latency p50 / p99.

It prints the ratio completed / floor (goal: >= 0.5 on both databases). PostgreSQL uses the URL in
OPENROUTE_BENCH_POSTGRES_URL (default: the local test server) and a throw-away database.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import sqlalchemy as sa

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from openroute.persistence import MessageState, MessageStore

from openroute.engine import Engine, EngineSettings, InboundMessage
from openroute.route import Route, RouteRegistry

POSTGRES_URL = os.environ.get("OPENROUTE_BENCH_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")


@contextmanager
def fresh_database(kind: str) -> Iterator[str]:
    if kind == "sqlite":
        with tempfile.TemporaryDirectory() as folder:
            yield f"sqlite:///{Path(folder) / 'bench.db'}"
        return
    admin = sa.create_engine(POSTGRES_URL, isolation_level="AUTOCOMMIT")
    name = f"openroute_bench_{uuid.uuid4().hex[:8]}"
    with admin.connect() as connection:
        connection.execute(sa.text(f'CREATE DATABASE "{name}"'))
    try:
        yield POSTGRES_URL.rsplit("/", 1)[0] + f"/{name}"
    finally:
        with admin.connect() as connection:
            connection.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def floor(url: str, count: int) -> float:
    """Messages/s if every message cost one bare INSERT commit and one bare UPDATE commit."""
    store = MessageStore(url)
    table = sa.Table(
        "floor_row", sa.MetaData(),
        sa.Column("id", sa.Integer, primary_key=True), sa.Column("state", sa.String(32)), sa.Column("payload", sa.Text),
    )
    table.create(store.engine)
    insert, update = table.insert(), table.update().where(table.c.id == sa.bindparam("row_id"))
    started = time.perf_counter()
    for i in range(1, count + 1):
        with store.engine.begin() as connection:
            connection.execute(insert, {"id": i, "state": "NEW", "payload": "<order/>"})
    for i in range(1, count + 1):
        with store.engine.begin() as connection:
            connection.execute(update, {"row_id": i, "state": "OK"})
    elapsed = time.perf_counter() - started
    store.dispose()
    return count / elapsed


async def engine_run(url: str, count: int, senders: int) -> dict[str, float]:
    store = MessageStore(url)
    store.create_schema()
    routes = RouteRegistry([Route("bench", "noop", [lambda exchange: None])])
    engine = Engine(store, routes, EngineSettings(node_id="bench", repoll_interval=None))
    done = asyncio.Event()
    completed = 0

    async def on_final(message: object) -> None:
        nonlocal completed
        completed += 1
        if completed == count:
            done.set()

    engine.final_state_hooks.append(on_final)
    await engine.start()
    latencies: list[float] = []
    next_index = 0

    async def sender() -> None:
        nonlocal next_index
        while next_index < count:
            i = next_index
            next_index += 1
            inbound = InboundMessage("bench", "noop", "<order/>", "text/xml", f"b-{i}", "bench")
            t0 = time.perf_counter()
            await engine.accept(inbound)
            latencies.append(time.perf_counter() - t0)

    started = time.perf_counter()
    await asyncio.gather(*(sender() for _ in range(senders)))
    accepted_at = time.perf_counter() - started
    await asyncio.wait_for(done.wait(), 600)
    completed_at = time.perf_counter() - started
    states = store.count_by_state()
    await engine.stop()
    store.dispose()
    if states != {MessageState.OK: count}:
        raise SystemExit(f"benchmark run is wrong: {states}")
    latencies.sort()
    return {
        "accepted": count / accepted_at,
        "completed": count / completed_at,
        "p50": statistics.median(latencies) * 1000,
        "p99": latencies[int(len(latencies) * 0.99) - 1] * 1000,
        "commits": engine._writer.transactions,
        "writes": engine._writer.operations,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=20000)
    parser.add_argument("--senders", type=int, default=64)
    parser.add_argument("--databases", default="sqlite,postgres")
    args = parser.parse_args()
    print(f"lifecycle benchmark: {args.count} messages, {args.senders} concurrent senders, trivial route")
    for kind in args.databases.split(","):
        with fresh_database(kind) as url:
            base = floor(url, args.count)
        with fresh_database(kind) as url:
            run = asyncio.run(engine_run(url, args.count, args.senders))
        print(
            f"{kind:9} accepted {run['accepted']:8.0f} msg/s | completed {run['completed']:8.0f} msg/s | "
            f"accept latency p50 {run['p50']:6.2f} ms p99 {run['p99']:7.2f} ms | "
            f"floor (INSERT+UPDATE tx) {base:8.0f} msg/s | completed/floor {run['completed'] / base:5.2f} | "
            f"{run['writes'] / max(run['commits'], 1):.1f} writes per commit"
        )


if __name__ == "__main__":
    main()
