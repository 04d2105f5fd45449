"""Accepted requests/s and latency of the inbound endpoints through uvicorn, against a bare-INSERT floor.

For each database (a SQLite file, and a fresh PostgreSQL database when the server is reachable) three servers
are measured in turn, each in its own uvicorn process on a free loopback port, while this process is the load
generator (httpx, a bounded number of requests, a fixed number in flight):

* ``floor``: a bare Starlette endpoint that reads the body and does the same single INSERT into ``message``
* ``json``:  ``POST /api/bench/submit`` through the whole inbound layer and ``Engine.accept``
* ``soap``:  ``POST /soap/bench`` (SOAP 1.1) through the whole inbound layer and ``Engine.accept``

Run: ``python benchmarks/http_bench.py [--count 2000] [--concurrency 32]``. It prints one line per run and the
ratio of each endpoint to the floor (the goal is >= 0.6).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

import httpx
import sqlalchemy as sa

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

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
    from openroute.persistence import MessageState, create_store_engine, message_table
    from starlette.applications import Starlette
    from starlette.concurrency import run_in_threadpool
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    engine = create_store_engine(url)

    def insert(payload: str, correlation_id: str) -> int:
        now = datetime.now(UTC)
        with engine.begin() as connection:
            return connection.execute(
                sa.insert(message_table).values(
                    correlation_id=correlation_id, source_system="BENCH", service="bench", operation="submit",
                    payload=payload, content_type="application/json", headers={}, state=MessageState.NEW,
                    failed_count=0, receive_ts=now, last_update_ts=now, custom_data={}, business_errors=[],
                    version=0,
                ).returning(message_table.c.id)
            ).scalar_one()

    async def submit(request: Request) -> JSONResponse:
        body = (await request.body()).decode()
        message_id = await run_in_threadpool(insert, body, request.headers.get("x-correlation-id") or uuid.uuid4().hex)
        return JSONResponse({"messageId": message_id}, 202)

    return Starlette(routes=[Route("/api/bench/submit", submit, methods=["POST"])])


def openroute_app(url: str):  # type: ignore[no-untyped-def]
    from openroute.engine import Engine, EngineSettings
    from openroute.inbound import InboundBinding, QName
    from openroute.route import Route, RouteRegistry
    from openroute.server import create_app

    registry = RouteRegistry([Route("bench", "submit", [lambda exchange: None])])
    bindings = [
        InboundBinding("bench", "submit", "xml", request_element=QName(NS, "submit"), namespaces={"b": NS},
                       required=["b:orderId"], object_id="b:orderId", funnel_value="b:customer/b:id"),
        InboundBinding("bench", "submit", "json", required=["$.orderId"], object_id="$.orderId",
                       funnel_value="$.customer.id"),
    ]
    # the engine only accepts here (no workers started): the benchmark measures the inbound path
    engine = Engine(url, registry, EngineSettings(repoll_interval=None, node_id="bench"))
    return create_app(engine, bindings, manage_engine=False)


def serve(kind: str, url: str, port: int) -> None:
    import uvicorn

    app = floor_app(url) if kind == "floor" else openroute_app(url)
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", access_log=False)


# -- the load generator -----------------------------------------------------------------------------------------
async def load(kind: str, base: str, count: int, concurrency: int) -> dict[str, float]:
    latencies: list[float] = []
    errors = 0
    counter = iter(range(count))
    run_id = uuid.uuid4().hex[:8]
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)

    async with httpx.AsyncClient(base_url=base, limits=limits, timeout=30) as http:
        async def worker() -> None:
            nonlocal errors
            for n in counter:
                cid = f"{run_id}-{n}"
                if kind == "soap":
                    response_call = http.post("/soap/bench", content=SOAP_BODY.format(cid=cid, n=n).encode(),
                                              headers={"Content-Type": "text/xml", "X-Source-System": "BENCH"})
                else:
                    body = json.dumps(JSON_BODY).replace("{n}", str(n))
                    response_call = http.post("/api/bench/submit", content=body.encode(),
                                              headers={"Content-Type": "application/json", "X-Correlation-Id": cid,
                                                       "X-Source-System": "BENCH"})
                started = time.perf_counter()
                response = await response_call
                latencies.append(time.perf_counter() - started)
                if response.status_code not in (200, 202):
                    errors += 1

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        elapsed = time.perf_counter() - started
    latencies.sort()
    return {
        "rps": count / elapsed,
        "p50_ms": statistics.median(latencies) * 1000,
        "p99_ms": latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))] * 1000,
        "errors": errors,
    }


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_for_port(port: int, process: subprocess.Popen[bytes], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"server exited with {process.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"server on port {port} did not start")


def measure(kind: str, url: str, count: int, concurrency: int) -> dict[str, float]:
    port = free_port()
    process = subprocess.Popen([sys.executable, __file__, "serve", kind, url, str(port)], cwd=ROOT)
    try:
        wait_for_port(port, process)
        asyncio.run(load(kind, f"http://127.0.0.1:{port}", min(200, count), concurrency))  # warm-up
        return asyncio.run(load(kind, f"http://127.0.0.1:{port}", count, concurrency))
    finally:
        process.terminate()
        process.wait(30)


def databases(tmp: Path) -> list[tuple[str, str, str | None]]:
    result: list[tuple[str, str, str | None]] = [("sqlite", f"sqlite:///{tmp / 'bench.db'}", None)]
    try:
        admin = sa.create_engine(POSTGRES_ADMIN_URL, isolation_level="AUTOCOMMIT")
        name = f"openroute_bench_{uuid.uuid4().hex[:8]}"
        with admin.connect() as connection:
            connection.execute(sa.text(f'CREATE DATABASE "{name}"'))
        admin.dispose()
        result.append(("postgresql", POSTGRES_ADMIN_URL.rsplit("/", 1)[0] + f"/{name}", name))
    except Exception as error:  # no server: SQLite only, and say so
        print(f"PostgreSQL not available ({type(error).__name__}): SQLite only")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=32)
    args = parser.parse_args()
    if args.count < 1 or args.concurrency < 1:
        parser.error("--count and --concurrency must be positive")
    from openroute.persistence import MessageStore

    print(f"{os.cpu_count()} CPUs, {args.count} requests per run, {args.concurrency} in flight, loopback")
    with tempfile.TemporaryDirectory() as tmp:
        for db, url, pg_name in databases(Path(tmp)):
            store = MessageStore(url)
            store.create_schema()
            store.dispose()
            try:
                results = {kind: measure(kind, url, args.count, args.concurrency) for kind in ("floor", "json", "soap")}
            finally:
                if pg_name is not None:
                    admin = sa.create_engine(POSTGRES_ADMIN_URL, isolation_level="AUTOCOMMIT")
                    with admin.connect() as connection:
                        connection.execute(sa.text(f'DROP DATABASE IF EXISTS "{pg_name}" WITH (FORCE)'))
                    admin.dispose()
            floor = results["floor"]["rps"]
            for kind, figures in results.items():
                print(f"{db:10} {kind:5} {figures['rps']:8.0f} req/s  p50 {figures['p50_ms']:6.1f} ms  "
                      f"p99 {figures['p99_ms']:7.1f} ms  errors {figures['errors']:.0f}  "
                      f"{figures['rps'] / floor:4.2f}x floor")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "serve":
        serve(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    else:
        main()
