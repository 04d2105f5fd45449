"""Bad-day benchmark: two ``openroute run`` nodes, a remote that stops and comes back, and the way back to normal.

    python benchmarks/badday_bench.py [--rate 20] [--seconds 120] [--down 30] [--up 90] [--funnels 50]
                                      [--variants funnel,plain] [--repeat 1] [--database URL]

The day of issue 41, with real processes: a fake remote system (this script, ``remote`` mode: 5 ms per call, an
idempotency key honoured) and two ``openroute run`` nodes on one fresh PostgreSQL database, serving
``benchmarks/badday_routes.py`` (one ``ExternalHttpClient`` call per message; ``funnel``: a funnel over ``--funnels``
objects, ``plain``: none) with the breaker of docs/outage.md and a bulkhead of 16 calls per node. An open-loop load
generator (one request every 1/rate s, alternating between the nodes, never waiting for an answer to send the next)
sends JSON requests for ``--seconds``; the remote's process is killed at ``--down`` s and started again at ``--up``
s. After the load the script waits until every message is final.

It prints, per variant and repetition, the issue's table: seconds from the breaker closing to every message final;
POSTPONED transitions (FUNNEL, CIRCUIT_OPEN) and PROCESSING transitions per message that waited; INFO log lines
written in the outage per message that arrived in it; accept latency p50 / p99 in the outage and overall; requests
not accepted; PROCESSING_ABANDONED transitions; calls the nodes made to the dead remote.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402
import sqlalchemy as sa  # noqa: E402

from benchmarks._common import POSTGRES_ADMIN_URL, free_port, fresh_database  # noqa: E402

REMOTE_DELAY = 0.005
CONFIG = """\
database_url = "{database}"
routes = "benchmarks.badday_routes:application"

[external_systems.REMOTE]
base_url = "http://127.0.0.1:{remote_port}"
call_timeout = "10s"
timeout = "5s"
max_concurrent_calls = 16

[external_systems.REMOTE.breaker]
failure_rate_threshold = 50
window_size = 20
minimum_calls = 10
open_wait = "20s"
trial_calls = 2
trial_timeout = "10s"
"""


# -- the fake remote ------------------------------------------------------------------------------------------------
def serve_remote(port: int) -> None:
    """The remote system: ``POST /call`` answers after 5 ms (a repeated idempotency key gets the first answer)."""
    import uvicorn
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    answers: dict[str, dict[str, Any]] = {}

    async def call(request: Request) -> JSONResponse:
        key = request.headers.get("idempotency-key", "")
        body = await request.json()
        await asyncio.sleep(REMOTE_DELAY)
        answer = answers.setdefault(key, {"done": body.get("correlationId"), "n": len(answers) + 1})
        return JSONResponse(answer)

    uvicorn.run(Starlette(routes=[Route("/call", call, methods=["POST"])]), host="127.0.0.1", port=port,
                log_level="warning", access_log=False)


class Process:
    """A child process with its output in a file."""

    def __init__(self, command: list[str], log: Path, env: dict[str, str] | None = None) -> None:
        self.log = log
        self._file = log.open("ab")
        self.process = subprocess.Popen(command, cwd=ROOT, stdout=self._file, stderr=subprocess.STDOUT,
                                        env={**os.environ, **(env or {})})

    def stop(self, how: int = signal.SIGINT, timeout: float = 30) -> None:
        if self.process.poll() is None:
            self.process.send_signal(how)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._file.close()


async def wait_http(url: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    async with httpx.AsyncClient(timeout=2) as client:
        while True:
            try:
                if (await client.get(url)).status_code < 500:
                    return
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"{url} did not answer within {timeout} s")
            await asyncio.sleep(0.2)


# -- one day ------------------------------------------------------------------------------------------------------
class Sent:
    __slots__ = ("at", "latency", "ok")

    def __init__(self, at: float) -> None:
        self.at = at
        self.latency: float | None = None
        self.ok = False


async def load(bases: list[str], operation: str, rate: float, seconds: float, funnels: int, started: float,
               sent: list[Sent]) -> None:
    """Open loop: one request every 1/rate s, alternating between the nodes; each answer is awaited by its own
    task, so a slow answer never delays the next request."""
    limits = httpx.Limits(max_connections=4000, max_keepalive_connections=400)
    async with httpx.AsyncClient(timeout=60, limits=limits) as client:
        tasks = []
        count = int(rate * seconds)
        for i in range(count):
            due = started + i / rate
            delay = due - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            record = Sent(time.monotonic() - started)
            sent.append(record)
            tasks.append(asyncio.ensure_future(_send(client, bases[i % len(bases)], operation, i, funnels, record)))
        await asyncio.gather(*tasks)


async def _send(client: httpx.AsyncClient, base: str, operation: str, i: int, funnels: int, record: Sent) -> None:
    began = time.monotonic()
    try:
        answer = await client.post(f"{base}/api/bench/{operation}", json={"object": f"o-{i % funnels}", "n": i},
                                   headers={"X-Correlation-Id": f"day-{i}", "X-Source-System": "BENCH"})
        record.ok = answer.status_code in (200, 202)
    except httpx.HTTPError:
        record.ok = False
    record.latency = time.monotonic() - began


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def external_failures(bases: list[str]) -> int:
    """The nodes' calls of REMOTE that failed or timed out (their ``/metrics``)."""
    total = 0
    async with httpx.AsyncClient(timeout=5) as client:
        for base in bases:
            for line in (await client.get(f"{base}/metrics")).text.splitlines():
                if line.startswith("openroute_external_calls_total") and 'system="REMOTE"' in line \
                        and ('outcome="FAILED"' in line or 'outcome="TIMEOUT"' in line):
                    total += int(float(line.rsplit(" ", 1)[1]))
    return total


