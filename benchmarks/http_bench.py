"""Accepted requests/s and latency of the inbound endpoints through uvicorn, against a group-commit floor.

For each database kind (SQLite, and PostgreSQL when the server is reachable) three servers are measured, each in
its own uvicorn process on a free loopback port (uvicorn with httptools), ``--repeat`` times, interleaved (one
repetition runs floor, JSON and SOAP once each, in an order rotated from one repetition to the next). **Every run has
a database of its own**, fresh (a SQLite file, a PostgreSQL database made for the run and dropped after it): when the
three shared one, the later runs met the table, the index's pending lists and the autovacuum runs the earlier ones'
rows had left, and where that landed decided a repetition's ratio. A run is ``--count`` requests (20,000 by default,
several seconds: long enough that each run meets its own collector passes, WAL checkpoints and, on a server where
autovacuum is on, its vacuum of the rows it wrote) after a warm-up of 300:

* ``floor``: a bare Starlette endpoint that reads the body and stores it with the engine's own grouped INSERT
  (``MessageStore.insert_messages`` through the group-commit writer), the object id and funnel value the node
  extracts included (``json.loads`` of the body, the least parsing that finds them: the row and its index entries
  are the node's), and runs the node's payload indexer beside it (PostgreSQL: the payload search's index is written
  behind the commit): the same database work, no inbound layer
* ``json``:  ``POST /api/bench/submit`` through the whole inbound layer and ``Engine.accept``
* ``soap``:  ``POST /soap/bench`` (SOAP 1.1) through the whole inbound layer and ``Engine.accept``

The load generator is a raw asyncio HTTP/1.1 client in this process (pre-built request bytes, keep-alive
connections, ``--concurrency`` in flight): it costs a few tens of microseconds per request, so the floor is
limited by the server, not by the client (a floor under 1,000 req/s on this machine would mean the client is the
limit; each run prints how busy the client was, the server's CPU per request and its group-commit writer's
operations per transaction). Run:
``python benchmarks/http_bench.py [--count 20000] [--concurrency 32] [--repeat 3]
[--databases sqlite,postgres]``. It prints req/s, p50 / p99 per run and min / median / max of each endpoint's
ratio to the floor (the goals, issue #45, at the minimum: JSON >= 0.75, SOAP >= 0.7), and of its CPU ratio: the
floor's server CPU per request over the endpoint's, what the rate ratio would be for a server bound by its own CPU
(steadier on a machine whose speed moves between runs). Each run's CPU per request is also split into the server's
main thread (HTTP, parsing, the inbound layer), its other threads (the group-commit writer) and, against a local
PostgreSQL, the database's processes; at 32 in flight these add up along one commit cycle (:func:`cycle_parts`), so
their sums say where an endpoint's distance to the floor sits.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks._common import arguments, free_port, fresh_database, spread, wait_for_port  # noqa: E402

POSTGRES_ADMIN_URL = os.environ.get("OPENROUTE_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
NS = "urn:example:bench:v1"
JSON_BODY = {"orderId": "O-{n}", "customer": {"id": "C-{n}"}, "items": [{"sku": "A", "qty": 2}]}
SOAP_BODY = (
    '<?xml version="1.0" encoding="UTF-8"?><e:Envelope xmlns:e="http://schemas.xmlsoap.org/soap/envelope/">'
    "<e:Header><t:traceHeader xmlns:t=\"urn:openroute:trace:v1\"><t:correlationId>{cid}</t:correlationId>"
    "</t:traceHeader></e:Header><e:Body>"
    f'<b:submit xmlns:b="{NS}"><b:orderId>O-{{n}}</b:orderId><b:customer><b:id>C-{{n}}</b:id></b:customer>'
    "<b:items><b:item><b:sku>A</b:sku><b:qty>2</b:qty></b:item></b:items></b:submit></e:Body></e:Envelope>"
)


# -- the servers (run in a child process) -----------------------------------------------------------------------
def floor_app(url: str):  # type: ignore[no-untyped-def]
    from openroute.persistence import MessageStore, NewMessage
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    from openroute.engine._writer import GroupCommitWriter, Grouped
    from openroute.jobs.payload_indexer import PayloadIndexer

    store = MessageStore(url)
    writer = GroupCommitWriter(store.engine)
    group = Grouped(lambda connection, batch: store.insert_messages(batch, connection), "insert")

    async def submit(request: Request) -> JSONResponse:
        body = (await request.body()).decode()
        # the row the node stores: its object id and funnel value too (their index entries are database work the
        # node's accept pays), read with the least parsing that finds them
        document = json.loads(body)
        new = NewMessage(service="bench", operation="submit", payload=body,
                         content_type=request.headers.get("content-type", "application/json"),
                         correlation_id=request.headers.get("x-correlation-id") or uuid.uuid4().hex,
                         source_system="BENCH", receive_ts=datetime.now(UTC),
                         object_id=document["orderId"], funnel_value=document["customer"]["id"])
        outcome = await writer.submit_grouped(group, new)
        return JSONResponse({"messageId": outcome.message.id}, 202)

    @contextlib.asynccontextmanager
    async def lifespan(_app: Starlette) -> Any:
        # the payload search's index, written behind the commit by the node's indexer (migration 0018): the floor runs
        # the same indexer, so both do the same database work for a stored message
        stop = asyncio.Event()
        indexing = asyncio.create_task(PayloadIndexer(store).run(stop))
        yield
        stop.set()
        await indexing

    app = Starlette(routes=[Route("/api/bench/submit", submit, methods=["POST"])], lifespan=lifespan)
    app.state.writer = writer
    return app


def openroute_app(url: str):  # type: ignore[no-untyped-def]
    from openroute.definitions.route import Route, RouteRegistry
    from openroute.engine import Engine, EngineSettings
    from openroute.inbound import InboundBinding, QName
    from openroute.node import Node

    registry = RouteRegistry([Route("bench", "submit", [lambda exchange: None])])
    bindings = [
        InboundBinding("bench", "submit", "xml", request_element=QName(NS, "submit"), namespaces={"b": NS},
                       required=["b:orderId"], object_id="b:orderId", funnel_value="b:customer/b:id"),
        InboundBinding("bench", "submit", "json", required=["$.orderId"], object_id="$.orderId",
                       funnel_value="$.customer.id"),
    ]
    # the engine only accepts here (no workers started): the benchmark measures the inbound path
    engine = Engine(url, registry, EngineSettings(repoll_interval=None, node_id="bench"))
    app = Node(engine, bindings, manage_engine=False).app
    app.state.writer = engine._pipeline.writer  # the group-commit writer's counters (internal: a benchmark may look)
    return app


def serve(kind: str, url: str, port: int, counts: str) -> None:
    """Serve ``kind`` on ``port``; on SIGUSR1 write the writer's transactions and operations so far to ``counts``."""
    import uvicorn

    app = floor_app(url) if kind == "floor" else openroute_app(url)
    writer = app.state.writer

    def write_counts(_signal: int, _frame: object) -> None:
        written = Path(counts + ".tmp")
        written.write_text(f"{writer.transactions} {writer.operations}")
        written.replace(counts)  # whole, never half-written, when the client reads it

    signal.signal(signal.SIGUSR1, write_counts)
    # start-up's objects out of the collector's reach, as `openroute run` puts them once it serves (both servers:
    # the same collector treatment); unfrozen, every full collection walked the node's ~150,000 of them
    gc.freeze()
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", access_log=False)


