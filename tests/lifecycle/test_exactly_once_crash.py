"""The crash harness of issue 23: ``kill -9`` of a real ``openroute run`` node, several times, during a load, on
PostgreSQL, against receivers that drop repeats by key the way the guarantees ask of them.

* The remote is a local fake HTTP server, slow (so kills land while calls are in flight): it applies an effect for
  a new ``Idempotency-Key`` and answers a repeated key with the first answer, counting raw calls per key.
* The confirmation endpoint is slow too and drops repeats by ``Idempotency-Key`` (the confirmation id).
* The load is sent by a client that retries each message with the same correlation id until it is acknowledged.

Asserted, as seen by the receivers: 0 repeated effects per (message, call), 0 repeated confirmations per message,
every message OK and confirmed, nothing PENDING 30 s after the last restart. Raw repeats (calls and confirmations
made again after a kill, dropped by key) are counted and printed. The suite runs ``OPENROUTE_CRASH_MESSAGES``
messages (default 1,000, the issue's size; fewer for a quicker run while you work, see docs/testing.md).
"""

from __future__ import annotations

import asyncio
import os
import queue
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
import uvicorn
from openroute.persistence import MessageStore
from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse
from starlette.routing import Route

pytestmark = pytest.mark.slow

MESSAGES = int(os.environ.get("OPENROUTE_CRASH_MESSAGES", "1000"))
KILLS = 3
REMOTE_DELAY = 0.03
CONFIRM_DELAY = 0.1

APP = textwrap.dedent('''
    import os
    from datetime import timedelta

    import httpx

    from openroute import Application, route

    REMOTE = os.environ["CRASH_REMOTE_URL"]
    _client = []


    def client():
        if not _client:
            _client.append(httpx.AsyncClient(timeout=10))
        return _client[0]


    def call(name):
        async def remote(exchange, idempotency_key):
            answer = await client().post(REMOTE, headers={"Idempotency-Key": idempotency_key},
                                         json={"correlationId": exchange.message.correlation_id, "call": name})
            answer.raise_for_status()
            return answer.json()
        return remote


    app = Application(
        route("load", "order").json().retry(max_attempts=100, interval=timedelta(seconds=1), backoff=1.0)
        .ext_call("reserve", call("reserve")).ext_call("charge", call("charge"))
    )
''')


class Receivers:
    """The fake remote and the confirmation endpoint, served by uvicorn in a thread of the test process."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.raw_calls: Counter[str] = Counter()  # per idempotency key
        self.effects: Counter[tuple[str, str]] = Counter()  # per (correlation id, call)
        self.answers: dict[str, dict[str, Any]] = {}
        self.raw_confirmations: Counter[str] = Counter()  # per confirmation id
        self.confirmed: Counter[str] = Counter()  # applied, per message id
        self.unkeyed = 0

    async def call(self, request: Request) -> JSONResponse:
        key = request.headers.get("idempotency-key")
        try:
            body = await request.json()
        except ClientDisconnect:
            return JSONResponse({}, 499)
        with self.lock:
            if key is None:
                self.unkeyed += 1
            else:
                self.raw_calls[key] += 1
            if key is not None and key in self.answers:
                answer = self.answers[key]  # a repeat: the first answer, no second effect
            else:
                self.effects[(body["correlationId"], body["call"])] += 1
                answer = {"done": body["call"], "n": sum(self.effects.values())}
                if key is not None:
                    self.answers[key] = answer
        await asyncio.sleep(REMOTE_DELAY)  # a kill now: the effect happened, the caller never hears (in doubt)
        return JSONResponse(answer)

    async def confirm(self, request: Request) -> JSONResponse:
        key = request.headers.get("idempotency-key") or ""
        try:
            body = await request.json()
        except ClientDisconnect:  # the node was killed while sending: it never saw an answer
            return JSONResponse({}, 499)
        with self.lock:
            self.raw_confirmations[key] += 1
            if self.raw_confirmations[key] == 1:
                self.confirmed[body["messageId"]] += 1
        await asyncio.sleep(CONFIRM_DELAY)
        return JSONResponse({"ok": True})

    def app(self) -> Starlette:
        return Starlette(routes=[Route("/call", self.call, methods=["POST"]),
                                 Route("/confirm", self.confirm, methods=["POST"])])


@pytest.fixture
def receivers() -> Iterator[tuple[Receivers, str]]:
    fakes = Receivers()
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(fakes.app(), log_level="warning", lifespan="off", limit_concurrency=2000))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:  # uvicorn offers no event to wait on: a bounded poll
        assert time.monotonic() < deadline and thread.is_alive(), "the receivers did not start"
        time.sleep(0.01)
    yield fakes, f"http://127.0.0.1:{sock.getsockname()[1]}"
    server.should_exit = True
    thread.join(10)
    sock.close()


class Node:
    """One ``openroute run`` process (its output drained by a thread, kept for the failure message)."""

    def __init__(self, folder: Path, port: int, env: dict[str, str]) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "openroute", "run", "--config", "openroute.toml", "--port", str(port)],
            cwd=folder, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.lines: queue.Queue[str] = queue.Queue()
        self.output: list[str] = []
        stream = self.process.stdout
        assert stream is not None
        threading.Thread(target=lambda: [self.lines.put(line) for line in stream], daemon=True).start()

    def wait_serving(self, base: str, timeout: float = 60) -> None:
        """Wait until ``/health`` answers 200 (bounded; fails at once when the process ends)."""
        deadline = time.monotonic() + timeout
        while True:
            while not self.lines.empty():
                self.output.append(self.lines.get_nowait())
            assert self.process.poll() is None, "openroute run ended:\n" + "".join(self.output)
            try:
                if httpx.get(f"{base}/health", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "openroute run did not start:\n" + "".join(self.output)
            time.sleep(0.05)

    def kill(self) -> None:
        os.kill(self.process.pid, signal.SIGKILL)
        self.process.wait(30)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _send_all(base: str, count: int, stop: threading.Event) -> None:
    """Send every message until acknowledged (202, or 200 as a duplicate), retrying through the node's deaths."""

    def send(numbers: list[int]) -> None:
        with httpx.Client(base_url=base, timeout=10) as client:
            for n in numbers:
                while not stop.is_set():
                    try:
                        answer = client.post("/api/load/order", json={"n": n}, headers={
                            "X-Source-System": "LOAD", "X-Correlation-Id": f"order-{n}"})
                        if answer.status_code in (200, 202):
                            break
                    except httpx.HTTPError:
                        pass
                    stop.wait(0.2)  # the node is down (or restarting): try the same message again

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(send, [list(range(i, count, 8)) for i in range(8)]))


