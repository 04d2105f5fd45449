"""Accepted requests/s and latency of the inbound endpoints through uvicorn, against a group-commit floor.

For each database kind (SQLite, and PostgreSQL when the server is reachable) four servers are measured, each in
its own uvicorn process on a free loopback port (uvicorn with httptools), ``--repeat`` times, interleaved (one
repetition runs each once, in an order rotated from one repetition to the next). **Every run has a database of its
own**, fresh (a SQLite file, a PostgreSQL database made for the run and dropped after it): when the servers shared
one, the later runs met the table, the index's pending lists and the autovacuum runs the earlier ones' rows had
left, and where that landed decided a repetition's ratio. A run is ``--count`` requests (20,000 by default, several
seconds: long enough that each run meets its own collector passes, WAL checkpoints and, on a server where
autovacuum is on, its vacuum of the rows it wrote) after a warm-up of 300:

* ``json``:  ``POST /api/bench/submit`` through the whole inbound layer and ``Engine.accept``
* ``soap``:  ``POST /soap/bench`` (SOAP 1.1) through the whole inbound layer and ``Engine.accept``
* ``json-floor`` and ``soap-floor``, the floor of each: a bare Starlette endpoint taking the same request that
  stores **the row the node's endpoint stores** with the engine's own grouped INSERT
  (``MessageStore.insert_messages`` through the group-commit writer): the same payload text (SOAP: the body
  element, the envelope's text between the Body's tags, as the node's namespace-cleaned copy of it reads), object
  id, entity type and funnel value (found with the least parsing: ``json.loads``, plain string search), stored
  headers, content type and transition row (the node's id on it), and runs the node's payload indexer beside it
  (PostgreSQL: the payload search's index is written behind the commit): the same database work, no inbound layer.
  After the runs the benchmark compares a row of each floor with its endpoint's (every column but the id,
  correlation id and times, and its transition rows) and stops when they differ.

The load generator is a raw asyncio HTTP/1.1 client in this process (pre-built request bytes, keep-alive
connections, ``--concurrency`` in flight): it costs a few tens of microseconds per request, so the floor is
limited by the server, not by the client (a floor under 1,000 req/s on this machine would mean the client is the
limit; each run prints how busy the client was, the server's CPU per request and its group-commit writer's
operations per transaction). Run:
``python benchmarks/http_bench.py [--count 20000] [--concurrency 32] [--repeat 3]
[--databases sqlite,postgres] [--counters]``. It prints req/s, p50 / p99 per run and min / median / max of each
endpoint's ratio to its floor (the goals, issue #45, at the minimum: JSON >= 0.75, SOAP >= 0.7), and of its CPU
ratio: the floor's server CPU per request over the endpoint's, what the rate ratio would be for a server bound by
its own CPU (steadier on a machine whose speed moves between runs). Each run's CPU per request is also split into
the server's main thread (HTTP, parsing, the inbound layer), its other threads (the group-commit writer) and, against
a local PostgreSQL, the database's processes; at 32 in flight these add up along one commit cycle
(:func:`cycle_parts`), so their sums say where an endpoint's distance to its floor sits.

``--counters`` (PostgreSQL) adds what does not depend on the machine's load, per request over each server's whole
life (start, warm-up, run, stop; read once its connections closed, as a backend writes its statistics when it
exits): the run's database's ``pg_stat_database`` and per table ``pg_stat_user_tables`` counters, the WAL its
blocks took (``pg_walinspect``; commit records, which name no block, aside) and the CPU of each of its backends with
its last statement. ``OPENROUTE_BENCH_DATABASE_PREFIX`` starts the runs' database names (default
``openroute_bench``).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
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
#: how the names of the runs' databases start (on a shared server, each user's own)
DATABASE_PREFIX = os.environ.get("OPENROUTE_BENCH_DATABASE_PREFIX", "openroute_bench")
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
#: the node's endpoint each floor stands for, and the floor of each endpoint
FLOOR_OF = {"json": "json-floor", "soap": "soap-floor"}
KINDS = ("json-floor", "json", "soap-floor", "soap")
#: the engine's node id in the node's server; the floor's transition rows carry it as well
NODE_ID = "bench"


def _between(text: str, start: str, end: str) -> str:
    """The text of ``text`` between the first ``start`` and the ``end`` after it."""
    begin = text.index(start) + len(start)
    return text[begin:text.index(end, begin)]


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
    group = Grouped(lambda connection, batch: store.insert_messages(batch, connection, node_id=NODE_ID), "insert")

    async def stored(request: Request, payload: str, content_type: str, headers: dict[str, str], object_id: str,
                     funnel_value: str) -> JSONResponse:
        # the node's row, column for column (the benchmark compares them): the extracted columns (their index
        # entries are database work the node's accept pays), the entity type the engine defaults to the operation,
        # the endpoint's stored headers and content type, the node id on the transition row
        new = NewMessage(service="bench", operation="submit", payload=payload, content_type=content_type,
                         correlation_id=request.headers.get("x-correlation-id") or uuid.uuid4().hex,
                         source_system="BENCH", receive_ts=datetime.now(UTC), headers=headers,
                         object_id=object_id, entity_type="submit", funnel_value=funnel_value)
        outcome = await writer.submit_grouped(group, new)
        return JSONResponse({"messageId": outcome.message.id}, 202)

    async def submit_json(request: Request) -> JSONResponse:
        body = (await request.body()).decode()
        document = json.loads(body)  # the least parsing that finds the object id and funnel value
        return await stored(request, body, "application/json", {"endpoint": "json"}, document["orderId"],
                            document["customer"]["id"])

    async def submit_soap(request: Request) -> JSONResponse:
        body = (await request.body()).decode()
        # the body element the node stores: it declares the one namespace it uses itself, so the node's copy of it
        # (namespaces cleaned up) is the envelope's text between the Body's tags; its fields by plain string search
        payload = _between(body, "<e:Body>", "</e:Body>")
        return await stored(request, payload, "application/xml", {"endpoint": "soap", "soapVersion": "1.1"},
                            _between(payload, "<b:orderId>", "</b:orderId>"), _between(payload, "<b:id>", "</b:id>"))

    @contextlib.asynccontextmanager
    async def lifespan(_app: Starlette) -> Any:
        # the payload search's index, written behind the commit by the node's indexer (migration 0018): the floor runs
        # the same indexer, so both do the same database work for a stored message
        stop = asyncio.Event()
        indexing = asyncio.create_task(PayloadIndexer(store).run(stop))
        yield
        stop.set()
        await indexing

    app = Starlette(routes=[Route("/api/bench/submit", submit_json, methods=["POST"]),
                            Route("/soap/bench", submit_soap, methods=["POST"])], lifespan=lifespan)
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
    engine = Engine(url, registry, EngineSettings(repoll_interval=None, node_id=NODE_ID))
    app = Node(engine, bindings, manage_engine=False).app
    app.state.writer = engine._pipeline.writer  # the group-commit writer's counters (internal: a benchmark may look)
    return app


def serve(kind: str, url: str, port: int, counts: str) -> None:
    """Serve ``kind`` on ``port``; on SIGUSR1 write the writer's transactions and operations so far to ``counts``."""
    import uvicorn

    app = floor_app(url) if kind in FLOOR_OF.values() else openroute_app(url)
    writer = app.state.writer

    def write_counts(_signal: int, _frame: object) -> None:
        written = Path(counts + ".tmp")
        written.write_text(f"{writer.transactions} {writer.operations}")
        written.replace(counts)  # whole, never half-written, when the client reads it

    signal.signal(signal.SIGUSR1, write_counts)
    # the collector as `openroute run` sets it once it serves (both servers: the same treatment); unfrozen, every
    # full collection walked the node's ~150,000 start-up objects
    from openroute.runtime import collector

    collector.tune_for_serving()
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", access_log=False)