# -- the load generator -----------------------------------------------------------------------------------------
def requests_for(kind: str, count: int) -> list[bytes]:
    """The raw HTTP/1.1 requests of one run, built before the clock starts."""
    run_id = uuid.uuid4().hex[:8]
    built = []
    for n in range(count):
        cid = f"{run_id}-{n}"
        if kind == "soap":
            path, body, content_type = "/soap/bench", SOAP_BODY.format(cid=cid, n=n).encode(), "text/xml"
        else:
            path, content_type = "/api/bench/submit", "application/json"
            body = json.dumps(JSON_BODY).replace("{n}", str(n)).encode()
        head = (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: {content_type}\r\n"
                f"X-Correlation-Id: {cid}\r\nX-Source-System: BENCH\r\nContent-Length: {len(body)}\r\n\r\n")
        built.append(head.encode() + body)
    return built


async def _exchange(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, request: bytes) -> int:
    writer.write(request)
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head[9:12])
    length = 0
    for line in head.split(b"\r\n"):
        if line[:15].lower() == b"content-length:":
            length = int(line[15:])
    if length:
        await reader.readexactly(length)
    return status


async def closed_loop(port: int, requests: list[bytes], senders: int) -> tuple[list[float], int]:
    """``requests`` over ``senders`` keep-alive connections of a raw asyncio HTTP/1.1 client, each sending its next
    request once the last one was answered; the latencies of the accepted requests (200, 202) and how many were not."""
    latencies: list[float] = []
    errors = 0
    position = iter(range(len(requests)))

    async def connection() -> None:
        nonlocal errors
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            for n in position:
                started = time.perf_counter()
                status = await _exchange(reader, writer, requests[n])
                if status in (200, 202):
                    latencies.append(time.perf_counter() - started)
                else:
                    errors += 1
        finally:
            writer.close()

    await asyncio.gather(*(connection() for _ in range(senders)))
    return latencies, errors


