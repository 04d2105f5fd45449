"""Admin benchmark: search, counts and metrics on a 1,000,000-message store on PostgreSQL.

    python benchmarks/admin_bench.py [--rows 1000000] [--repeat 30] [--plans] [--rebuild] [--http URL --user U]

The store is built once with set-based SQL (``benchmarks/store_fill.py``: 97 % OK, 2 % FAILED, 1 %
PARTLY_FAILED, 20 routes, receive times one second apart) in its own database (``openroute_bench`` on the
server of OPENROUTE_BENCH_POSTGRES_URL, default the local test server; OPENROUTE_BENCH_DATABASE names another),
aged as production ages a table (``store_fill.wear``: rows written again, VACUUM ANALYZE, a backlog, rarer
error codes, dead rows left between autovacuum runs, ANALYZE), and reused by later runs while its row count
matches ``--rows`` and it is marked worn. Every search the admin API and the console offer (filters alone and
combined, lists, texts, windows, searches that match nothing), runs through
:func:`openroute.queries.search.search_messages` (the function behind ``GET /admin/messages`` and the console: a
page of 50 and, when the page is full, a capped count).

* default: ``--repeat`` interleaved rounds of direct calls, p50 / p95 / max in ms;
* ``--plans``: EXPLAIN (ANALYZE, BUFFERS) of every statement one search call runs, first page and next page:
  execution time (nearly load-independent for reads this small) and the rows the scans read, then the plans;
  and the reads of ``/admin/counts`` and the dashboard (the stored counts, and the ``GROUP BY`` of before 0014);
* ``--http URL``: the same searches (and some next pages) as ``GET /admin/messages``, some of them as the console's
  list (``GET /console/messages``), ``GET /admin/counts`` and the console's dashboard,
  against a server already serving the store (``openroute run --config benchmarks/admin_bench.toml
  --database-url <the store>``); goal of issue 26: < 10 ms p95 each. The newest day of the store is first moved
  to the present (``store_fill.bring_up_to_date``), so that the dashboard's windows (the last hour, 24 h) hold a
  day of traffic, as a live store's do, and not nothing. Each API search is also sent to a floor started beside
  the server (``benchmarks/admin_floor.py``: a bare Starlette endpoint running the same search, no middleware,
  no authentication, no engine), the two alternated within a round, and its p50 / p95 and the server's p50 over
  the floor's are printed: what the machine itself takes for that search through HTTP, and what the node adds.
"""

from __future__ import annotations

import argparse
import base64
import http.client
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlencode, urlsplit

import sqlalchemy as sa

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from openroute.persistence import FINAL_STATES, MessageStore, NodeState, message_table
from openroute.persistence.counts import (
    finished_by_minute_statement,
    route_counts_statement,
    state_counts_statement,
)

from benchmarks._common import free_port, wait_for_port
from benchmarks.store_fill import MIXED, START, bring_up_to_date, fill, wear, worn
from openroute.definitions.route import RouteRegistry
from openroute.jobs.counts import OPEN_STATES, MessageCounts, counts_statement
from openroute.queries.dashboard import THROUGHPUT_WINDOW, dashboard, latest_failures_statement
from openroute.queries.filters import SearchFilters, parse_filters
from openroute.queries.search import search_messages

