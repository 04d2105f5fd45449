"""No password of a database URL reaches the output of the CLI, the server's start-up, the log or the Spark jobs."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from openroute.runtime.logs import configure_logging

PLANTED = "Pl4ntedS3cret"
#: a PostgreSQL server that is not there (port 1 refuses), with a password that must never be printed
UNREACHABLE = f"postgresql+psycopg://ops:{PLANTED}@127.0.0.1:1/openroute"
#: a URL SQLAlchemy cannot parse (the port is not a number): its text must be masked all the same
MALFORMED = f"postgresql+psycopg://ops:{PLANTED}@127.0.0.1:notaport/openroute"


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


def _root_logging_kept() -> Callable[[], None]:
    """The root logger's handlers and level now; the function returned puts them back (after configure_logging)."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level

    def restore() -> None:
        for handler in list(root.handlers):
            root.removeHandler(handler)
        for handler in handlers:
            root.addHandler(handler)
        root.setLevel(level)

    return restore


def test_the_log_masks_credentials_in_messages_and_tracebacks() -> None:
    stream = io.StringIO()
    restore_logging = _root_logging_kept()
    try:
        for fmt in ("text", "json"):
            configure_logging("INFO", fmt, stream)
            try:
                raise RuntimeError(f"cannot reach {UNREACHABLE}")
            except RuntimeError:
                logging.getLogger("openroute.test").exception("store %s down", UNREACHABLE)
    finally:
        restore_logging()
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

    from openroute.definitions.message import InboundMessage
    from openroute.definitions.retry import RetryPolicy
    from openroute.definitions.route import Route, RouteRegistry
    from openroute.engine import Engine, EngineSettings
    from openroute.inbound import AdminAuth, AdminUser
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


#: the secrets a remote system, a configuration and a route plant, each once, each a distinct word
S = {name: f"Pl4nted{name}X" for name in ("Url", "Pin", "Token", "Link", "Inner", "Key", "Line", "Attr", "Cdata",
                                         "Access", "Sig", "Sent", "Confirm", "Alert", "Business")}


class _Remote:
    """The external system BILLING (its answers carry secrets), the source system's confirmation receiver and the
    alerts' webhook, recording what they were sent."""

    def __init__(self) -> None:
        self.received: list[str] = []

    async def lookup(self, _request: Any) -> Any:
        from starlette.responses import JSONResponse

        return JSONResponse({"pin": S["Pin"], "token": S["Token"], "link": f"https://u:{S['Link']}@h/x",
                             "nested": json.dumps({"password": S["Inner"]}), "ok": True})

    async def charge(self, _request: Any) -> Any:
        from starlette.responses import Response

        body = (f'\ufeff{{"apikey": "{S["Key"]}"}} trailing Password: {S["Line"]} <auth pin="{S["Attr"]}">'
                f'<secret><![CDATA[{S["Cdata"]}]]></secret></auth> https://api/x?access_token={S["Access"]}'
                f'&sig={S["Sig"]}')
        return Response(body, 500)

    async def sink(self, request: Any) -> Any:
        from starlette.responses import Response

        self.received.append((await request.body()).decode())
        return Response("down", 500)  # the confirmation fails: its error is stored and shown

    def app(self) -> Any:
        from starlette.applications import Starlette
        from starlette.routing import Route as HttpRoute

        return Starlette(routes=[HttpRoute("/api/lookup", self.lookup), HttpRoute("/api/charge", self.charge,
                                                                                 methods=["POST"]),
                                 HttpRoute("/confirm", self.sink, methods=["POST"]),
                                 HttpRoute("/alert", self.sink, methods=["POST"])])


