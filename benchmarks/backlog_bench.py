"""Backlog benchmark: a deep backlog of parked messages drains at the pace of the same route's happy path.

    python benchmarks/backlog_bench.py [--sizes 10000,100000] [--funnels 0,1000] [--repeat 3] [--database URL]
                                       [--explain-rows 1000000]

For each size and funnel count, two runs of one route (one ``ext_call`` of the system REMOTE through its breaker,
an instant fake) on one node over a fresh PostgreSQL database, alternated within each repetition:

* ``happy``: the backlog is NEW (stored while the node was down): the node starts and drains it;
* ``parked``: the backlog is parked on REMOTE's open breaker (POSTPONED, ``parked_on``, no due time, as an outage
  leaves it); the node runs, an admin closes the breaker, and the release drains it (with funnels: the oldest of
  each funnel value due, the rest in the funnel's queue, handed on one by one).

Both backlogs are written with one set-based INSERT (receive times spread over the last hour) and ANALYZEd. It
prints messages per second of each, and the ratio parked / happy (min / median / max over the repetitions): the goal
is >= 0.8 at every size (work linear in the backlog). With ``--explain-rows`` it also fills a store with that many
final messages plus a parked and a due backlog and prints the plans of the feed, the release and the funnel queue's
head and the repoll's look for stalled funnel queues, which must read the partial indexes, not the table.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import sqlalchemy as sa
from openroute.persistence import MessageState, MessageStore

from benchmarks._common import POSTGRES_ADMIN_URL, fresh_database
from openroute.definitions.route import Route, RouteRegistry
from openroute.engine import Engine, EngineSettings
from openroute.outbound import BreakerSettings, BreakerState, ExternalCalls, ExternalSystem

FILL = """
INSERT INTO message (correlation_id, source_system, service, operation, funnel_value, payload, content_type,
                     headers, state, failed_count, receive_ts, last_update_ts, custom_data, business_errors, version,
                     parked_on, last_error_code, last_error_text, next_attempt_at)
SELECT :prefix || n, 'BENCH', 'bench', 'update', {funnel}, '{{}}', 'application/json', '{{}}', :state, 0,
       now() - interval '1 hour' + n * interval '1 millisecond', now(), '{{}}', '[]', 0,
       :parked_on, :code, :text, NULL
FROM generate_series(1, :count) AS n
"""


def fill(url: str, count: int, funnels: int, parked: bool, prefix: str = "b-") -> None:
    funnel = f"'f-' || (n % {funnels})" if funnels else "NULL"
    engine = sa.create_engine(url)
    with engine.begin() as connection:
        connection.execute(sa.text(FILL.format(funnel=funnel)), {
            "prefix": prefix, "count": count, "state": "POSTPONED" if parked else "NEW",
            "parked_on": "REMOTE" if parked else None, "code": "CIRCUIT_OPEN" if parked else None,
            "text": "the circuit breaker of REMOTE is OPEN" if parked else None})
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
        connection.execute(sa.text("VACUUM ANALYZE message"))
    engine.dispose()


def node(store: MessageStore) -> tuple[Engine, ExternalCalls]:
    """One node of the route: the funnel value is the stored message's own, so one route serves both backlogs."""
    async def call(exchange: Any) -> None:
        await exchange.ext_call("update", lambda: {"ok": True}, system="REMOTE")

    calls = ExternalCalls(store, [ExternalSystem("REMOTE", breaker=BreakerSettings())])
    route = Route("bench", "update", [call])
    return Engine(store, RouteRegistry([route]), EngineSettings(node_id="bench"),  # as `openroute run` runs
                  external_calls=calls), calls


async def drain(url: str, count: int, funnels: int, parked: bool) -> float:
    """Messages per second of draining a backlog of ``count`` (NEW, or parked and released by a close)."""
    store = MessageStore(url)
    engine, calls = node(store)
    if parked:
        await calls.force("REMOTE", BreakerState.OPEN, "bench")
    fill(url, count, funnels, parked)
    started = time.perf_counter()
    await engine.start()  # a NEW backlog is picked up at start (new_cutoff = now)
    try:
        if parked:
            started = time.perf_counter()
            await calls.force("REMOTE", BreakerState.CLOSED, "bench")  # the release drains it
        while True:
            done = await asyncio.to_thread(lambda: store.count_by_state().get(MessageState.OK, 0))
            if done >= count:
                break
            await asyncio.sleep(0.2)
        return count / (time.perf_counter() - started)
    finally:
        await engine.stop()
        store.dispose()