SERVER_URL = os.environ.get("OPENROUTE_BENCH_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
DATABASE = os.environ.get("OPENROUTE_BENCH_DATABASE", "openroute_bench")
GOAL_MS = 10.0  # issue 26: < 10 ms p95 through HTTP


#: the ``--http`` server's node (admin_bench.toml), STOPPED in the store: its start-up repoll would repair the fill's
#: stuck PROCESSING messages and queue its NEW backlog (a STOPPED node picks up no work)
BENCH_NODE = "admin-bench"


def no_routes() -> RouteRegistry:
    """The ``--http`` server's application (``routes`` in admin_bench.toml): it serves the admin API only."""
    return RouteRegistry()


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
        aged = worn(connection)
    if have != rows or not aged:
        print(f"building {rows:,} messages in {DATABASE} (had {have:,}) ...", flush=True)
        started = time.perf_counter()
        with store.engine.begin() as connection:
            connection.execute(sa.text("TRUNCATE message RESTART IDENTITY CASCADE"))
        chunk = 250_000
        for first in range(1, rows + 1, chunk):
            with store.engine.begin() as connection:
                fill(connection, min(chunk, rows - first + 1), MIXED, "bench", first=first)
        wear(store.engine, rows)
        store.counts.recount()  # the fill writes states without transition rows (persistence/counts.py)
        print(f"built in {time.perf_counter() - started:.1f} s", flush=True)
    if store.nodes.state_of(BENCH_NODE) is None:
        store.nodes.register(BENCH_NODE, datetime.now(UTC))
    store.nodes.set_state(BENCH_NODE, NodeState.STOPPED)
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
        # the rest of what the API and the console offer (aged store: see store_fill.wear)
        "operation": {"operation": "op2"},
        "state=CANCEL": {"state": ["CANCEL"]},
        "state=NEW (backlog)": {"state": ["NEW"]},
        "state=3 open states": {"state": ["NEW", "PROCESSING", "POSTPONED"]},
        "state=FAILED+source_system": {"state": ["FAILED"], "source_system": "src1"},
        "received_from (open end)": {"received_from": hour.isoformat()},
        "received_to (open start)": {"received_to": hour.isoformat()},
        "error_code rare": {"error_code": ["E03"]},
        "error_code list of 12 rare": {"error_code": [f"E{n:02d}" for n in range(1, 13)]},
        "error_code list+service": {"error_code": ["HLR_DOWN", "TIMEOUT", "E03"], "service": "svc2"},
        "error_code+error_text": {"error_code": ["HLR_DOWN"], "error_text": "is down"},
        "error_text+FAILED+1 day": {"error_text": "timeout", "state": ["FAILED"], **day},
        "payload_text+1 day window": {"payload_text": f'"{middle + 12345}', **day},
        "everything": {"service": "svc1", "operation": "op1", "state": ["FAILED"], "source_system": "src1",
                       "error_code": ["TIMEOUT"], "error_text": "timeout", **day},
        "service (no match)": {"service": "nope"},
        "operation (no match)": {"operation": "nope"},
        "source_system (no match)": {"source_system": "nope"},
        "entity_type (no match)": {"entity_type": "nope"},
        "correlation_id (no match)": {"correlation_id": "nope"},
        "error_code (no match)": {"error_code": ["NOPE"]},
        "error_text (no match)": {"error_text": "nothing like it"},
        "1 h window (no match)": {"received_from": "2031-01-01T00:00:00+00:00",
                                  "received_to": "2031-01-01T01:00:00+00:00"},
        "state=CANCEL+service (no match)": {"state": ["CANCEL"], "service": "nope"},
    }


def _plan_lines(plan: dict[str, Any], depth: int = 0) -> list[str]:
    node = plan["Node Type"]
    index = f" using {plan['Index Name']}" if "Index Name" in plan else ""
    loops = plan.get("Actual Loops", 1)
    read = f" rows={plan.get('Actual Rows', 0) * loops}"
    removed = plan.get("Rows Removed by Filter", 0) + plan.get("Rows Removed by Index Recheck", 0)
    if removed:
        read += f" removed={removed * loops}"
    if plan.get("Heap Fetches"):
        read += f" heap_fetches={plan['Heap Fetches']}"
    buffers = plan.get("Shared Hit Blocks", 0) + plan.get("Shared Read Blocks", 0)
    lines = [f"{'  ' * depth}{node}{index}{read} buffers={buffers}"]
    for child in plan.get("Plans", []):
        lines.extend(_plan_lines(child, depth + 1))
    return lines