def test_kill_9_during_a_load_repeats_no_effect_and_no_confirmation(
    postgres_url: str, receivers: tuple[Receivers, str], tmp_path: Path
) -> None:
    fakes, url = receivers
    store = MessageStore(postgres_url)
    store.create_schema()
    (tmp_path / "crashapp.py").write_text(APP)
    (tmp_path / "openroute.toml").write_text(textwrap.dedent(f'''
        database_url = "{postgres_url}"
        routes = "crashapp:app"
        [log]
        level = "WARNING"
        [engine]
        node_id = "crash-node"
        repoll_interval = "1s"
        heartbeat_interval = "1s"
        [confirmations]
        interval = "1s"
        claim_timeout = "3s"
        [confirmations.systems.LOAD]
        http = "{url}/confirm"
    '''))
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPENROUTE_")}
    env["CRASH_REMOTE_URL"] = f"{url}/call"
    env["PYTHONPATH"] = str(tmp_path)
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    node = Node(tmp_path, port, env)
    stop = threading.Event()
    sender = threading.Thread(target=_send_all, args=(base, MESSAGES, stop), daemon=True)
    started = time.monotonic()
    last_restart = started
    try:
        node.wait_serving(base)
        sender.start()
        for kill in range(1, KILLS + 1):
            target = MESSAGES * kill // (KILLS + 1)
            deadline = time.monotonic() + 120
            while len({c for c, _ in dict.copy(fakes.effects)}) < target:  # a copy: the fake server thread adds to it
                assert time.monotonic() < deadline, "no progress:\n" + "".join(node.output)
                time.sleep(0.02)
            node.kill()
            killed = time.monotonic()
            time.sleep(1.0)
            node = Node(tmp_path, port, env)
            node.wait_serving(base)
            print(f"kill {kill} at {killed - started:.1f} s, serving again after {time.monotonic() - killed:.1f} s")
            last_restart = time.monotonic()
        sender.join(180)
        assert not sender.is_alive(), "the load was not acknowledged in time"

        def pending() -> tuple[int, int]:
            with store.engine.connect() as connection:
                open_messages = connection.execute(sa.text(
                    "SELECT count(*) FROM message WHERE state NOT IN ('OK', 'FAILED', 'SKIPPED', 'CANCEL')"
                )).scalar_one()
                unconfirmed = connection.execute(sa.text(
                    "SELECT count(*) FROM confirmation WHERE status <> 'SENT'")).scalar_one()
            return int(open_messages), int(unconfirmed)

        while pending() != (0, 0) or len(fakes.confirmed) < MESSAGES:
            assert time.monotonic() - last_restart < 30, (
                f"still open / unconfirmed 30 s after the last restart: {pending()}, "
                f"{len(fakes.confirmed)} confirmed\n" + "".join(node.output[-50:]))
            time.sleep(0.1)
        settled = time.monotonic() - last_restart
    finally:
        stop.set()
        node.stop()
        store.dispose()

    with store.engine.connect() as connection:
        states = dict(connection.execute(sa.text("SELECT state, count(*) FROM message GROUP BY state")).all())
        doubted = connection.execute(sa.text("SELECT count(*) FROM external_call WHERE attempts > 1")).scalar_one()
        errors = connection.execute(sa.text(
            "SELECT error_code, count(*) FROM message_transition WHERE error_code IS NOT NULL GROUP BY error_code"
        )).all()
    repeated_effects = {k: n for k, n in fakes.effects.items() if n > 1}
    repeated_confirmations = {k: n for k, n in fakes.confirmed.items() if n > 1}
    raw_repeated_calls = sum(n - 1 for n in fakes.raw_calls.values())
    raw_repeated_confirmations = sum(n - 1 for n in fakes.raw_confirmations.values())
    print(f"\ncrash harness: {MESSAGES} messages, {KILLS} kills, {time.monotonic() - started:.1f} s; raw repeated "
          f"calls (dropped by key): {raw_repeated_calls}; raw repeated confirmations (dropped by key): "
          f"{raw_repeated_confirmations}; calls made more than once: {doubted}; everything confirmed "
          f"{settled:.1f} s after the last restart; attempt errors: {dict(errors)}")
    assert states == {"OK": MESSAGES}
    assert fakes.unkeyed == 0
    assert len(fakes.effects) == 2 * MESSAGES and repeated_effects == {}, repeated_effects
    assert len(fakes.confirmed) == MESSAGES and repeated_confirmations == {}, repeated_confirmations