async def test_planted_secrets_reach_no_output(tmp_path: Path) -> None:
    """Secrets planted in an external system's URL, its answers, its failure, a business error, a confirmation
    target and an alert: none reaches the admin API (admin and web role), the console, the CLI, the log, the call
    records, the outcome events, the confirmation, the alert or a stored error text, and a search by error text
    does not confirm one."""
    import httpx
    from openroute.confirmation import (
        ConfirmationPolicy,
        ConfirmationService,
        DelegateConfirmationCallback,
        HttpJsonConfirmation,
    )
    from openroute.persistence import MessageState, MessageStore

    from openroute.alerts import AlertEvaluator, AlertRule, WebhookNotifier
    from openroute.definitions.errors import BusinessError
    from openroute.definitions.message import InboundMessage
    from openroute.definitions.retry import RetryPolicy
    from openroute.definitions.route import Route, RouteRegistry
    from openroute.engine import Engine, EngineSettings
    from openroute.engine.outbox import OutboxPublisher, OutboxSettings, OutcomeEvents
    from openroute.inbound import AdminAuth, AdminUser
    from openroute.outbound import CallRecordSettings, ExternalCalls, ExternalHttpClient, ExternalSystem
    from openroute.runtime.logs import AttemptFailureLog, log_transition
    from openroute.server import create_app
    from tests._support.servers import served

    url = f"sqlite:///{tmp_path / 'store.db'}"
    store = MessageStore(url)
    store.create_schema()
    remote = _Remote()
    log_stream = io.StringIO()
    restore_logging = _root_logging_kept()
    configure_logging("DEBUG", "text", log_stream)
    try:
        async with served(remote.app()) as base:
            address = base.removeprefix("http://")
            system = ExternalSystem("BILLING", base_url=f"http://svc:{S['Url']}@x@{address}/api/", timeout=5,
                                    records=CallRecordSettings(enabled=True, secret_fields=("pin",)))
            client = ExternalHttpClient("BILLING")

            async def bill(exchange: Any) -> None:
                if json.loads(exchange.payload).get("business"):
                    raise BusinessError("REFUSED", f"the card was refused (token={S['Business']})")
                await exchange.ext_call("lookup", lambda: client.get_json("lookup"), system="BILLING")
                await exchange.ext_call("charge", lambda: client.post_json("charge", {"pin": S["Sent"]}),
                                        system="BILLING")

            routes = RouteRegistry([Route("shop", "order", [bill], retry_policy=RetryPolicy(max_attempts=1))])
            engine = Engine(store, routes, EngineSettings(repoll_interval=None, node_id="secrets"),
                            interceptors=[AttemptFailureLog()], external_calls=ExternalCalls(store, [system]))
            engine.on_transition(log_transition)
            confirm = HttpJsonConfirmation("CRM", f"{base}/confirm?apikey={S['Confirm']}")
            confirmation = ConfirmationService(store, DelegateConfirmationCallback([confirm]),
                                               ConfirmationPolicy(max_attempts=1), node_id="secrets")
            events = OutboxPublisher(store, [OutcomeEvents("events")],
                                     {"openroute.messaging.outgoing.events.connector": "in-memory"},
                                     node_id="secrets", settings=OutboxSettings(interval=0.05), environ={})
            auth = AdminAuth([AdminUser("ops", "ops-secret"), AdminUser("viewer", "viewer-secret",
                                                                         frozenset({"web"}))])
            app = create_app(engine, admin_auth=auth, confirmation=confirmation, outbox=events, manage_engine=False)
            await engine.start()
            await events.start()
            try:
                ids = [(await engine.accept(InboundMessage(
                    service="shop", operation="order", payload=json.dumps(body), content_type="application/json",
                    correlation_id=f"c-{n}", source_system="CRM"))).message_id
                    for n, body in enumerate(({}, {"business": True}))]
                await engine.wait_idle(20)
                await events.publish_once()
                deadline = asyncio.get_running_loop().time() + 20
                while len(remote.received) < 2:  # both confirmations tried (each answered 500)
                    assert asyncio.get_running_loop().time() < deadline, remote.received
                    await asyncio.sleep(0.02)
                alerts = AlertEvaluator(store, [AlertRule("failed", states=(MessageState.FAILED,),
                                                          description=f"page ops (token={S['Alert']})")],
                                        [WebhookNotifier("hook", f"{base}/alert")], node_id="secrets")
                await alerts.evaluate_once()
                outputs: dict[str, str] = {
                    "confirmations": "\n".join(remote.received),
                    "events": "\n".join(str(m.payload) for m in
                                        events.app.connector("in-memory").sink("events").received),
                }
                async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://n") as http:
                    for user, password in (("ops", "ops-secret"), ("viewer", "viewer-secret")):
                        for message_id in ids:
                            for path in (f"/admin/messages/{message_id}", f"/console/messages/{message_id}"):
                                answer = await http.get(path, auth=(user, password))
                                assert answer.status_code == 200, (path, answer.text)
                                outputs[f"{user} {path}"] = answer.text
                    outputs["log"] = log_stream.getvalue()  # before the searches, whose URLs hold the needles
                    found = {}
                    for needle in (S["Key"], S["Line"], "apikey", "Password: ***"):
                        answer = await http.get("/admin/messages", params={"error_text": needle},
                                                auth=("viewer", "viewer-secret"))
                        found[needle] = answer.json()["total"]
            finally:
                await events.stop()
                await engine.stop()
                await client.aclose()
        with store.engine.connect() as connection:
            outputs["stored texts"] = "\n".join(str(value) for row in connection.execute(sa.text(
                "SELECT last_error_text, last_error_trace, business_errors FROM message UNION ALL "
                "SELECT error_text, error_trace, cause FROM message_transition UNION ALL "
                "SELECT last_error, call_key, status FROM external_call UNION ALL "
                "SELECT request, response, error FROM call_record UNION ALL "
                "SELECT last_error, status, confirmation_id FROM confirmation")) for value in row)
    finally:
        restore_logging()
        store.dispose()
    config = tmp_path / "openroute.toml"
    config.write_text(f'database_url = "{url}"\n\n[external_systems.BILLING]\nbase_url = "http://billing/"\n'
                      '[external_systems.BILLING.records]\nsecret_fields = ["pin"]\n')
    for message_id in ids:
        shown = _openroute("messages", "show", str(message_id), "--config", str(config), cwd=tmp_path)
        assert shown.returncode == 0, shown.stderr
        outputs[f"cli {message_id}"] = shown.stdout + shown.stderr
    leaks = {where: sorted(name for name, secret in S.items() if secret in text) for where, text in outputs.items()}
    assert all(not names for names in leaks.values()), {where: names for where, names in leaks.items() if names}
    # the texts are there, masked: what was planted went through each path
    assert "***" in outputs["confirmations"] and "***" in outputs["events"] and "***" in outputs["stored texts"]
    assert "token=***" in outputs["log"] and "pin" in outputs["ops /admin/messages/1"]
    # a search by error text matches the text shown, never the secret behind a mask
    assert found == {S["Key"]: 0, S["Line"]: 0, "apikey": 1, "Password: ***": 1}, found
