"""benchmarks/http_bench.py end to end, tiny: one repetition of 60 requests to each of its four servers (JSON and SOAP,
and the floor of each, each a uvicorn process of its own) on a fresh database per run. It checks that the benchmark
still runs against the code it measures (a refactoring of the engine had left it reading a writer that had moved),
that every request was answered, not how fast, and that each floor stored its endpoint's row (the benchmark compares
them and stops when they differ); on PostgreSQL with the database's counters per request. Without PostgreSQL that
half is skipped, except in CI."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.services import POSTGRES_ADMIN_URL, require_database

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
@pytest.mark.parametrize("database", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def test_the_http_benchmark_runs_its_four_servers(database: str) -> None:
    require_database(database)
    done = subprocess.run(
        [sys.executable, "benchmarks/http_bench.py", "--count", "60", "--repeat", "1", "--databases", database,
         "--counters"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
        env={**os.environ, "OPENROUTE_TEST_POSTGRES_URL": POSTGRES_ADMIN_URL},
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    runs = [line for line in done.stdout.splitlines() if line.startswith("  rep 1 ")]
    assert [line.split()[3] for line in runs] == ["json-floor", "json", "soap-floor", "soap"], done.stdout
    assert all(line.rstrip().endswith("errors 0") for line in runs), done.stdout
    assert "each floor stored its endpoint's row" in done.stdout
    assert "ratio to floor" in done.stdout
    if database == "postgres":  # every run's counters: the rows it stored are among them
        counted = [line for line in done.stdout.splitlines() if line.strip().startswith("message ")]
        assert len(counted) == 4, done.stdout
        assert all("n_tup_ins 1 " in line for line in counted), done.stdout


async def test_the_open_loop_sends_every_request_and_replaces_the_connections_the_server_closed() -> None:
    """``open_loop`` (route_bench's paced load): every request is sent and answered once, also when the server closes
    kept-alive connections (as uvicorn closes one idle for 5 s): the request goes out again on another connection,
    and no answer is counted twice."""
    import asyncio

    from benchmarks.http_bench import open_loop

    seen: list[bytes] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        answered = 0
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = int(head.split(b"Content-Length: ")[1].split(b"\r\n")[0])
                seen.append(await reader.readexactly(length))
                writer.write(b"HTTP/1.1 202 Accepted\r\nContent-Length: 2\r\n\r\nok")
                await writer.drain()
                answered += 1
                if answered == 2:  # every connection is closed after its second answer
                    break
        except asyncio.IncompleteReadError:
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    requests = [f"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: {len(str(n))}\r\n\r\n{n}".encode() for n in range(40)]
    try:
        latencies, errors = await asyncio.wait_for(open_loop(port, requests, rate=400, warm=4), timeout=30)
    finally:
        server.close()
    assert errors == 0
    assert len(latencies) == 40 and all(latency >= 0 for latency in latencies)
    assert sorted(int(body) for body in seen) == list(range(40))
