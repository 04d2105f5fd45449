"""Alerts (openroute/alerts/): fire once, repeat no more often than the repeat interval, resolve once, across two
nodes on one PostgreSQL database; a webhook to a local HTTP server; a failing notifier does not block the others."""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from openroute.persistence import MessageState, MessageStore
from openroute.persistence.alerts import AlertState
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from openroute import BusinessError, ConfigurationError
from openroute.alerts import (
    EXAMPLE_RULES,
    AlertEvaluator,
    AlertRule,
    LogNotifier,
    Notification,
    NotificationKind,
    Notifier,
    WebhookNotifier,
    decide,
)
from openroute.definitions.clock import ManualClock
from openroute.definitions.message import InboundMessage
from openroute.definitions.route import Route as RouteDefinition
from openroute.definitions.route import RouteRegistry
from openroute.engine import Engine, EngineSettings
from tests._support.servers import served

NOW = datetime(2026, 11, 25, 12, 0, tzinfo=UTC)
FAILED_RULE = AlertRule("failed-last-10-min", states=("FAILED",), window=timedelta(minutes=10), limit=0,
                        interval=timedelta(seconds=30), repeat_interval=timedelta(hours=1))


def test_decide_fires_once_repeats_after_the_interval_and_resolves_once() -> None:
    state = AlertState("r")
    state, kind = decide(FAILED_RULE, state, 2, NOW)
    assert kind is NotificationKind.FIRING and state.firing and state.fired_at == NOW
    state, kind = decide(FAILED_RULE, state, 3, NOW + timedelta(minutes=59))
    assert kind is None and state.firing and state.value == 3
    state, kind = decide(FAILED_RULE, state, 3, NOW + timedelta(hours=1))
    assert kind is NotificationKind.REPEAT
    state, kind = decide(FAILED_RULE, state, 0, NOW + timedelta(hours=2))
    assert kind is NotificationKind.RESOLVED and not state.firing and state.resolved_at == NOW + timedelta(hours=2)
    state, kind = decide(FAILED_RULE, state, 0, NOW + timedelta(hours=3))
    assert kind is None


def test_bad_rules_are_configuration_errors_and_the_examples_are_disabled() -> None:
    with pytest.raises(ConfigurationError, match="give count filters or sql, not both"):
        AlertRule("x", states=("FAILED",), sql="SELECT 1")
    with pytest.raises(ConfigurationError, match="'LOST' is not a valid MessageState"):
        AlertRule("x", states=("LOST",))
    assert [rule.name for rule in EXAMPLE_RULES] == ["failed-last-10-min", "children-waiting-over-1h", "breaker-open"]
    assert not any(rule.enabled for rule in EXAMPLE_RULES)