# -- the load generator -----------------------------------------------------------------------------------------
def requests_for(kind: str, count: int) -> list[bytes]:
    """The raw HTTP/1.1 requests of one run, built before the clock starts."""
    run_id = uuid.uuid4().hex[:8]
    built = []
    for n in range(count):
        cid = f"{run_id}-{n}"
        if kind in ("soap", FLOOR_OF["soap"]):
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


async def open_loop(port: int, requests: list[bytes], rate: float, warm: int = 16) -> tuple[list[float], int]:
    """``requests`` sent at ``rate`` a second on a fixed schedule whatever the answers (open loop): each at its time
    on an idle keep-alive connection (a new one when none is idle, ``warm`` opened beforehand); the latencies of the
    accepted requests from their scheduled time, so a late answer delays no later send and hides no wait
    (no coordinated omission), and how many were not accepted."""
    loop = asyncio.get_running_loop()
    # taken oldest first, so every connection is used often (uvicorn closes one idle for 5 s)
    idle = collections.deque([await asyncio.open_connection("127.0.0.1", port) for _ in range(warm)])
    opened = list(idle)
    latencies: list[float] = []
    errors = 0

    async def send(n: int, due: float) -> None:
        nonlocal errors
        while idle:
            connection = idle.popleft()
            try:
                status = await _exchange(*connection, requests[n])
                break
            except (asyncio.IncompleteReadError, ConnectionError):  # closed by the server while idle: the next one
                connection[1].close()
        else:
            connection = await asyncio.open_connection("127.0.0.1", port)
            opened.append(connection)
            status = await _exchange(*connection, requests[n])
        if status in (200, 202):
            latencies.append(loop.time() - due)
        else:
            errors += 1
        idle.append(connection)

    start = loop.time() + 0.05
    sends = []
    for n in range(len(requests)):
        due = start + n / rate
        await asyncio.sleep(max(0.0, due - loop.time()))
        sends.append(asyncio.create_task(send(n, due)))
    await asyncio.gather(*sends)
    for _reader, writer in opened:
        writer.close()
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