async def load(kind: str, port: int, count: int, concurrency: int) -> dict[str, float]:
    """``count`` requests over ``concurrency`` keep-alive connections of a raw asyncio HTTP/1.1 client."""
    started = time.perf_counter()
    latencies, errors = await closed_loop(port, requests_for(kind, count), concurrency)
    elapsed = time.perf_counter() - started
    latencies.sort()
    return {
        "rps": count / elapsed,
        "p50_ms": statistics.median(latencies) * 1000,
        "p99_ms": latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))] * 1000,
        "errors": errors,
    }


def _cpu_seconds(stat: Path) -> float | None:
    """User + system CPU time from a /proc ``stat`` file (a process's or a thread's); None when it cannot be read."""
    try:
        fields = stat.read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def process_cpu_seconds(pid: int) -> float | None:
    """User + system CPU time of process ``pid`` (all its threads) from /proc; None where there is no /proc."""
    return _cpu_seconds(Path(f"/proc/{pid}/stat"))


def main_thread_cpu_seconds(pid: int) -> float | None:
    """CPU time of process ``pid``'s main thread (the event loop: HTTP, parsing, the inbound layer); the rest of
    the process's CPU is its other threads', the group-commit writer's above all."""
    return _cpu_seconds(Path(f"/proc/{pid}/task/{pid}/stat"))


def local_postgres_cpu_seconds() -> float | None:
    """CPU time of every PostgreSQL process on this machine (its backends, WAL writer, checkpointer, autovacuum):
    the database's share of a run against a local server. None without /proc or without such a process."""
    total, found = 0.0, False
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if (entry / "comm").read_text().strip() != "postgres":
                continue
        except OSError:
            continue
        seconds = _cpu_seconds(entry / "stat")
        if seconds is not None:
            total, found = total + seconds, True
    return total if found else None


def writer_counts(process: subprocess.Popen[bytes], counts: Path) -> tuple[int, int] | None:
    """The server's group-commit writer's (transactions, operations) so far, asked by SIGUSR1; None without an
    answer within 5 s."""
    counts.unlink(missing_ok=True)
    process.send_signal(signal.SIGUSR1)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        if counts.exists():
            transactions, operations = counts.read_text().split()
            return int(transactions), int(operations)
        time.sleep(0.01)
    return None