def explain(connection: sa.Connection, statement: sa.Select[Any]) -> tuple[list[str], float]:
    """The plan of ``statement`` (EXPLAIN ANALYZE, BUFFERS): one line per node with the rows it returned, the
    rows its filter removed and the buffers it touched; and the execution time in ms."""
    # the values written into the SQL: a statement with parameters set by .params() or an expanding list rendered
    # when compiled (the dashboard's) has no parameters SQLAlchemy can hand over apart from its SQL
    compiled = statement.compile(dialect=connection.dialect, compile_kwargs={"literal_binds": True})
    document = connection.exec_driver_sql(f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {compiled.string}").scalar_one()
    document = json.loads(document) if isinstance(document, str) else document
    time_ms = float(document[0]["Execution Time"])
    return [*_plan_lines(document[0]["Plan"]), f"execution {time_ms:.2f} ms"], time_ms


def _read(plan: dict[str, Any]) -> int:
    """Rows the scans of ``plan`` read: what they returned plus what their filters removed."""
    loops = plan.get("Actual Loops", 1)
    own = 0
    if "Scan" in plan["Node Type"] and "Subquery" not in plan["Node Type"]:
        own = (plan.get("Actual Rows", 0) + plan.get("Rows Removed by Filter", 0)
               + plan.get("Rows Removed by Index Recheck", 0)) * loops
    return own + sum(_read(child) for child in plan.get("Plans", []))


def _statements(connection: sa.Connection, work: Any) -> list[tuple[str, Any]]:
    """The SQL statements (driver form, parameters) that ``work()`` runs on ``connection``."""
    seen: list[tuple[str, Any]] = []

    def record(_conn: Any, _cursor: Any, statement: str, parameters: Any, _context: Any, _many: bool) -> None:
        seen.append((statement, parameters))

    sa.event.listen(connection, "before_cursor_execute", record)
    try:
        work()
    finally:
        sa.event.remove(connection, "before_cursor_execute", record)
    connection.rollback()
    return seen


def _replay(connection: sa.Connection, statements: list[tuple[str, Any]]) -> tuple[float, int, list[str]]:
    """Run ``statements`` again in one transaction, each query under EXPLAIN (ANALYZE, BUFFERS): the summed
    execution time (ms), the rows their scans read, and their plans."""
    total_ms, read, lines = 0.0, 0, []
    for statement, parameters in statements:
        counted = "EXPLAIN (ANALYZE, TIMING OFF, FORMAT JSON) "  # the capped count with its estimate: replay its query
        statement = statement.removeprefix(counted)
        if statement.lstrip().upper().startswith(("SET", "EXPLAIN")):
            connection.exec_driver_sql(statement, parameters)
            if statement.lstrip().upper().startswith("SET"):
                lines.append(statement)
            continue
        document = connection.exec_driver_sql(f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {statement}",
                                              parameters).scalar_one()
        document = json.loads(document) if isinstance(document, str) else document
        time_ms = float(document[0]["Execution Time"])
        total_ms += time_ms
        read += _read(document[0]["Plan"])
        lines += [*_plan_lines(document[0]["Plan"]), f"execution {time_ms:.2f} ms"]
    connection.rollback()
    return total_ms, read, lines


def plans(connection: sa.Connection, cases: dict[str, SearchFilters], verbose: bool = False) -> None:
    """EXPLAIN (ANALYZE, BUFFERS) of the statements one search call runs (page, and the count when the first page
    is full), for the first page and the next one of every case: summed execution time (nearly load-independent
    for reads this small), rows the scans read, statements run. Each call runs once before, as a repeated search
    finds its pages cached."""
    print(f"{'query':34} {'first ms':>8} {'read':>7} {'sql':>3} {'next ms':>8} {'read':>7} {'sql':>3}  total")
    for name, filters in cases.items():
        first = search_messages(connection, filters, None, 50)
        connection.rollback()
        cells, details = [], []
        for label, cursor in (("first page", None), ("next page", first.next_cursor)):
            if label == "next page" and cursor is None:
                cells.append(f"{'-':>8} {'-':>7} {'-':>3}")
                continue
            statements = _statements(connection, lambda c=cursor, f=filters: search_messages(connection, f, c, 50))
            time_ms, read, lines = _replay(connection, statements)
            queries_run = sum(1 for statement, _ in statements
                              if statement.lstrip().upper().startswith(("SELECT", "EXPLAIN (ANALYZE")))
            cells.append(f"{time_ms:8.2f} {read:7d} {queries_run:3d}")
            details.append((label, lines))
        total = f"{first.total}{'~' if first.total_estimated else ''}"
        print(f"{name:34} {' '.join(cells)}  {total}", flush=True)
        if verbose:
            for label, lines in details:
                print(f"   -- {label}")
                print("\n".join(f"   {line}" for line in lines))
    mark = connection.execute(sa.text("SELECT transition_id FROM message_count_mark")).scalar_one()
    # the dashboard's windows at the store's last change, so they hold what a day of its traffic left
    newest = connection.execute(sa.select(sa.func.max(message_table.c.last_update_ts))).scalar_one()
    c = message_table.c
    failing_routes = [(service, operation) for service, operation in connection.execute(  # what the counts show
        sa.select(c.service, c.operation).where(c.state.in_(["FAILED", "PARTLY_FAILED"])).distinct())]
    counted = [("/admin/counts: stored counts + transitions since the mark", state_counts_statement(mark)),
               ("dashboard: per route, stored + transitions since the mark", route_counts_statement(mark)),
               ("dashboard: last hour's finished per minute and state, kept", finished_by_minute_statement(
                   mark, newest - THROUGHPUT_WINDOW)),
               ("dashboard: latest failure of each failing route", latest_failures_statement(failing_routes)),
               ("(before 0014) open states, counted", counts_statement(OPEN_STATES)),
               ("(before 0014) final states, counted", counts_statement(tuple(FINAL_STATES)))]
    for label, statement in counted:
        lines, time_ms = explain(connection, statement)
        connection.rollback()
        print(f"{label:60} {time_ms:8.2f} ms  {lines[0].strip()}", flush=True)
        if verbose:
            print("\n".join(f"   {line}" for line in lines))


#: the searches the HTTP benchmark also times as the console's list page (the same search, 50 rows as HTML)
CONSOLE_LISTS = ("no filter", "state=FAILED", "correlation_id", "error_code list", "error_code+error_text",
                 "payload_text", "everything")

#: the searches whose second page (after the first page's ``nextCursor``) the HTTP benchmark times too
NEXT_PAGES = ("no filter", "state=PARTLY_FAILED,FAILED", "service+op+FAILED+1 day", "error_code list",
              "received 1 day window")


class LeanClient:
    """GET requests over one kept-alive connection (``http.client``), the request line and headers made before the
    clock starts: the load generator shares the server's two cores, and httpx took 0.7-0.9 ms of CPU per request
    (http.client 0.16-0.19 ms), time that counted in every measured latency."""

    def __init__(self, url: str, user: str, password: str) -> None:
        parsed = urlsplit(url)
        self.connection = http.client.HTTPConnection(parsed.hostname or "127.0.0.1", parsed.port or 80, timeout=30)
        self.prefix = parsed.path.rstrip("/")
        token = base64.b64encode(f"{user}:{password}".encode()).decode()
        self.headers = {"Authorization": f"Basic {token}"}

    @staticmethod
    def target(path: str, params: dict[str, Any] | None = None) -> str:
        """``path`` with ``params`` as its query string (lists repeated, as httpx sends them)."""
        return path + ("?" + urlencode(params, doseq=True) if params else "")

    def get(self, target: str) -> tuple[int, bytes]:
        """(status, body) of ``GET target`` (made by :meth:`target`)."""
        self.connection.request("GET", self.prefix + target, headers=self.headers)
        answer = self.connection.getresponse()
        return answer.status, answer.read()

    def close(self) -> None:
        self.connection.close()


@contextmanager
def floor_server(database_url: str) -> Iterator[str]:
    """``benchmarks/admin_floor.py`` serving the store at ``database_url`` on a free loopback port; its URL."""
    port = free_port()
    process = subprocess.Popen([sys.executable, str(Path(__file__).with_name("admin_floor.py")), database_url,
                                str(port)], cwd=Path(__file__).resolve().parents[1])
    try:
        wait_for_port(port, process, timeout=60)
        yield f"http://127.0.0.1:{port}"
    finally:
        process.terminate()
        process.wait(30)


def _p95(values: list[float]) -> float:
    """The 95th percentile of ``values`` (the value at 95 % of them, sorted; the list is left as it is)."""
    ordered = sorted(values)
    return ordered[max(int(len(ordered) * 0.95) - 1, 0)]


def through_http(
    url: str, user: str, password: str, rows: int, repeat: int, database_url: str
) -> None:
    """Every query as ``GET /admin/messages`` (page of 50 + capped count), the second page of
    :data:`NEXT_PAGES`, and ``GET /admin/counts`` on a running server, ``repeat`` interleaved rounds; p50 / p95 /
    max in ms, the goal of issue 26 (< 10 ms p95). For the counts also the age of the final-state counts it
    answered (``finalStatesAsOf``: exact as of the request since migration 0014). Requests go through
    :class:`LeanClient` (one kept-alive connection, the requests made before the clock starts). Each API search is
    also sent to the floor (:func:`floor_server` on ``database_url``), the server first in even rounds and the
    floor first in odd ones; the floor's answers must be the server's."""
    goal = GOAL_MS
    cases: dict[str, str] = {}
    ages: list[float] = []
    with floor_server(database_url) as floor_url:
        client = LeanClient(url, user, password)
        floor = LeanClient(floor_url, user, password)
        for name, params in queries(rows).items():  # one warm-up call each, and the answers must be right
            target = client.target("/admin/messages", {**params, "limit": "50"})
            status, body = client.get(target)
            assert status == 200, f"{name}: HTTP {status} {body[:200]!r}"
            answer = json.loads(body)
            assert answer["items"] or "no match" in name, f"{name}: no match (fix the query)"
            floor_status, floor_body = floor.get(target)
            assert floor_status == 200 and json.loads(floor_body) == answer, f"{name}: the floor answers otherwise"
            cases[name] = target
            if name in NEXT_PAGES:
                cases[f"{name}: next page"] = client.target("/admin/messages", {**params, "limit": "50",
                                                                                   "cursor": answer["nextCursor"]})
            if name in CONSOLE_LISTS:  # the console's list of the same search: its page of 50 as HTML
                cases[f"/console/messages {name}"] = client.target("/console/messages", params)
        cases["/admin/counts"] = "/admin/counts"
        cases["/console/ (dashboard)"] = "/console/"
        timings: dict[str, list[float]] = {name: [] for name in cases}
        floor_timings: dict[str, list[float]] = {name: [] for name, target in cases.items()
                                                 if target.startswith("/admin/messages")}
        for number in range(repeat):
            for name, target in cases.items():
                order = [(client, timings)] if name not in floor_timings else (
                    [(client, timings), (floor, floor_timings)] if number % 2 == 0
                    else [(floor, floor_timings), (client, timings)])
                for sender, measured in order:
                    started = time.perf_counter()
                    status, body = sender.get(target)
                    measured[name].append((time.perf_counter() - started) * 1000)
                    assert status == 200, f"{name}: HTTP {status}"
                if name == "/admin/counts":
                    as_of = datetime.fromisoformat(json.loads(body)["finalStatesAsOf"])
                    ages.append((datetime.now(UTC) - as_of).total_seconds())
        client.close()
        floor.close()
    print(f"admin benchmark through HTTP ({url}): {rows:,} messages, {repeat} interleaved rounds (ms); the floor: "
          f"the same search on a bare Starlette endpoint, alternated with the server's")
    print(f"{'query':44} {'p50':>7} {'p95':>7} {'max':>7}  goal < {goal:.0f} ms  {'floor p50':>9} {'p95':>7} "
          f"{'p50 / floor':>11}")
    worst = 0.0
    ratios: list[float] = []
    for name, values in timings.items():
        p95 = _p95(values)
        worst = max(worst, p95)
        line = (f"{name:44} {statistics.median(values):7.2f} {p95:7.2f} {max(values):7.2f}  "
                f"{'ok  ' if p95 < goal else 'SLOW'}")
        if name in floor_timings:
            ratio = statistics.median(values) / statistics.median(floor_timings[name])
            ratios.append(ratio)
            line += f"        {statistics.median(floor_timings[name]):9.2f} {_p95(floor_timings[name]):7.2f} " \
                    f"{ratio:11.2f}"
        print(line)
    print(f"worst p95 {worst:.2f} ms (the floor's worst {max(_p95(v) for v in floor_timings.values()):.2f}); "
          f"server p50 / floor p50 over the API searches min / median / max {min(ratios):.2f} / "
          f"{statistics.median(ratios):.2f} / {max(ratios):.2f}; final-state counts answered were "
          f"{min(ages):.1f}-{max(ages):.1f} s old")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=30)
    parser.add_argument("--plans", action="store_true",
                        help="EXPLAIN (ANALYZE, BUFFERS) every statement a search runs: time and rows read")
    parser.add_argument("--rebuild", action="store_true", help="drop and rebuild the bench database")
    parser.add_argument("--http", metavar="URL", default=None,
                        help="measure through HTTP: the admin API of a server already serving the bench database "
                             "(openroute run --database-url <it>); user --user, password OPENROUTE_ADMIN_PASSWORD")
    parser.add_argument("--user", default="ops")
    args = parser.parse_args()
    store = build(args.rows, args.rebuild)
    if args.http:
        # the dashboard's windows end now on the server: they hold the newest day of the fill, as on a live store
        moved = bring_up_to_date(store.engine, datetime.now(UTC))
        if moved:
            store.counts.recount()  # the moved day's transitions (raw SQL) into the counts and their minutes
        board = dashboard(store, datetime.now(UTC))
        print(f"newest day of the store moved to the present ({moved:,} rows): the dashboard's last hour holds "
              f"{sum(board.throughput):,} finished messages, its failing routes {len(board.failing_routes)}")
        store.dispose()
        through_http(args.http, args.user, os.environ.get("OPENROUTE_ADMIN_PASSWORD", ""), args.rows, args.repeat,
                     store.url)
        return
    cases = {name: parse_filters(params) for name, params in queries(args.rows).items()}
    if args.plans:
        with store.engine.connect() as connection:
            plans(connection, cases, verbose=True)
        store.dispose()
        return
    counts = MessageCounts(store, route_ttl=0)
    timings: dict[str, list[float]] = {name: [] for name in [*cases, "next page (cursor)", "/admin/counts",
                                                               "/metrics backlog"]}
    with store.engine.connect() as connection:
        first = search_messages(connection, cases["no filter"])
        counts.by_state()
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
            p50, p95 = statistics.median(values), _p95(values)
            worst = max(worst, p95)
            total = ""
            if name in cases:
                page = search_messages(connection, cases[name], None, 50)
                total = f"{page.total}{'~' if page.total_estimated else ''}"
            print(f"{name:32} {p50:7.2f} {p95:7.2f} {max(values):7.2f}  {total:>8} "
                  f"{'ok' if p95 < GOAL_MS else 'SLOW'}")
        print(f"worst p95 {worst:.2f} ms ({'every query under' if worst < GOAL_MS else 'above'} the goal)")
    store.dispose()


if __name__ == "__main__":
    main()