async def day(args: argparse.Namespace, variant: str, folder: Path) -> dict[str, Any]:
    remote_port, ports = free_port(), [free_port(), free_port()]
    with fresh_database("postgresql", "badday", admin_url=args.database) as database:
        (folder / "openroute.toml").write_text(CONFIG.format(database=database, remote_port=remote_port))
        remote_command = [sys.executable, str(Path(__file__)), "remote", "--port", str(remote_port)]
        remote = Process(remote_command, folder / "remote.log")
        nodes = [Process([sys.executable, "-m", "openroute", "run", "--config", str(folder / "openroute.toml"),
                          "--port", str(port), "--log-format", "json"], folder / f"node-{i}.log")
                 for i, port in enumerate(ports)]
        bases = [f"http://127.0.0.1:{port}" for port in ports]
        store = sa.create_engine(database)
        try:
            await wait_http(f"http://127.0.0.1:{remote_port}/call", 30)
            for base in bases:
                await wait_http(f"{base}/health")
            sent: list[Sent] = []
            started = time.monotonic()
            wall_start = datetime.now(UTC)
            generator = asyncio.ensure_future(load(bases, "update" if variant == "funnel" else "plain", args.rate,
                                                   args.seconds, args.funnels, started, sent))
            await asyncio.sleep(max(args.down - (time.monotonic() - started), 0))
            failed_before = await external_failures(bases)
            remote.stop(signal.SIGKILL)
            down_wall = datetime.now(UTC)
            await asyncio.sleep(max(args.up - (time.monotonic() - started), 0))
            failed_during = await external_failures(bases) - failed_before
            remote = Process(remote_command, folder / "remote.log")
            up_wall = datetime.now(UTC)
            closed = await watch_until_final(store, generator, up_wall, args.final_timeout)
        finally:
            for node in nodes:
                node.stop()
            remote.stop()
        figures = read_figures(store, folder, down_wall, up_wall, wall_start, started, sent, args)
        closed_at = closed.pop("closed at", None)
        figures.update(closed)
        if isinstance(closed_at, datetime):
            # exact, from the transitions: the last final state of a message received before the breaker closed
            figures["breaker closed -> every message final (s)"] = round(backlog_final(store, closed_at), 1)
            if variant == "funnel":
                figures.update(funnel_turns(store, closed_at))
        store.dispose()
    if isinstance(closed_at, datetime):
        after = (closed_at - wall_start).total_seconds()
        drain = [s.latency for s in sent if s.latency is not None and s.ok and s.at >= after]
        figures["accept p50 / p99 after the close (ms)"] = (round(percentile(drain, 0.5) * 1000, 1),
                                                             round(percentile(drain, 0.99) * 1000, 1))
    figures["calls to the dead remote"] = failed_during
    return figures


async def watch_until_final(store: sa.Engine, generator: asyncio.Future[None], up: datetime,
                            timeout: float) -> dict[str, Any]:
    """Poll the store until the load is sent and every message is final: when the breaker closed after the remote
    came back, and how long after that every message received before the close (the outage's backlog) was final."""
    final = "('OK', 'FAILED', 'SKIPPED', 'CANCEL')"
    closed_at: datetime | None = None
    drained: float | None = None
    deadline = time.monotonic() + timeout
    while True:
        await asyncio.sleep(0.25)
        closed_at, drained, open_messages = await asyncio.to_thread(_poll, store, up, closed_at, drained, final)
        if generator.done() and open_messages == 0 and closed_at is not None and drained is not None:
            return {"breaker closed after the remote came back (s)": round((closed_at - up).total_seconds(), 1),
                    "breaker closed -> every message final (s)": round(drained, 1), "closed at": closed_at}
        if time.monotonic() > deadline:
            return {"breaker closed after the remote came back (s)": None,
                    "breaker closed -> every message final (s)": f"not within {timeout:.0f} s ({open_messages} open)"}