# -- what a run stored, and the database's counters -------------------------------------------------------------
#: the columns of a stored message that differ from one message to the next: left out of the rows compared
_VARYING = frozenset({"id", "correlation_id", "receive_ts", "last_update_ts"})


def stored_row(url: str) -> dict[str, Any]:
    """The message a run's server stored for the warm-up's first request (numbered 0), with its transition rows,
    less the columns that differ from one message to the next: what a floor and its endpoint must store alike."""
    import sqlalchemy as sa
    from openroute.persistence.models import message_table, message_transition_table

    engine = sa.create_engine(url, poolclass=sa.NullPool)
    try:
        with engine.connect() as connection:
            row = connection.execute(sa.select(message_table).where(message_table.c.correlation_id.like("%-0"))
                                     .order_by(message_table.c.id).limit(1)).one()
            t = message_transition_table.c
            transitions = connection.execute(
                sa.select(t.from_state, t.to_state, t.node_id, t.attempt, t.error_code, t.cause, t.error_text,
                          t.error_trace).where(t.message_id == row.id).order_by(t.id)).all()
    finally:
        engine.dispose()
    stored = {name: value for name, value in row._mapping.items() if name not in _VARYING}
    stored["transitions"] = [tuple(transition) for transition in transitions]
    return stored


#: pg_stat_database's counters of the run's database, and pg_stat_user_tables' of each of its tables
DATABASE_COUNTERS = ("xact_commit", "xact_rollback", "tup_returned", "tup_fetched", "tup_inserted", "tup_updated",
                     "tup_deleted", "blks_hit", "blks_read")
TABLE_COUNTERS = ("n_tup_ins", "n_tup_upd", "n_tup_hot_upd", "n_tup_del", "seq_scan", "seq_tup_read", "idx_scan",
                  "idx_tup_fetch")


