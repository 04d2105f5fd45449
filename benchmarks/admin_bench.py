"""Admin benchmark: search, counts and metrics on a 1,000,000-message store on PostgreSQL.

    python benchmarks/admin_bench.py [--rows 1000000] [--repeat 30] [--plans] [--rebuild] [--http URL --user U]

The store is built once with set-based SQL (``benchmarks/store_fill.py``: 97 % OK, 2 % FAILED, 1 %
PARTLY_FAILED, 20 routes, receive times one second apart) in its own database (``openroute_bench`` on the
server of OPENROUTE_BENCH_POSTGRES_URL, default the local test server; OPENROUTE_BENCH_DATABASE names another),
VACUUM ANALYZEd, and reused by later
runs while its row count matches ``--rows``. Every documented search filter, alone and combined, runs through
:func:`openroute.admin.search.search_messages` (the function behind ``GET /admin/messages``: capped count +
one page of 50) ``--repeat`` times, interleaved (one round runs every query once); it prints p50 / p95 / max
in ms and, with ``--plans``, the plan of the page and count queries (EXPLAIN ANALYZE). Goal: < 20 ms each.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import sqlalchemy as sa

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from openroute.persistence import MessageStore

from benchmarks.store_fill import MIXED, START, fill
from openroute.admin.counts import MessageCounts
from openroute.admin.search import count_statement, page_statement, parse_filters, search_messages

SERVER_URL = os.environ.get("OPENROUTE_BENCH_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
DATABASE = os.environ.get("OPENROUTE_BENCH_DATABASE", "openroute_bench")
GOAL_MS = 20.0


def store_url() -> str:
    return SERVER_URL.rsplit("/", 1)[0] + f"/{DATABASE}"


def build(rows: int, rebuild: bool) -> MessageStore:
    """The 1M-row store, built once (set-based, in chunks of 250,000 rows) and reused."""
    admin = sa.create_engine(SERVER_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        exists = connection.execute(sa.text("SELECT 1 FROM pg_database WHERE datname = :n"), {"n": DATABASE}).first()
        if exists and rebuild:
            connection.execute(sa.text(f'DROP DATABASE "{DATABASE}" WITH (FORCE)'))
            exists = None
        if not exists:
            connection.execute(sa.text(f'CREATE DATABASE "{DATABASE}"'))
    admin.dispose()
    store = MessageStore(store_url())
    store.create_schema()  # brings an older bench database to the current migrations (e.g. 0004's indexes)
    with store.engine.connect() as connection:
        have = connection.execute(sa.text("SELECT count(*) FROM message")).scalar_one()
    if have != rows:
        print(f"building {rows:,} messages in {DATABASE} (had {have:,}) ...", flush=True)
        started = time.perf_counter()
        with store.engine.begin() as connection:
            connection.execute(sa.text("TRUNCATE message CASCADE"))
        chunk = 250_000
        for first in range(1, rows + 1, chunk):
            with store.engine.begin() as connection:
                fill(connection, min(chunk, rows - first + 1), MIXED, "bench", first=first)
        autocommit = store.engine.execution_options(isolation_level="AUTOCOMMIT")
        with autocommit.connect() as connection:
            connection.execute(sa.text("VACUUM ANALYZE message"))
        print(f"built in {time.perf_counter() - started:.1f} s", flush=True)
    return store


def queries(rows: int) -> dict[str, dict[str, Any]]:
    """The documented filters alone and combined; the values exist in the fill (see store_fill)."""
    middle = rows // 2
    hour = START + timedelta(seconds=middle)
    window = {"received_from": hour.isoformat(), "received_to": (hour + timedelta(hours=1)).isoformat()}
    day = {"received_from": hour.isoformat(), "received_to": (hour + timedelta(days=1)).isoformat()}
    return {
        "no filter": {},
        "state=FAILED": {"state": ["FAILED"]},
        "state=PARTLY_FAILED,FAILED": {"state": ["PARTLY_FAILED", "FAILED"]},
        "state=OK": {"state": ["OK"]},
        "service": {"service": "svc1"},
        "service+operation": {"service": "svc1", "operation": "op2"},
        "source_system": {"source_system": "src2"},
        "entity_type": {"entity_type": "customer"},
        "correlation_id": {"correlation_id": f"bench-{middle}"},
        "object_id": {"object_id": "obj-4242"},
        "process_id": {"process_id": f"p-{middle // 10}"},
        "received 1 h window": window,
        "received 1 day window": day,
        "correlation_id+source_system": {"correlation_id": f"bench-{middle}", "source_system": f"src{middle % 4}"},
        "object_id+entity_type": {"object_id": "obj-4242", "entity_type": "customer"},
        "process_id+state": {"process_id": f"p-{middle // 10}", "state": ["OK"]},
        "object_id+1 day window": {"object_id": "obj-4242", **day},
        "state=FAILED+1 h window": {"state": ["FAILED"], **window},
        "service+op+FAILED+1 day": {"service": "svc1", "operation": "op1", "state": ["FAILED"], **day},
        "service+op+FAILED+source": {"service": "svc1", "operation": "op1", "state": ["FAILED"],
                                     "source_system": "src1"},
        # what went wrong (issue 26; migration 0009: error code index, trigram indexes)
        "error_code": {"error_code": ["HLR_DOWN"]},
        "error_code list": {"error_code": ["HLR_DOWN", "TIMEOUT"]},
        "error_code+FAILED+1 day": {"error_code": ["TIMEOUT"], "state": ["FAILED"], **day},
        "error_text": {"error_text": f"hlr {middle} is"},
        "payload_text": {"payload_text": f'id="{middle}"'},
        "payload_text+service": {"payload_text": f'id="{middle}"', "service": f"svc{middle % 5}"},
        "payload_text (no match)": {"payload_text": 'id="nothing"'},
        "error_code+state (no match)": {"error_code": ["HLR_DOWN"], "state": ["OK"]},
    }


def _plan_lines(plan: dict[str, Any], depth: int = 0) -> list[str]:
    node = plan["Node Type"]
    index = f" using {plan['Index Name']}" if "Index Name" in plan else ""
    rows = f" rows={plan.get('Actual Rows')}"
    lines = [f"{'  ' * depth}{node}{index}{rows}"]
    for child in plan.get("Plans", []):
        lines.extend(_plan_lines(child, depth + 1))
    return lines


def explain(connection: sa.Connection, statement: sa.Select[Any]) -> list[str]:
    compiled = statement.compile(dialect=connection.dialect, compile_kwargs={"render_postcompile": True})
    params = {k: str(v) if hasattr(v, "value") else v for k, v in compiled.params.items()}
    document = connection.exec_driver_sql(f"EXPLAIN (ANALYZE, FORMAT JSON) {compiled.string}", params).scalar_one()
    document = json.loads(document) if isinstance(document, str) else document
    return [*_plan_lines(document[0]["Plan"]), f"execution {document[0]['Execution Time']:.2f} ms"]


def through_http(url: str, user: str, password: str, rows: int, repeat: int) -> None:
    """Every query as ``GET /admin/messages`` (capped count + page of 50) and ``GET /admin/counts`` on a running
    server, ``repeat`` interleaved rounds; p50 / p95 / max in ms, the goal of issue 26 (< 10 ms p95)."""
    import httpx

    goal = 10.0
    cases = queries(rows)
    timings: dict[str, list[float]] = {name: [] for name in [*cases, "/admin/counts"]}
    with httpx.Client(base_url=url.rstrip("/"), auth=(user, password), timeout=30) as client:
        for name, params in cases.items():  # one warm-up call each, and the answers must be right
            answer = client.get("/admin/messages", params={**params, "limit": "50"})
            assert answer.status_code == 200, f"{name}: HTTP {answer.status_code} {answer.text[:200]}"
        for _round in range(repeat):
            for name, params in [*cases.items(), ("/admin/counts", None)]:
                started = time.perf_counter()
                if params is None:
                    answer = client.get("/admin/counts")
                else:
                    answer = client.get("/admin/messages", params={**params, "limit": "50"})
                timings[name].append((time.perf_counter() - started) * 1000)
                assert answer.status_code == 200
    print(f"admin benchmark through HTTP ({url}): {rows:,} messages, {repeat} interleaved rounds (ms)")
    print(f"{'query':32} {'p50':>7} {'p95':>7} {'max':>7}  goal < {goal:.0f} ms")
    for name, values in timings.items():
        values.sort()
        p95 = values[max(int(len(values) * 0.95) - 1, 0)]
        print(f"{name:32} {statistics.median(values):7.2f} {p95:7.2f} {values[-1]:7.2f}  "
              f"{'ok' if p95 < goal else 'SLOW'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=30)
    parser.add_argument("--plans", action="store_true", help="print the plan of every query")
    parser.add_argument("--rebuild", action="store_true", help="drop and rebuild the bench database")
    parser.add_argument("--http", metavar="URL", default=None,
                        help="measure through HTTP: the admin API of a server already serving the bench database "
                             "(openroute run --database-url <it>); user --user, password OPENROUTE_ADMIN_PASSWORD")
    parser.add_argument("--user", default="ops")
    args = parser.parse_args()
    store = build(args.rows, args.rebuild)
    if args.http:
        store.dispose()
        through_http(args.http, args.user, os.environ.get("OPENROUTE_ADMIN_PASSWORD", ""), args.rows, args.repeat)
        return
    cases = {name: parse_filters(params) for name, params in queries(args.rows).items()}
    counts = MessageCounts(store.engine, final_ttl=60, route_ttl=0)
    timings: dict[str, list[float]] = {name: [] for name in [*cases, "next page (cursor)", "/admin/counts",
                                                               "/metrics backlog"]}
    with store.engine.connect() as connection:
        first = search_messages(connection, cases["no filter"])
        counts.by_state()  # the final-state counts are cached (refreshed at most every final_ttl seconds)
        for _round in range(args.repeat):  # interleaved: one round runs every query once
            for name, filters in cases.items():
                started = time.perf_counter()
                page = search_messages(connection, filters, None, 50)
                timings[name].append((time.perf_counter() - started) * 1000)
                assert page.items or "no match" in name, f"{name}: no match (the fill has none: fix the query)"
            started = time.perf_counter()
            search_messages(connection, cases["no filter"], first.next_cursor, 50)
            timings["next page (cursor)"].append((time.perf_counter() - started) * 1000)
            connection.rollback()
            started = time.perf_counter()
            counts.by_state()
            timings["/admin/counts"].append((time.perf_counter() - started) * 1000)
            started = time.perf_counter()
            counts.open_by_route()
            timings["/metrics backlog"].append((time.perf_counter() - started) * 1000)
        print(f"admin benchmark: {args.rows:,} messages on PostgreSQL, {args.repeat} interleaved rounds, "
              f"search = capped count + page of 50 (ms)")
        print(f"{'query':32} {'p50':>7} {'p95':>7} {'max':>7}  total  goal < {GOAL_MS:.0f} ms")
        worst = 0.0
        for name, values in timings.items():
            values.sort()
            p50, p95 = statistics.median(values), values[max(int(len(values) * 0.95) - 1, 0)]
            worst = max(worst, p95)
            total = ""
            if name in cases:
                page = search_messages(connection, cases[name], None, 50)
                total = f"{page.total}{'~' if page.total_estimated else ''}"
            print(f"{name:32} {p50:7.2f} {p95:7.2f} {values[-1]:7.2f}  {total:>8} "
                  f"{'ok' if p95 < GOAL_MS else 'SLOW'}")
        print(f"worst p95 {worst:.2f} ms ({'every query under' if worst < GOAL_MS else 'above'} the goal)")
        if args.plans:
            for name, filters in cases.items():
                print(f"\n== {name}: page")
                print("\n".join(explain(connection, page_statement(filters, None, 50))))
                print(f"== {name}: capped count")
                print("\n".join(explain(connection, count_statement(filters))))
    store.dispose()


if __name__ == "__main__":
    main()