def _poll(store: sa.Engine, up: datetime, closed_at: datetime | None, drained: float | None,
          final: str) -> tuple[datetime | None, float | None, int]:
    """One look at the store (on a thread: the load generator's loop never waits for it)."""
    with store.connect() as connection:
        if closed_at is None:
            row = connection.execute(sa.text(
                "SELECT state, changed_at FROM circuit_breaker WHERE system = 'REMOTE'")).first()
            if row is not None and row.state == "CLOSED" and row.changed_at >= up:
                closed_at = row.changed_at
        elif drained is None:
            backlog = connection.execute(sa.text(
                f"SELECT count(*) FROM message WHERE state NOT IN {final} AND receive_ts <= :closed"),
                {"closed": closed_at}).scalar_one()
            if backlog == 0:
                drained = (datetime.now(UTC) - closed_at).total_seconds()
        open_messages = connection.execute(sa.text(
            f"SELECT count(*) FROM message WHERE state NOT IN {final}")).scalar_one()
    return closed_at, drained, int(open_messages)


def backlog_final(store: sa.Engine, closed_at: datetime) -> float:
    """Seconds from ``closed_at`` to the last final state of the messages received before it."""
    with store.connect() as connection:
        last = connection.execute(sa.text(
            "SELECT max(t.at) FROM message_transition t JOIN message m ON m.id = t.message_id "
            "WHERE m.receive_ts <= :closed AND t.to_state IN ('OK', 'FAILED', 'SKIPPED', 'CANCEL')"),
            {"closed": closed_at}).scalar_one()
    return max((last - closed_at).total_seconds(), 0.0) if last is not None else float("nan")


def funnel_turns(store: sa.Engine, closed_at: datetime) -> dict[str, Any]:
    """Where a funnel's drain after the close spends its time, per value: a run (PROCESSING -> final) and the turn
    (one message final -> the next message of the value PROCESSING), p50 / p99 in ms; and the runs each node made."""
    with store.connect() as connection:
        rows = connection.execute(sa.text(
            "SELECT m.funnel_value, t.message_id, t.to_state, t.at, t.node_id FROM message_transition t "
            "JOIN message m ON m.id = t.message_id WHERE t.at >= :closed AND m.funnel_value IS NOT NULL "
            "ORDER BY m.funnel_value, t.at, t.id"), {"closed": closed_at}).all()
    runs: list[float] = []
    turns: list[float] = []
    started: dict[int, datetime] = {}
    last_final: dict[str, datetime] = {}
    per_node: dict[str, int] = {}
    for row in rows:
        if row.to_state == "PROCESSING":
            started[row.message_id] = row.at
            per_node[row.node_id] = per_node.get(row.node_id, 0) + 1
            if row.funnel_value in last_final:
                turns.append((row.at - last_final.pop(row.funnel_value)).total_seconds())
        elif row.to_state in ("OK", "FAILED", "SKIPPED", "CANCEL") and row.message_id in started:
            runs.append((row.at - started.pop(row.message_id)).total_seconds())
            last_final[row.funnel_value] = row.at
    return {"after the close, per funnel value: run p50 / p99 (ms)":
            (round(percentile(runs, 0.5) * 1000, 1), round(percentile(runs, 0.99) * 1000, 1)),
            "after the close, per funnel value: turn p50 / p99 (ms)":
            (round(percentile(turns, 0.5) * 1000, 1), round(percentile(turns, 0.99) * 1000, 1)),
            "after the close, runs per node": tuple(count for _node, count in sorted(per_node.items()))}