def measure(kind: str, url: str, count: int, concurrency: int) -> dict[str, float]:
    """One run: req/s and latencies, plus the server's CPU per request, the writer's operations per transaction
    and how busy the client was (a client near 100 % would be the limit, not the server)."""
    port = free_port()
    with tempfile.TemporaryDirectory() as folder:
        counts = Path(folder) / "writer"
        process = subprocess.Popen([sys.executable, __file__, "serve", kind, url, str(port), str(counts)], cwd=ROOT)
        try:
            wait_for_port(port, process)
            asyncio.run(load(kind, port, min(300, count), concurrency))  # warm-up
            writer_before = writer_counts(process, counts)
            postgres = "postgresql" in url
            server_before, main_before = process_cpu_seconds(process.pid), main_thread_cpu_seconds(process.pid)
            database_before = local_postgres_cpu_seconds() if postgres else None
            client_before, started = time.process_time(), time.perf_counter()
            figures = asyncio.run(load(kind, port, count, concurrency))
            server_after, client_cpu = process_cpu_seconds(process.pid), time.process_time() - client_before
            main_after = main_thread_cpu_seconds(process.pid)
            database_after = local_postgres_cpu_seconds() if postgres else None
            wall = time.perf_counter() - started
            writer_after = writer_counts(process, counts)
            figures["client_busy"] = client_cpu / wall
            if server_before is not None and server_after is not None:
                figures["server_us"] = (server_after - server_before) / count * 1e6
                if main_before is not None and main_after is not None:
                    figures["main_us"] = (main_after - main_before) / count * 1e6
                    figures["threads_us"] = figures["server_us"] - figures["main_us"]
            if database_before is not None and database_after is not None:
                figures["database_us"] = (database_after - database_before) / count * 1e6
            if writer_before is not None and writer_after is not None and writer_after[0] > writer_before[0]:
                figures["batch"] = (writer_after[1] - writer_before[1]) / (writer_after[0] - writer_before[0])
            return figures
        finally:
            process.terminate()
            process.wait(30)


def report(db: str, database: str, count: int, concurrency: int, repeat: int) -> None:
    """``repeat`` interleaved repetitions of the three servers, each run on a fresh database of kind ``database``
    (``sqlite`` or ``postgres``), then their spread."""
    kinds = ("floor", "json", "soap")
    runs: dict[str, list[dict[str, float]]] = {kind: [] for kind in kinds}
    for rep in range(repeat):
        for kind in kinds[rep % 3:] + kinds[:rep % 3]:
            with fresh_database(database, "openroute_bench", admin_url=POSTGRES_ADMIN_URL) as url:
                figures = measure(kind, url, count, concurrency)
            runs[kind].append(figures)
            server = f"{figures['server_us']:5.0f}" if "server_us" in figures else "    ?"
            batch = f"{figures['batch']:5.1f}" if "batch" in figures else "    ?"
            print(f"  rep {rep + 1} {db:10} {kind:5} {figures['rps']:7.0f} req/s  "
                  f"p50 {figures['p50_ms']:6.1f} ms  p99 {figures['p99_ms']:7.1f} ms  "
                  f"server CPU {server} us/req {_parts(figures)} writes/commit {batch}  "
                  f"client busy {figures['client_busy']:4.0%}  errors {figures['errors']:.0f}", flush=True)
    print(f"{db:10} {'':5} {'req/s':>20} {'p50 ms':>20} {'p99 ms':>22} {'server CPU us/req':>18} "
          f"{'writes/commit':>18} {'ratio to floor':>18} {'CPU ratio':>18}   (min / median / max)")
    for kind in kinds:
        ratios = [r["rps"] / f["rps"] for r, f in zip(runs[kind], runs["floor"], strict=True)]
        cpu = [r["server_us"] for r in runs[kind] if "server_us" in r]
        # the floor's CPU per request over this server's, repetition by repetition: what the rate ratio would be for
        # a server bound by its own CPU (one interpreter), steadier than the rates on a machine whose speed moves
        # (a run too short for the clock's ticks, 10 ms, reads 0 CPU: no ratio from it)
        cpu_ratios = [f["server_us"] / r["server_us"] for r, f in zip(runs[kind], runs["floor"], strict=True)
                      if r.get("server_us", 0) > 0 and "server_us" in f]
        batches = [r["batch"] for r in runs[kind] if "batch" in r]
        print(f"{db:10} {kind:5} {spread([r['rps'] for r in runs[kind]]):>20} "
              f"{spread([r['p50_ms'] for r in runs[kind]], 1):>20} "
              f"{spread([r['p99_ms'] for r in runs[kind]], 1):>22} {spread(cpu) if cpu else '?':>18} "
              f"{spread(batches, 1) if batches else '?':>18} {spread(ratios, 2):>18} "
              f"{spread(cpu_ratios, 2) if cpu_ratios else '?':>18}")
    busiest = max(r["client_busy"] for kind in kinds for r in runs[kind])
    print(f"{db:10} the client was at most {busiest:.0%} busy (one core): the servers, not it, set the pace")
    cycle_parts(db, runs)


