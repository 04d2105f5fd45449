"""``openroute run`` in a real process: configuration, the application from the current directory, logging, the
start-up mistakes (one line, its own exit code, no traceback) and the SQLite checkpoint at a clean stop."""

from __future__ import annotations

import json
import os
import queue
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import httpx
import sqlalchemy as sa
from openroute.persistence import MessageStore

from tests._support.servers import free_port

ROOT = Path(__file__).resolve().parents[2]

#: an application in the user's own folder: one JSON route that succeeds, one that always fails technically
USER_APP = textwrap.dedent('''
    from openroute.dsl import Application, route


    def fine(exchange):
        return None


    def broken(exchange):
        raise ConnectionError("billing is down")


    app = Application(
        route("shop", "order").json().process(fine),
        route("shop", "pay").json().retry(max_attempts=1).process(broken),
    )
''')


def _environment(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPENROUTE_")}
    env.update(extra)
    return env


class Server:
    """A running ``openroute run`` process; ``lines`` holds its output (stdout and stderr) as read so far."""

    def __init__(self, args: list[str], cwd: Path, env: dict[str, str]) -> None:
        self.port = free_port()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "openroute", "run", "--port", str(self.port), *args],
            cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
        )
        self._queue: queue.Queue[str] = queue.Queue()
        assert self.process.stdout is not None
        stream = self.process.stdout
        self._reader = threading.Thread(target=lambda: [self._queue.put(line) for line in stream], daemon=True)
        self._reader.start()
        self.lines: list[str] = []
        self.base = f"http://127.0.0.1:{self.port}"

    def wait_for(self, text: str, timeout: float = 60) -> str:
        """The first output line containing ``text`` (reading on); fails when the process ends or time is up."""
        deadline = time.monotonic() + timeout
        while True:
            for line in self.lines:
                if text in line:
                    return line
            remaining = deadline - time.monotonic()
            assert remaining > 0, f"no {text!r} within {timeout} s:\n{''.join(self.lines)}"
            try:
                self.lines.append(self._queue.get(timeout=min(remaining, 1)))
            except queue.Empty:
                assert self.process.poll() is None or not self._queue.empty(), (
                    f"openroute run ended ({self.process.returncode}) before {text!r}:\n{''.join(self.lines)}")

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
        code = self.process.wait(60)
        self._reader.join(10)
        while not self._queue.empty():
            self.lines.append(self._queue.get_nowait())
        return code

    @property
    def output(self) -> str:
        return "".join(self.lines)


def run_fails(args: list[str], cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "openroute", "run", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=120, env=env if env is not None else _environment())


def wait_until(check, timeout: float = 30):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.05)


def test_run_serves_routes_with_the_legacy_auth_config_and_its_confirmations(tmp_path: Path, serve) -> None:
    config = tmp_path / "auth.json"
    config.write_text(json.dumps({
        "sourceSystems": {"CRM": {"basic": {"username": "crm", "password": "crm-secret"}}},
        "admins": [{"username": "ops", "password": "ops-secret"}],
        "confirmations": {"CRM": {"http": "http://127.0.0.1:9/confirm"}},  # refused before this session
    }))
    database = tmp_path / "run.db"
    server = serve(["--database-url", f"sqlite:///{database}", "--routes", "tests.inbound.sample_routes:registry",
                    "--auth-config", str(config)])
    server.wait_for("serving 1 routes of tests.inbound.sample_routes:registry")
    base = server.base
    assert httpx.post(f"{base}/api/orders/create", json={"a": 1}).status_code == 401
    accepted = httpx.post(f"{base}/api/orders/create", json={"a": 1}, auth=("crm", "crm-secret"))
    assert accepted.status_code == 202, accepted.text
    soap = httpx.post(
        f"{base}/soap/orders", auth=("crm", "crm-secret"), headers={"Content-Type": "text/xml"},
        content=('<e:Envelope xmlns:e="http://schemas.xmlsoap.org/soap/envelope/"><e:Body>'
                 '<o:create xmlns:o="urn:openroute:service:orders"/></e:Body></e:Envelope>'),
    )
    assert soap.status_code == 200, soap.text
    assert httpx.get(f"{base}/admin/counts", auth=("ops", "ops-secret")).json()["total"] == 2
    server.wait_for("PROCESSING -> OK")
    assert server.stop() == 0
    assert "Shutting down" in server.output and "crm-secret" not in server.output
    assert "Traceback" not in server.output
    # no access log unless asked: each request above would have been a line of its own
    assert "uvicorn.access" not in server.output and '"POST /api/orders/create' not in server.output
    engine = sa.create_engine(f"sqlite:///{database}")
    with engine.connect() as connection:
        assert connection.execute(sa.text("select count(*) from message")).scalar_one() == 2
    engine.dispose()