def read_figures(store: sa.Engine, folder: Path, down: datetime, up: datetime, wall_start: datetime, started: float,
                 sent: list[Sent], args: argparse.Namespace) -> dict[str, Any]:
    with store.connect() as connection:
        rows = connection.execute(sa.text(
            "SELECT message_id, to_state, error_code FROM message_transition")).all()
        messages = connection.execute(sa.text("SELECT count(*) FROM message")).scalar_one()
        failed = connection.execute(sa.text("SELECT count(*) FROM message WHERE state = 'FAILED'")).scalar_one()
    postponed = [r for r in rows if r.to_state == "POSTPONED"]
    if os.environ.get("BADDAY_SHOW_LAST"):  # the backlog's slowest messages, for a look at what they waited for
        with store.connect() as connection:
            for row in connection.execute(sa.text(
                    "SELECT t.message_id, string_agg(t.to_state || ':' || coalesce(t.error_code, '') || '@' || "
                    "to_char(t.at, 'MI:SS.MS') || '/' || coalesce(t.node_id, ''), ' ' ORDER BY t.id) AS moves, "
                    "max(t.at) AS last FROM message_transition t JOIN message m ON m.id = t.message_id "
                    "WHERE m.receive_ts < :up GROUP BY t.message_id ORDER BY last DESC LIMIT 4"), {"up": up}):
                print("  slowest:", row.message_id, row.moves)
    waited = {r.message_id for r in postponed}
    processing_of_waited = sum(1 for r in rows if r.to_state == "PROCESSING" and r.message_id in waited)
    down_s, up_s = (down - wall_start).total_seconds(), (up - wall_start).total_seconds()
    in_outage = [s for s in sent if down_s <= s.at < up_s]
    info = 0
    for log in folder.glob("node-*.log"):
        for line in log.read_text(errors="replace").splitlines():
            try:
                entry = json.loads(line)
            except ValueError:
                continue
            at = datetime.fromisoformat(entry.get("time", "1970-01-01T00:00:00+00:00"))
            if entry.get("level") == "INFO" and down <= at < up:
                info += 1
    latencies = [s.latency for s in sent if s.latency is not None and s.ok]
    worst = max((s for s in sent if s.latency is not None), key=lambda s: s.latency or 0.0, default=None)
    outage_latencies = [s.latency for s in in_outage if s.latency is not None and s.ok]
    return {
        "messages": messages,
        "FAILED": failed,
        "requests not accepted": sum(1 for s in sent if not s.ok),
        "messages that waited": len(waited),
        "POSTPONED per message that waited": round(len(postponed) / max(len(waited), 1), 2),
        "POSTPONED FUNNEL / CIRCUIT_OPEN": (sum(1 for r in postponed if r.error_code == "FUNNEL"),
                                            sum(1 for r in postponed if r.error_code == "CIRCUIT_OPEN")),
        "PROCESSING per message that waited": round(processing_of_waited / max(len(waited), 1), 2),
        "INFO lines in the outage per message arriving in it":
            round(info / max(len(in_outage), 1), 2),
        "accept p50 / p99 in the outage (ms)": (round(percentile(outage_latencies, 0.5) * 1000, 1),
                                                round(percentile(outage_latencies, 0.99) * 1000, 1)),
        "accept p50 / p99 overall (ms)": (round(percentile(latencies, 0.5) * 1000, 1),
                                          round(percentile(latencies, 0.99) * 1000, 1)),
        "PROCESSING_ABANDONED": sum(1 for r in rows if r.error_code == "PROCESSING_ABANDONED"),
        "slowest accept (ms, sent at s)": None if worst is None else (round((worst.latency or 0) * 1000),
                                                                      round(worst.at, 1)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", nargs="?", default="day", choices=["day", "remote"])
    parser.add_argument("--port", type=int, help="remote mode: the port to serve on")
    parser.add_argument("--rate", type=float, default=20.0)
    parser.add_argument("--seconds", type=float, default=120.0)
    parser.add_argument("--down", type=float, default=30.0)
    parser.add_argument("--up", type=float, default=90.0)
    parser.add_argument("--funnels", type=int, default=50)
    parser.add_argument("--variants", default="funnel,plain")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--final-timeout", type=float, default=600.0)
    parser.add_argument("--database", default=POSTGRES_ADMIN_URL)
    args = parser.parse_args()
    if args.mode == "remote":
        serve_remote(args.port)
        return
    results: dict[str, list[dict[str, Any]]] = {}
    for repetition in range(args.repeat):
        for variant in args.variants.split(","):
            with tempfile.TemporaryDirectory(prefix=f"badday-{variant}-") as folder:
                kept = os.environ.get("BADDAY_KEEP")  # a folder that keeps the nodes' logs
                figures = asyncio.run(day(args, variant, Path(kept or folder)))
            results.setdefault(variant, []).append(figures)
            print(f"\n{variant}, repetition {repetition + 1}: {args.rate:g} msg/s for {args.seconds:g} s, remote "
                  f"down from {args.down:g} s to {args.up:g} s, two nodes on PostgreSQL")
            for name, value in figures.items():
                print(f"  {name:55} {value}")
    for variant, runs in results.items():
        closing = [r["breaker closed -> every message final (s)"] for r in runs
                   if isinstance(r["breaker closed -> every message final (s)"], float)]
        if closing:
            print(f"\n{variant}: breaker closed -> every message final, min / median / max: "
                  f"{min(closing):.1f} / {statistics.median(closing):.1f} / {max(closing):.1f} s")


if __name__ == "__main__":
    main()
