"""No password of a database URL reaches the output of the CLI, the server's start-up, the log or the Spark jobs."""

from __future__ import annotations

import io
import logging
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from openroute.persistence import mask_secrets, masked_url

from openroute.logs import configure_logging

PLANTED = "Pl4ntedS3cret"
#: a PostgreSQL server that is not there (port 1 refuses), with a password that must never be printed
UNREACHABLE = f"postgresql+psycopg://ops:{PLANTED}@127.0.0.1:1/openroute"
#: a URL SQLAlchemy cannot parse (the port is not a number): its text must be masked all the same
MALFORMED = f"postgresql+psycopg://ops:{PLANTED}@127.0.0.1:notaport/openroute"


def test_masked_url_hides_the_password_of_urls_and_of_text_that_is_no_url() -> None:
    assert masked_url(UNREACHABLE) == "postgresql+psycopg://ops:***@127.0.0.1:1/openroute"
    assert PLANTED not in masked_url(MALFORMED)
    assert masked_url("sqlite:///openroute.db") == "sqlite:///openroute.db"
    text = f"connect {UNREACHABLE} failed; dsn host=db password={PLANTED} user=ops; jdbc:postgresql://u:{PLANTED}@h/d"
    masked = mask_secrets(text)
    assert PLANTED not in masked
    assert "host=db" in masked and "user=ops" in masked and "127.0.0.1:1/openroute" in masked


def _openroute(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "openroute", *args], capture_output=True, text=True, timeout=120,
                          cwd=cwd, stdin=subprocess.DEVNULL)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_cli_and_server_start_up_errors_never_print_the_database_password(tmp_path: Path) -> None:
    """The commands run as real processes, all at once (their start-ups overlap), each against a planted password."""
    commands = {
        "messages-list-unreachable": ["messages", "list", "--database-url", UNREACHABLE],
        "messages-list-malformed": ["messages", "list", "--database-url", MALFORMED],
        "messages-cancel": ["messages", "cancel", "1", "--yes", "--database-url", UNREACHABLE],
        "db-upgrade-unreachable": ["db", "upgrade", "--database-url", UNREACHABLE],
        "db-upgrade-malformed": ["db", "upgrade", "--database-url", MALFORMED],
        "run-unreachable": ["run", "--port", str(_free_port()), "--database-url", UNREACHABLE, "--log-level", "DEBUG"],
        "run-malformed": ["run", "--port", str(_free_port()), "--database-url", MALFORMED, "--log-level", "DEBUG"],
    }
    running = {name: subprocess.Popen([sys.executable, "-m", "openroute", *args], cwd=tmp_path, text=True,
                                      stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
               for name, args in commands.items()}
    for name, process in running.items():
        stdout, stderr = process.communicate(timeout=180)
        output = stdout + stderr
        assert process.returncode != 0, (name, output)
        assert PLANTED not in output, (name, output)
        assert "ops:***@" in output or "***" in output, (name, output)  # the error still names the store
        if name.startswith("run"):
            assert process.returncode in (2, 4), (name, output)


def test_the_log_masks_credentials_in_messages_and_tracebacks() -> None:
    stream = io.StringIO()
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    try:
        for fmt in ("text", "json"):
            configure_logging("INFO", fmt, stream)
            try:
                raise RuntimeError(f"cannot reach {UNREACHABLE}")
            except RuntimeError:
                logging.getLogger("openroute.test").exception("store %s down", UNREACHABLE)
    finally:
        for handler in list(root.handlers):
            root.removeHandler(handler)
        for handler in handlers:
            root.addHandler(handler)
        root.setLevel(level)
    text = stream.getvalue()
    assert "store postgresql+psycopg://ops:***@127.0.0.1:1/openroute down" in text
    assert PLANTED not in text


def test_spark_setup_errors_and_report_settings_mask_the_password() -> None:
    pytest.importorskip("pyspark")
    from openroute.spark.session import SparkSetupError, first_line, jdbc_source

    for url in (f"mysql://ops:{PLANTED}@db/x", f"sqlite://ops:{PLANTED}@/", f"no url ops:{PLANTED}@x"):
        with pytest.raises(SparkSetupError) as raised:
            jdbc_source(url)
        assert PLANTED not in str(raised.value), str(raised.value)
    assert PLANTED not in first_line(RuntimeError(f"JDBC failed for jdbc:postgresql://ops:{PLANTED}@db/x"))


def _leaky(exchange: object) -> None:
    raise ConnectionError(f"POST https://svc:{PLANTED}@billing.example/charge failed: refused")


async def test_error_texts_shown_to_operators_mask_credentials(sqlite_url: str, tmp_path: Path) -> None:
    import httpx
    from openroute.persistence import MessageStore

    from openroute.engine import Engine, EngineSettings
    from openroute.inbound import AdminAuth, AdminUser
    from openroute.message import InboundMessage
    from openroute.retry import RetryPolicy
    from openroute.route import Route, RouteRegistry
    from openroute.server import create_app

    store = MessageStore(sqlite_url)
    store.create_schema()
    routes = RouteRegistry([Route("billing", "charge", [_leaky], retry_policy=RetryPolicy(max_attempts=1))])
    engine = Engine(store, routes, EngineSettings(repoll_interval=None, node_id="secrets"))
    await engine.start()
    try:
        accepted = await engine.accept(InboundMessage(service="billing", operation="charge", payload="{}",
                                                      content_type="application/json", correlation_id="s-1",
                                                      source_system="CRM"))
        await engine.wait_idle(20)
        # stored masked: a search by error text finds only what is shown
        stored = store.get(accepted.message_id)
        assert stored is not None and "svc:***@billing.example" in (stored.last_error_text or "")
        app = create_app(engine, admin_auth=AdminAuth([AdminUser("ops", "ops-secret")]), manage_engine=False)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://n",
                                     auth=("ops", "ops-secret")) as http:
            detail = await http.get(f"/admin/messages/{accepted.message_id}")
            page = await http.get(f"/console/messages/{accepted.message_id}")
        assert detail.status_code == 200 and page.status_code == 200
        assert "svc:***@billing.example" in detail.json()["lastErrorText"]
        assert PLANTED not in detail.text and PLANTED not in page.text
    finally:
        await engine.stop()
        store.dispose()
    shown = _openroute("messages", "show", str(accepted.message_id), "--database-url", sqlite_url, cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert "svc:***@billing.example" in shown.stdout and PLANTED not in shown.stdout + shown.stderr