def test_run_from_a_toml_file_environment_and_json_logs(tmp_path: Path, serve) -> None:
    """--routes finds ./shopapp.py; OPENROUTE_DATABASE_URL over the file; every line (uvicorn's too, its access log
    asked for by ``[log] access``) is JSON."""
    (tmp_path / "shopapp.py").write_text(USER_APP, encoding="utf-8")
    (tmp_path / "ops.secret").write_text("ops-secret\n", encoding="utf-8")
    (tmp_path / "openroute.toml").write_text(textwrap.dedent('''
        database_url = "sqlite:///ignored.db"
        routes = "shopapp:app"
        [log]
        format = "json"
        access = true
        [engine]
        concurrency = 2
        [inbound]
        request_deadline = "1s"
        [[auth.admins]]
        username = "ops"
        password_file = "ops.secret"
    '''), encoding="utf-8")
    database = tmp_path / "from-env.db"
    server = serve(["--config", "openroute.toml"], cwd=tmp_path,
                   env=_environment(OPENROUTE_DATABASE_URL=f"sqlite:///{database}"))
    server.wait_for("serving 2 routes of shopapp:app")
    headers = {"X-Source-System": "SHOP", "X-Correlation-Id": "c-ok"}
    assert httpx.post(f"{server.base}/api/shop/order", json={"n": 1}, headers=headers).status_code == 202
    headers = {"X-Source-System": "SHOP", "X-Correlation-Id": "c-broken"}
    assert httpx.post(f"{server.base}/api/shop/pay", json={"n": 2}, headers=headers).status_code == 202
    server.wait_for("PROCESSING -> FAILED")
    server.wait_for("PROCESSING -> OK")
    counts = httpx.get(f"{server.base}/admin/counts", auth=("ops", "ops-secret"))
    assert counts.status_code == 200 and counts.headers["x-frame-options"] == "DENY"
    host, port = server.base.removeprefix("http://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as idle:  # the request deadline of the file: 1 s
        idle.sendall(b"GET /health HTTP/1.1\r\n")
        assert idle.recv(100).startswith(b"HTTP/1.1 408")
    server.wait_for("did not arrive completely within 1 s")
    assert server.stop() == 0
    assert database.exists() and not (tmp_path / "ignored.db").exists()
    records = [json.loads(line) for line in server.lines if line.strip()]  # every line parses
    assert {"uvicorn.error", "uvicorn.access", "openroute.messages", "openroute.run"} <= {r["logger"] for r in records}
    assert any(r["logger"] == "uvicorn.access" and "/api/shop/order" in r["message"] for r in records)
    changes = [r for r in records if r["logger"] == "openroute.messages"]
    failed = next(r for r in changes if r["to_state"] == "FAILED")
    assert failed["correlation_id"] == "c-broken" and failed["route"] == "shop/pay"
    assert (failed["from_state"], failed["attempt"], failed["error_code"]) == ("PROCESSING", 1, "ConnectionError")
    ok = next(r for r in changes if r["to_state"] == "OK")
    assert (ok["correlation_id"], ok["error_code"]) == ("c-ok", None)
    # a remote system down is an expected failure: its cause is in the state line, no traceback anywhere
    assert failed["error_text"] == "ConnectionError: billing is down"
    assert not [r for r in records if r["logger"] == "openroute.failures" or "traceback" in r]


def test_the_retention_section_runs_the_deletion_job(tmp_path: Path, serve) -> None:
    """[retention] keep times reach the server: a FAILED message kept for 0 s is deleted and counted in /metrics."""
    (tmp_path / "shopapp.py").write_text(USER_APP, encoding="utf-8")
    (tmp_path / "openroute.toml").write_text(textwrap.dedent('''
        database_url = "sqlite:///retention.db"
        routes = "shopapp:app"
        [retention]
        keep = { FAILED = "0s" }
        interval = "0.2s"
    '''), encoding="utf-8")
    server = serve(["--config", "openroute.toml"], cwd=tmp_path)
    server.wait_for("serving 2 routes of shopapp:app")
    headers = {"X-Source-System": "SHOP", "X-Correlation-Id": "c-gone"}
    assert httpx.post(f"{server.base}/api/shop/pay", json={"n": 1}, headers=headers).status_code == 202
    server.wait_for("PROCESSING -> FAILED")
    deadline = time.monotonic() + 30
    while 'openroute_retention_deleted_total{state="FAILED"} 1.0' not in httpx.get(f"{server.base}/metrics").text:
        assert time.monotonic() < deadline, "the retention job did not delete the FAILED message within 30 s"
        time.sleep(0.1)
    assert server.stop() == 0
    with sqlite3.connect(tmp_path / "retention.db") as connection:
        assert connection.execute("select count(*) from message").fetchone() == (0,)


def test_a_clean_stop_leaves_a_complete_sqlite_file(tmp_path: Path, serve) -> None:
    database = tmp_path / "store.db"
    server = serve(["--database-url", f"sqlite:///{database}", "--routes", "tests.inbound.sample_routes:registry"])
    server.wait_for("serving")
    for n in range(5):
        answer = httpx.post(f"{server.base}/api/orders/create", json={"n": n}, headers={"X-Source-System": "S"})
        assert answer.status_code == 202
    wal = Path(f"{database}-wal")
    assert wal.exists() and wal.stat().st_size > 0  # the writes sit in the write-ahead log while serving
    assert server.stop() == 0
    assert not wal.exists() or wal.stat().st_size == 0
    copy = tmp_path / "backup" / "copy.db"
    copy.parent.mkdir()
    shutil.copyfile(database, copy)  # the .db file alone
    engine = sa.create_engine(f"sqlite:///{copy}")
    with engine.connect() as connection:
        assert connection.execute(sa.text("select count(*) from message")).scalar_one() == 5
    engine.dispose()


# -- start-up mistakes: one line on stderr, a distinct exit code, nothing served --------------------------------

def _one_line(result: subprocess.CompletedProcess[str]) -> str:
    assert "Traceback" not in result.stderr and "serving" not in result.stdout + result.stderr, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("openroute run: ")
    return lines[0]


def test_an_unknown_routes_module_is_exit_3(tmp_path: Path) -> None:
    result = run_fails(["--routes", "no_such_module:registry"], tmp_path)
    assert result.returncode == 3
    assert "cannot import routes module 'no_such_module'" in _one_line(result)
    assert str(tmp_path) in result.stderr


def test_an_error_while_importing_the_application_names_the_file_and_line(tmp_path: Path) -> None:
    (tmp_path / "badapp.py").write_text("import os\n\nvalue = 1 / 0\n", encoding="utf-8")
    result = run_fails(["--routes", "badapp:app"], tmp_path)
    assert result.returncode == 3
    line = _one_line(result)
    assert "badapp.py:3: ZeroDivisionError: division by zero" in line


def test_a_deployment_error_lists_every_problem_on_one_line(tmp_path: Path) -> None:
    (tmp_path / "twice.py").write_text(textwrap.dedent('''
        from openroute.dsl import Application, route

        app = Application(
            route("shop", "order").json().process(lambda e: None),
            route("shop", "order").json().process(lambda e: None),
            route("shop", "empty").json(),
        )
    '''), encoding="utf-8")
    result = run_fails(["--routes", "twice:app"], tmp_path)
    assert result.returncode == 3
    line = _one_line(result)
    assert "2 deployment problems" in line
    assert "route shop/empty has no processing steps" in line and "a route for shop/order is already" in line


def test_a_bad_configuration_is_exit_2_with_every_bad_key(tmp_path: Path) -> None:
    (tmp_path / "openroute.toml").write_text('[engine]\nconcurency = 2\nqueue_size = 0\n', encoding="utf-8")
    result = run_fails(["--config", "openroute.toml"], tmp_path, _environment(OPENROUTE_PORT="eighty"))
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert "engine.concurency: unknown setting" in result.stderr
    assert "engine.queue_size: Input should be greater than or equal to 1, got 0" in result.stderr
    assert "port: Input should be a valid integer" in result.stderr
    result = run_fails(["--config", "missing.toml"], tmp_path)
    assert result.returncode == 2 and "cannot read configuration file missing.toml" in _one_line(result)


def test_an_unreachable_database_is_exit_4(tmp_path: Path) -> None:
    result = run_fails(["--database-url", f"sqlite:///{tmp_path}/no/such/dir/x.db"], tmp_path)
    assert result.returncode == 4
    assert "cannot reach the database sqlite:///" in _one_line(result)
    result = run_fails(["--database-url", "postgresql+psycopg://nobody:secret@127.0.0.1:1/none"], tmp_path)
    assert result.returncode == 4
    line = _one_line(result)
    assert "cannot reach the database postgresql+psycopg://nobody:***@127.0.0.1:1/none" in line
    assert "secret" not in line


def test_an_old_schema_is_exit_5_naming_the_command_and_migrate_fixes_it(tmp_path: Path, serve) -> None:
    url = f"sqlite:///{tmp_path / 'old.db'}"
    store = MessageStore(url)
    store.upgrade("0002")
    store.dispose()
    result = run_fails(["--database-url", url, "--routes", "tests.inbound.sample_routes:registry"], ROOT)
    assert result.returncode == 5
    line = _one_line(result)
    assert f"is at schema revision 0002, this openroute needs {MessageStore.head_revision()}" in line
    assert f"run `openroute db upgrade --database-url {url}` or start with `openroute run --migrate`" in line
    server = serve(["--database-url", url, "--routes", "tests.inbound.sample_routes:registry", "--migrate"])
    server.wait_for("serving")
    assert "migrated from revision 0002" in server.output
    assert server.stop() == 0


def test_a_port_in_use_is_exit_6_and_nothing_says_serving(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run_fails(["--port", str(port), "--database-url", f"sqlite:///{tmp_path / 'p.db'}",
                            "--routes", "tests.inbound.sample_routes:registry"], ROOT)
    assert result.returncode == 6
    assert f"port {port} on 127.0.0.1 is in use" in _one_line(result)


async def test_once_serving_the_start_up_objects_are_frozen_out_of_the_collectors_reach(tmp_path: Path) -> None:
    """In process, through the server ``openroute run`` builds: after the engine started, gc.freeze() has moved what
    start-up loaded to the permanent generation (full collections then walk only what serving creates), and the
    young generation is the wider one of ``openroute.runtime.collector``."""
    import gc

    import httpx

    from openroute.commands.run import _bind, _load_application, _open_store, _server
    from openroute.config import load_config
    from openroute.runtime import collector

    config = load_config(None, {"database_url": f"sqlite:///{tmp_path / 'frozen.db'}", "port": 0})
    store = _open_store(config.resolved_database_url(), migrate=True)
    sock = _bind("127.0.0.1", 0)
    gc.unfreeze()
    thresholds = gc.get_threshold()
    try:
        app = _server(config, _load_application(None), store, sock).config.app.app  # inside StartFailureInOneLine
        assert gc.get_freeze_count() == 0
        async with app.router.lifespan_context(app), httpx.AsyncClient(
                transport=httpx.ASGITransport(app=app), base_url="http://node") as client:
            assert (await client.get("/health")).status_code == 200
            assert gc.get_freeze_count() > 10_000, "the modules, routes and app loaded at start-up are frozen"
            assert gc.get_threshold() == (collector.YOUNG_GENERATION, *thresholds[1:])
    finally:
        gc.unfreeze()
        gc.set_threshold(*thresholds)
        sock.close()
        store.dispose()


async def test_the_served_connections_send_without_waiting_for_acks() -> None:
    """The listening socket of ``openroute run`` names its protocol, so asyncio sets TCP_NODELAY on every accepted
    connection: with Nagle on, a keep-alive response written as headers then body waited for the client's delayed
    ACK (~40 ms a request, measured through the admin API)."""
    import asyncio

    from openroute.commands.run import _bind

    sock = _bind("127.0.0.1", 0)
    accepted: asyncio.Future[int] = asyncio.get_running_loop().create_future()

    class Probe(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            served = transport.get_extra_info("socket")
            accepted.set_result(served.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
            transport.close()

    server = await asyncio.get_running_loop().create_server(Probe, sock=sock)
    try:
        _reader, writer = await asyncio.open_connection(*sock.getsockname()[:2])
        assert await asyncio.wait_for(accepted, timeout=10) == 1
        writer.close()
    finally:
        server.close()
        await server.wait_closed()