def database_counters(url: str) -> dict[str, Any]:
    """The cumulative counters of the PostgreSQL database of ``url``: ``database.<counter>`` (pg_stat_database),
    ``<table>.<counter>`` (pg_stat_user_tables) and ``lsn``, the WAL's insert position then (bytes). Read from a
    connection of its own in a transaction of its own: the statistics a transaction reads are a snapshot."""
    import sqlalchemy as sa

    engine = sa.create_engine(url, poolclass=sa.NullPool, isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as connection:
            found: dict[str, Any] = {}
            row = connection.execute(sa.text(f"SELECT {', '.join(DATABASE_COUNTERS)} FROM pg_stat_database "
                                             "WHERE datname = current_database()")).one()
            found.update({f"database.{name}": int(value or 0) for name, value in row._mapping.items()})
            for row in connection.execute(sa.text(f"SELECT relname, {', '.join(TABLE_COUNTERS)} "
                                                  "FROM pg_stat_user_tables")):
                values = dict(row._mapping)
                table = values.pop("relname")
                found.update({f"{table}.{name}": int(value or 0) for name, value in values.items()})
            found["lsn"] = int(connection.execute(sa.text("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn")).scalar_one())
            found["oid"] = connection.execute(
                sa.text("SELECT oid FROM pg_database WHERE datname = current_database()")).scalar_one()
            return found
    finally:
        engine.dispose()


def database_wal(url: str, start: int, end: int, oid: int) -> tuple[int, int, int] | None:
    """(records, bytes, full-page-image bytes) of the WAL between the positions ``start`` and ``end`` whose blocks
    are this database's (``pg_walinspect``; commit records name no block and are not in it): on a shared server the
    WAL position alone counts every database's writes. None where the extension or that WAL is not at hand."""
    import sqlalchemy as sa

    engine = sa.create_engine(url, poolclass=sa.NullPool, isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as connection:
            connection.execute(sa.text("CREATE EXTENSION IF NOT EXISTS pg_walinspect"))
            row = connection.execute(sa.text(
                "SELECT count(*), coalesce(sum(record_length), 0), coalesce(sum(fpi_length), 0) "
                "FROM pg_get_wal_records_info(CAST(:start AS pg_lsn), "
                "least(CAST(:end AS pg_lsn), pg_current_wal_flush_lsn())) "
                "WHERE block_ref LIKE :pattern"),
                {"start": _lsn(start), "end": _lsn(end), "pattern": f"%/{oid}/%"}).one()
            return int(row[0]), int(row[1]), int(row[2])
    except Exception as error:  # no pg_walinspect, or the WAL recycled: the counters without it
        print(f"    (the database's WAL not read: {type(error).__name__}: {str(error).splitlines()[0]})")
        return None
    finally:
        engine.dispose()


def _lsn(position: int) -> str:
    return f"{position >> 32:X}/{position & 0xFFFFFFFF:X}"


def database_backends(url: str) -> list[tuple[float, str, str]]:
    """(CPU seconds, backend type, last statement) of every other process serving the database of ``url`` now,
    CPU from /proc (a local server)."""
    import sqlalchemy as sa

    engine = sa.create_engine(url, poolclass=sa.NullPool, isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as connection:
            rows = connection.execute(sa.text(
                "SELECT pid, backend_type, left(regexp_replace(query, '\\s+', ' ', 'g'), 70) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()")).all()
    finally:
        engine.dispose()
    found = []
    for pid, kind, query in rows:
        seconds = _cpu_seconds(Path(f"/proc/{pid}/stat"))
        if seconds is not None:
            found.append((seconds, str(kind), str(query or "")))
    return sorted(found, reverse=True)


def wait_for_backends_gone(url: str, timeout: float = 15.0) -> None:
    """Return once no other process serves the database of ``url`` (a backend writes its statistics as it exits)."""
    import sqlalchemy as sa

    engine = sa.create_engine(url, poolclass=sa.NullPool, isolation_level="AUTOCOMMIT")
    deadline = time.monotonic() + timeout
    try:
        with engine.connect() as connection:
            query = sa.text("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                            "AND pid <> pg_backend_pid()")
            while connection.execute(query).scalar_one() and time.monotonic() < deadline:
                time.sleep(0.05)
    finally:
        engine.dispose()


def counted(before: dict[str, Any], after: dict[str, Any], url: str, requests: int,
            backends: list[tuple[float, str, str]]) -> dict[str, Any]:
    """The counters of a run per request (``requests``: the warm-up's and the run's; the server's start and stop
    are spread over them): each changed counter, the database's WAL and its backends' CPU (µs)."""
    per = {key: (after[key] - before.get(key, 0)) / requests for key in after
           if key not in ("lsn", "oid") and after[key] != before.get(key, 0)}
    wal = database_wal(url, before["lsn"], after["lsn"], after["oid"])
    if wal is not None:
        per["wal.records"], per["wal.bytes"], per["wal.fpi_bytes"] = (value / requests for value in wal)
    per["wal.cluster_bytes"] = (after["lsn"] - before["lsn"]) / requests  # every database's, the others' too
    per["backends"] = [(seconds / requests * 1e6, kind, query) for seconds, kind, query in backends]
    return per


def print_counters(per: dict[str, Any]) -> None:
    """The lines of one run's counters per request: the database's, the WAL, each table's, each backend's CPU."""
    database = "  ".join(f"{name} {per.get(f'database.{name}', 0):.3g}" for name in DATABASE_COUNTERS)
    print(f"      per request: {database}")
    if "wal.bytes" in per:
        print(f"      WAL of this database: {per['wal.records']:.2f} records, {per['wal.bytes']:.0f} bytes "
              f"({per['wal.fpi_bytes']:.0f} of them full pages); the server's, every database's: "
              f"{per['wal.cluster_bytes']:.0f} bytes")
    tables = sorted({key.split(".")[0] for key in per if "." in key} - {"database", "wal"})
    for table in tables:
        values = "  ".join(f"{name} {per[f'{table}.{name}']:.3g}" for name in TABLE_COUNTERS
                           if f"{table}.{name}" in per)
        print(f"      {table:32} {values}")
    total = sum(us for us, _kind, _query in per["backends"])
    print(f"      backends' CPU {total:.0f} us/request: " + "; ".join(
        f"{us:.0f} ({query[:60] if kind == 'client backend' else kind})" for us, kind, query in per["backends"]))


def measure(kind: str, url: str, count: int, concurrency: int,
            counters: bool = False) -> tuple[dict[str, float], dict[str, Any]]:
    """One run: req/s and latencies, plus the server's CPU per request, the writer's operations per transaction
    and how busy the client was (a client near 100 % would be the limit, not the server); and the row the server
    stored for the warm-up's first request (``row``, :func:`stored_row`). With ``counters`` (PostgreSQL) also the
    database's counters per request over the server's whole life (``counters``, :func:`counted`)."""
    port = free_port()
    postgres = "postgresql" in url
    counting = counters and postgres
    warm_up = min(300, count)
    if counting:
        wait_for_backends_gone(url)  # the schema's making counted before, not in the run
    start = database_counters(url) if counting else {}
    with tempfile.TemporaryDirectory() as folder:
        counts = Path(folder) / "writer"
        process = subprocess.Popen([sys.executable, __file__, "serve", kind, url, str(port), str(counts)], cwd=ROOT)
        backends: list[tuple[float, str, str]] = []
        try:
            wait_for_port(port, process)
            asyncio.run(load(kind, port, warm_up, concurrency))
            writer_before = writer_counts(process, counts)
            server_before, main_before = process_cpu_seconds(process.pid), main_thread_cpu_seconds(process.pid)
            database_before = local_postgres_cpu_seconds() if postgres else None
            client_before, started = time.process_time(), time.perf_counter()
            figures = asyncio.run(load(kind, port, count, concurrency))
            server_after, client_cpu = process_cpu_seconds(process.pid), time.process_time() - client_before
            main_after = main_thread_cpu_seconds(process.pid)
            database_after = local_postgres_cpu_seconds() if postgres else None
            wall = time.perf_counter() - started
            writer_after = writer_counts(process, counts)
            if counting:
                backends = database_backends(url)
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
        finally:
            process.terminate()
            process.wait(30)
    extra: dict[str, Any] = {}
    if counting:  # before the row is read: its query is not the server's
        wait_for_backends_gone(url)
        extra["counters"] = counted(start, database_counters(url), url, warm_up + count, backends)
    extra["row"] = stored_row(url)
    return figures, extra


def check_rows(db: str, rows: dict[str, dict[str, Any]]) -> None:
    """Exit with the differing columns unless each floor stored the row its endpoint stored (``rows`` by kind)."""
    for endpoint, floor in FLOOR_OF.items():
        differing = sorted(name for name in rows[endpoint].keys() | rows[floor].keys()
                           if rows[endpoint].get(name) != rows[floor].get(name))
        if differing:
            details = "; ".join(f"{name}: {rows[floor].get(name)!r} against {rows[endpoint].get(name)!r}"
                                for name in differing)
            raise SystemExit(f"{db}: {floor} does not store the {endpoint} endpoint's row: {details}")
    print(f"{db:10} each floor stored its endpoint's row (every column but the id, correlation id and times, and "
          f"the transition rows)")


def report(db: str, database: str, count: int, concurrency: int, repeat: int, counters: bool = False) -> None:
    """``repeat`` interleaved repetitions of the four servers, each run on a fresh database of kind ``database``
    (``sqlite`` or ``postgres``), then their spread."""
    runs: dict[str, list[dict[str, float]]] = {kind: [] for kind in KINDS}
    rows: dict[str, dict[str, Any]] = {}
    for rep in range(repeat):
        for kind in KINDS[rep % len(KINDS):] + KINDS[:rep % len(KINDS)]:
            with fresh_database(database, DATABASE_PREFIX, admin_url=POSTGRES_ADMIN_URL) as url:
                figures, extra = measure(kind, url, count, concurrency, counters)
            runs[kind].append(figures)
            rows.setdefault(kind, extra["row"])
            server = f"{figures['server_us']:5.0f}" if "server_us" in figures else "    ?"
            batch = f"{figures['batch']:5.1f}" if "batch" in figures else "    ?"
            print(f"  rep {rep + 1} {db:10} {kind:10} {figures['rps']:7.0f} req/s  "
                  f"p50 {figures['p50_ms']:6.1f} ms  p99 {figures['p99_ms']:7.1f} ms  "
                  f"server CPU {server} us/req {_parts(figures)} writes/commit {batch}  "
                  f"client busy {figures['client_busy']:4.0%}  errors {figures['errors']:.0f}", flush=True)
            if "counters" in extra:
                print_counters(extra["counters"])
    check_rows(db, rows)
    print(f"{db:10} {'':10} {'req/s':>20} {'p50 ms':>20} {'p99 ms':>22} {'server CPU us/req':>18} "
          f"{'writes/commit':>18} {'ratio to floor':>18} {'CPU ratio':>18}   (min / median / max)")
    for kind in KINDS:
        floor = runs[FLOOR_OF.get(kind, kind)]
        ratios = [r["rps"] / f["rps"] for r, f in zip(runs[kind], floor, strict=True)]
        cpu = [r["server_us"] for r in runs[kind] if "server_us" in r]
        # the floor's CPU per request over this server's, repetition by repetition: what the rate ratio would be for
        # a server bound by its own CPU (one interpreter), steadier than the rates on a machine whose speed moves
        # (a run too short for the clock's ticks, 10 ms, reads 0 CPU: no ratio from it)
        cpu_ratios = [f["server_us"] / r["server_us"] for r, f in zip(runs[kind], floor, strict=True)
                      if r.get("server_us", 0) > 0 and "server_us" in f]
        batches = [r["batch"] for r in runs[kind] if "batch" in r]
        shown = kind in FLOOR_OF
        print(f"{db:10} {kind:10} {spread([r['rps'] for r in runs[kind]]):>20} "
              f"{spread([r['p50_ms'] for r in runs[kind]], 1):>20} "
              f"{spread([r['p99_ms'] for r in runs[kind]], 1):>22} {spread(cpu) if cpu else '?':>18} "
              f"{spread(batches, 1) if batches else '?':>18} {spread(ratios, 2) if shown else '':>18} "
              f"{spread(cpu_ratios, 2) if cpu_ratios and shown else '':>18}")
    busiest = max(r["client_busy"] for kind in KINDS for r in runs[kind])
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
    print(f"{db:10} {'':10} {header}  {'sum us/req':>10}  {'floor sum / sum':>15}   (medians)")
    for kind, measured in runs.items():
        parts = "  ".join(f"{statistics.median(r[key] for r in measured):13.0f}" for key, _ in present)
        floor = FLOOR_OF.get(kind)
        ratio = f"{sums[floor] / sums[kind]:15.2f}" if floor is not None and sums[kind] > 0 else f"{'':>15}"
        print(f"{db:10} {kind:10} {parts}  {sums[kind]:10.0f}  {ratio}")


def main() -> None:
    parser = arguments(__doc__, count=20000)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--databases", default="sqlite,postgres",
                        help="comma-separated: sqlite, postgres (default both, as lifecycle_bench.py)")
    parser.add_argument("--counters", action="store_true",
                        help="PostgreSQL: print each run's database counters per request (statistics views, the "
                             "database's WAL, its backends' CPU), figures that do not depend on the machine's load")
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
            with fresh_database(kind, DATABASE_PREFIX, admin_url=POSTGRES_ADMIN_URL):
                pass
        except Exception as error:  # no server: SQLite only, and say so
            print(f"PostgreSQL not available ({type(error).__name__}): SQLite only")
            continue
        report(db, kind, args.count, args.concurrency, args.repeat, args.counters)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "serve":
        serve(sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5])
    else:
        main()