class Receiver:
    """A local webhook receiver that records the JSON bodies."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []

    async def hook(self, request: Request) -> Response:
        self.bodies.append(await request.json())
        return Response(status_code=204)


class Broken(Notifier):
    name = "broken"

    async def notify(self, notification: Notification) -> None:
        raise ConnectionError("mail server down")


async def fail_messages(store: MessageStore, clock: ManualClock, count: int, prefix: str) -> None:
    def refuse(_exchange: Any) -> None:
        raise BusinessError("REFUSED", "no")

    engine = Engine(store, RouteRegistry([RouteDefinition("crm", "order", [refuse])]),
                    EngineSettings(repoll_interval=None, node_id=f"worker-{prefix}"), clock=clock)
    await engine.start()
    for index in range(count):
        await engine.accept(InboundMessage(service="crm", operation="order", payload="{}",
                                           content_type="application/json", correlation_id=f"{prefix}-{index}",
                                           source_system="crm"))
    await engine.wait_idle(10)
    await engine.stop()
    assert store.count_by_state().get(MessageState.FAILED, 0) >= count


@pytest.mark.postgres
async def test_two_nodes_fire_repeat_and_resolve_once_through_a_webhook(
    postgres_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    receiver = Receiver()
    node_a, node_b = MessageStore(postgres_url), MessageStore(postgres_url)
    node_a.create_schema()
    clock = ManualClock(NOW)
    caplog.set_level(logging.INFO, "openroute.alerts")
    try:
        async with served(Starlette(routes=[Route("/hook", receiver.hook, methods=["POST"])])) as url:
            def evaluator(store: MessageStore, node: str) -> AlertEvaluator:
                notifiers = [WebhookNotifier("ops", f"{url}/hook"), Broken(), LogNotifier()]
                return AlertEvaluator(store, [FAILED_RULE], notifiers, node_id=node, clock=clock)

            a, b = evaluator(node_a, "node-a"), evaluator(node_b, "node-b")

            async def period() -> list[Notification]:
                both = await asyncio.gather(a.evaluate_once(), b.evaluate_once())
                clock.advance(FAILED_RULE.interval)
                return [n for sent in both for n in sent]

            assert await period() == [], "nothing FAILED: the rule holds for nobody"
            await fail_messages(node_a, clock, 2, "x")
            fired = await period()
            assert [(n.kind, n.value) for n in fired] == [(NotificationKind.FIRING, 2)]
            for _ in range(3):
                assert await period() == [], "still firing, the repeat interval has not passed"
            # a third node started later (a restart) sees the stored state: no second "firing"
            c = evaluator(node_b, "node-c")
            clock.advance(FAILED_RULE.interval)
            assert await c.evaluate_once() == []
            clock.advance(timedelta(minutes=58))
            await fail_messages(node_b, clock, 1, "y")
            repeated = await period()
            assert [(n.kind, n.value) for n in repeated] == [(NotificationKind.REPEAT, 1)]
            clock.advance(timedelta(minutes=11))  # the FAILED messages leave the 10-minute window
            resolved = await period()
            assert [(n.kind, n.value) for n in resolved] == [(NotificationKind.RESOLVED, 0)]
            assert await period() == []
        assert [body["status"] for body in receiver.bodies] == ["firing", "repeat", "resolved"]
        assert receiver.bodies[0]["rule"] == "failed-last-10-min" and receiver.bodies[0]["value"] == 2
        broken = [r for r in caplog.records if "notifier broken could not send" in r.getMessage()]
        assert len(broken) == 3 and all(r.exc_info is None for r in broken)
        logged = [r.getMessage() for r in caplog.records if r.getMessage().startswith("alert failed-last-10-min")]
        assert logged == ["alert failed-last-10-min firing: 2 > 0", "alert failed-last-10-min repeat: 1 > 0",
                          "alert failed-last-10-min resolved: 0 <= 0"]
    finally:
        node_a.dispose()
        node_b.dispose()


async def test_a_sql_rule_counts_open_breakers_and_a_broken_rule_is_one_log_line(
    store: MessageStore, caplog: pytest.LogCaptureFixture
) -> None:
    from openroute.outbound import BreakerState, ExternalCalls

    clock = ManualClock(NOW)
    breaker = next(rule for rule in EXAMPLE_RULES if rule.name == "breaker-open")
    enabled = AlertRule(breaker.name, sql=breaker.sql, limit=0, interval=breaker.interval)
    bad = AlertRule("bad", sql="SELECT 'many'")
    evaluator = AlertEvaluator(store, [enabled, bad], [LogNotifier()], node_id="n", clock=clock)
    caplog.set_level(logging.WARNING, "openroute.alerts")
    assert await evaluator.evaluate_once() == []
    await ExternalCalls(store, clock=clock).force("HLR", BreakerState.OPEN, "ops")
    clock.advance(enabled.interval)
    [fired] = await evaluator.evaluate_once()
    assert fired.rule == "breaker-open" and fired.kind is NotificationKind.FIRING and fired.value == 1
    assert "alert rule bad could not be evaluated: ConfigurationError" in caplog.text


def test_alerts_are_configured_in_the_toml_file(tmp_path: Any) -> None:
    from openroute.config import load_config

    path = tmp_path / "openroute.toml"
    path.write_text("""
[alerts.notifiers.ops]
type = "webhook"
url = "http://ops.example/hook"

[alerts.rules.failed]
states = ["FAILED"]
window = "10m"
notifiers = ["ops"]

[alerts.rules.stuck]
enabled = false
sql = "SELECT 1"
notifiers = ["pager"]
""")
    with pytest.raises(ConfigurationError, match=r"alerts: rules.stuck: notifiers \['pager'\] are not configured"):
        load_config(path)
    path.write_text(path.read_text().replace('notifiers = ["pager"]', ""))
    config = load_config(path)
    evaluator = config.alerts.evaluator(MessageStore(f"sqlite:///{tmp_path}/a.db"), "n1")
    assert [rule.name for rule in evaluator.rules] == ["failed"] and list(evaluator.notifiers) == ["ops"]


class SmtpSink:
    """A minimal SMTP server on 127.0.0.1 that keeps the messages it receives (enough for smtplib's dialogue)."""

    def __init__(self) -> None:
        self.messages: list[str] = []
        self.recipients: list[str] = []

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"220 sink ready\r\n")
        data: list[str] | None = None
        while line := await reader.readline():
            text = line.decode().rstrip("\r\n")
            if data is not None:
                if text == ".":
                    self.messages.append("\n".join(data))
                    data = None
                    writer.write(b"250 queued\r\n")
                else:
                    data.append(text)
                continue
            verb = text.split(" ")[0].upper()
            if verb == "EHLO":
                writer.write(b"250 sink\r\n")
            elif verb == "RCPT":
                self.recipients.append(text)
                writer.write(b"250 ok\r\n")
            elif verb == "DATA":
                data = []
                writer.write(b"354 go on\r\n")
            elif verb == "QUIT":
                writer.write(b"221 bye\r\n")
                await writer.drain()
                break
            else:
                writer.write(b"250 ok\r\n")
            await writer.drain()
        writer.close()


async def test_the_smtp_notifier_sends_one_mail_per_notification() -> None:
    from openroute.alerts import SmtpNotifier

    sink = SmtpSink()
    server = await asyncio.start_server(sink.handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        notifier = SmtpNotifier("mail", "127.0.0.1", ["ops@example.com"], sender="openroute@example.com", port=port)
        await notifier.notify(Notification("breaker-open", NotificationKind.FIRING, 1, 0, NOW, "a breaker is open"))
    finally:
        server.close()
        await server.wait_closed()
    [mail] = sink.messages
    assert "Subject: [openroute] alert breaker-open firing: 1 > 0" in mail and "rule: breaker-open" in mail
    assert [r.split(":", 1)[1] for r in sink.recipients] == ["<ops@example.com>"]