def explain(admin_url: str, rows: int) -> None:
    with fresh_database("postgresql", "backlog_explain", admin_url=admin_url) as url:
        engine = sa.create_engine(url)
        with engine.begin() as connection:
            connection.execute(sa.text(FILL.format(funnel="'f-' || (n % 1000)")), {
                "prefix": "ok-", "count": rows, "state": "OK", "parked_on": None, "code": None, "text": None})
        fill(url, 100_000, 1000, parked=True, prefix="p-")
        with engine.begin() as connection:
            connection.execute(sa.text(
                "UPDATE message SET state = 'PARTLY_FAILED', next_attempt_at = now() - interval '1 minute' "
                "WHERE id IN (SELECT id FROM message WHERE state = 'OK' LIMIT 20000)"))
            connection.execute(sa.text(
                "UPDATE message SET state = 'POSTPONED', last_error_code = 'FUNNEL', parked_on = NULL "
                "WHERE id IN (SELECT id FROM message WHERE parked_on IS NOT NULL AND funnel_value = 'f-7' "
                "ORDER BY id OFFSET 1)"))
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
            connection.execute(sa.text("VACUUM ANALYZE message"))
        store = MessageStore(url)
        now = datetime.now(UTC)
        statements: list[tuple[str, Any]] = []

        def capture(_conn: Any, _cursor: Any, statement: str, parameters: Any, _context: Any, _many: bool) -> None:
            if statement.lstrip().upper().startswith(("SELECT", "UPDATE")):
                statements.append((statement, parameters))

        sa.event.listen(store.engine, "before_cursor_execute", capture)
        store.ready(now, now - timedelta(minutes=1), 64)
        store.funnels.queue_head("f-7")
        store.funnels.stalled(100, now)
        with store.begin() as connection:
            store.parking.release("REMOTE", now, 1, failed_before=now, connection=connection)
            connection.rollback()
        sa.event.remove(store.engine, "before_cursor_execute", capture)
        total = engine.connect().execute(sa.text("SELECT count(*) FROM message")).scalar_one()
        print(f"\nplans with {total:,} messages in the table (1 parked backlog of 100,000, 20,000 due):")
        raw = store.engine.raw_connection()
        try:
            cursor = raw.cursor()
            for statement, parameters in statements:
                cursor.execute("EXPLAIN " + statement, parameters)
                plan = "\n".join(row[0] for row in cursor.fetchall())
                print(f"\n{statement.split(chr(10))[0][:100]}...\n{plan}")
        finally:
            raw.close()
        store.dispose()
        engine.dispose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10000,100000")
    parser.add_argument("--funnels", default="0,1000")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--database", default=POSTGRES_ADMIN_URL)
    parser.add_argument("--explain-rows", type=int, default=0)
    args = parser.parse_args()
    for size in (int(s) for s in args.sizes.split(",") if s):
        for funnels in (int(f) for f in args.funnels.split(",")):
            rates: dict[str, list[float]] = {"happy": [], "parked": []}
            for repetition in range(args.repeat):
                order = ("happy", "parked") if repetition % 2 == 0 else ("parked", "happy")
                for kind in order:
                    with fresh_database("postgresql", "backlog", admin_url=args.database) as url:
                        rates[kind].append(asyncio.run(drain(url, size, funnels, kind == "parked")))
            ratios = [p / h for p, h in zip(rates["parked"], rates["happy"], strict=True)]
            print(f"backlog {size:,}, {funnels or 'no'} funnel values: happy "
                  f"{statistics.median(rates['happy']):,.0f} msg/s, parked {statistics.median(rates['parked']):,.0f}"
                  f" msg/s; parked / happy min / median / max {min(ratios):.2f} / {statistics.median(ratios):.2f} / "
                  f"{max(ratios):.2f}", flush=True)
    if args.explain_rows:
        explain(args.database, args.explain_rows)


if __name__ == "__main__":
    main()