#: the parts of a request's CPU that :func:`measure` tells apart: (key, column title, short name), in print order
PARTS = (("main_us", "main thread", "main"), ("threads_us", "other threads", "threads"),
         ("database_us", "database", "database"))


def _parts(figures: dict[str, float]) -> str:
    """``(main M + threads T + database D)`` of one run: the parts it has, in microseconds per request."""
    named = [f"{short} {figures[key]:.0f}" for key, _title, short in PARTS if key in figures]
    return f"({' + '.join(named)})" if named else ""


def cycle_parts(db: str, runs: dict[str, list[dict[str, float]]]) -> None:
    """Medians of the CPU parts per request, their sum, and the floor's sum over each endpoint's.

    With ``--concurrency`` not far above a commit's batch, nearly every request in flight waits on the same commit:
    the loop parses a batch while the writer waits for it, then the writer and the database write it while the loop
    has little to parse. The parts then add up along one cycle, and the floor's sum over an endpoint's comes near
    its rate ratio; the parts say where an endpoint's extra sits. The database's part is every local PostgreSQL
    process's CPU during the run (autovacuum included: it runs beside the cycle, so it counts where it lands);
    SQLite's work is in the writer thread."""
    present = [(key, title) for key, title, _short in PARTS if all(key in r for kind in runs for r in runs[kind])]
    if not present:
        return
    sums = {kind: sum(statistics.median(r[key] for r in measured) for key, _ in present)
            for kind, measured in runs.items()}
    header = "  ".join(f"{title:>13}" for _, title in present)
    print(f"{db:10} {'':5} {header}  {'sum us/req':>10}  {'floor sum / sum':>15}   (medians)")
    for kind, measured in runs.items():
        parts = "  ".join(f"{statistics.median(r[key] for r in measured):13.0f}" for key, _ in present)
        ratio = f"{sums['floor'] / sums[kind]:15.2f}" if sums[kind] > 0 else f"{'?':>15}"
        print(f"{db:10} {kind:5} {parts}  {sums[kind]:10.0f}  {ratio}")


def main() -> None:
    parser = arguments(__doc__, count=20000)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--databases", default="sqlite,postgres",
                        help="comma-separated: sqlite, postgres (default both, as lifecycle_bench.py)")
    args = parser.parse_args()
    if args.count < 1 or args.concurrency < 1 or args.repeat < 1:
        parser.error("--count, --concurrency and --repeat must be positive")
    chosen = {name.strip() for name in args.databases.split(",") if name.strip()}
    if not chosen or not chosen <= {"sqlite", "postgres"}:
        parser.error(f"--databases takes sqlite and/or postgres, got {args.databases!r}")
    print(f"{os.cpu_count()} CPUs (shared), {args.count} requests per run, {args.concurrency} in flight, loopback, "
          f"{args.repeat} interleaved repetitions")
    for kind, db in (("sqlite", "sqlite"), ("postgres", "postgresql")):
        if kind not in chosen:
            continue
        try:
            with fresh_database(kind, "openroute_bench", admin_url=POSTGRES_ADMIN_URL):
                pass
        except Exception as error:  # no server: SQLite only, and say so
            print(f"PostgreSQL not available ({type(error).__name__}): SQLite only")
            continue
        report(db, kind, args.count, args.concurrency, args.repeat)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "serve":
        serve(sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5])
    else:
        main()
