"""Circuit breakers in the admin API (openroute/admin/breakers.py), the message detail's call records and /metrics."""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from openroute.persistence import MessageStore
from openroute.persistence.call_records import CallRecord, CallRecordStore

from openroute.definitions.clock import ManualClock
from openroute.definitions.message import InboundMessage
from openroute.definitions.route import Route, RouteRegistry
from openroute.engine import Engine, EngineSettings
from openroute.inbound import AdminAuth, AdminUser
from openroute.outbound import BreakerSettings, BreakerState, ExternalCalls, ExternalSystem
from openroute.server import create_app

NOW = datetime(2026, 11, 25, 12, 0, tzinfo=UTC)
ADMIN = {"Authorization": "Basic " + base64.b64encode(b"ops:ops-secret").decode()}
VIEWER = {"Authorization": "Basic " + base64.b64encode(b"viewer:viewer-secret").decode()}


@pytest.fixture
async def node(sqlite_url: str) -> AsyncIterator[tuple[Engine, httpx.AsyncClient]]:
    store = MessageStore(sqlite_url)
    store.create_schema()
    clock = ManualClock(NOW)
    calls = ExternalCalls(store, [ExternalSystem("HLR", breaker=BreakerSettings(open_wait=timedelta(seconds=20))),
                                  ExternalSystem("BILLING")], clock=clock)
    engine = Engine(store, RouteRegistry([Route("crm", "activate", [lambda exchange: None])]),
                    EngineSettings(repoll_interval=None, node_id="n1"), clock=clock, external_calls=calls)
    auth = AdminAuth([AdminUser("ops", "ops-secret"), AdminUser("viewer", "viewer-secret", frozenset({"web"}))])
    app = create_app(engine, admin_auth=auth, manage_engine=False)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://testserver") as client:
        yield engine, client
    await engine.stop()
    store.dispose()


async def test_breakers_are_listed_forced_by_an_admin_and_shown_in_metrics(
    node: tuple[Engine, httpx.AsyncClient]
) -> None:
    _engine, client = node
    listed = await client.get("/admin/breakers", headers=VIEWER)
    assert listed.status_code == 200
    assert [(b["system"], b["state"], b["declared"]) for b in listed.json()["breakers"]] == [
        ("BILLING", "CLOSED", True), ("HLR", "CLOSED", True)]
    refused = await client.post("/admin/breakers/HLR/state", json={"state": "OPEN"}, headers=VIEWER)
    assert refused.status_code == 403
    opened = await client.post("/admin/breakers/HLR/state", json={"state": "open"}, headers=ADMIN)
    assert opened.status_code == 200, opened.text
    body = opened.json()
    assert body["state"] == "OPEN" and body["forced"] and body["reason"] == "forced open by admin:ops"
    states = {b["system"]: b["state"] for b in (await client.get("/admin/breakers", headers=ADMIN)).json()["breakers"]}
    assert states == {"BILLING": "CLOSED", "HLR": "OPEN"}
    page = await client.get("/console/nodes", headers=VIEWER)
    assert page.status_code == 200 and 'id="breaker-HLR"' in page.text and "forced open by admin:ops" in page.text
    metrics = (await client.get("/metrics")).text
    assert 'openroute_circuit_breaker_state{state="OPEN",system="HLR"} 1.0' in metrics
    assert 'openroute_circuit_breaker_state{state="CLOSED",system="HLR"} 0.0' in metrics
    closed = await client.post("/admin/breakers/HLR/state", json={"state": "CLOSED"}, headers=ADMIN)
    assert closed.json()["state"] == "CLOSED" and not closed.json()["forced"]


@pytest.mark.parametrize(("content", "headers", "status", "reason"), [
    ('{"state": "OPEN"}', {"Content-Type": "text/plain"}, 415, "needs Content-Type: application/json"),
    ("state=OPEN", {"Content-Type": "application/x-www-form-urlencoded"}, 415, "needs Content-Type: application/json"),
    ("{not json", {"Content-Type": "application/json"}, 400, "must be JSON"),
    ('{"state": "HALF_OPEN"}', {"Content-Type": "application/json"}, 400, "state must be OPEN or CLOSED"),
])
async def test_bad_force_requests_are_refused_and_change_nothing(
    node: tuple[Engine, httpx.AsyncClient], content: str, headers: dict[str, str], status: int, reason: str
) -> None:
    _engine, client = node
    answer = await client.post("/admin/breakers/HLR/state", content=content, headers={**ADMIN, **headers})
    assert answer.status_code == status and reason in answer.json()["reason"]
    states = {b["system"]: b["state"] for b in (await client.get("/admin/breakers", headers=ADMIN)).json()["breakers"]}
    assert states["HLR"] == "CLOSED"


async def test_the_message_detail_shows_its_call_records(node: tuple[Engine, httpx.AsyncClient]) -> None:
    engine, client = node
    accepted = await engine.accept(InboundMessage(
        service="crm", operation="activate", payload="{}", content_type="application/json", correlation_id="c-1",
        source_system="crm"))
    CallRecordStore(engine.store).add(CallRecord(accepted.message_id, "HLR", "activate", NOW, 12, "OK",
                                                 request='{"pin": "***"}', response="done"))
    detail = (await client.get(f"/admin/messages/{accepted.message_id}", headers=ADMIN)).json()
    assert detail["callRecords"] == [{
        "id": 1, "system": "HLR", "callKey": "activate", "startedAt": NOW.isoformat(), "durationMs": 12,
        "outcome": "OK", "request": '{"pin": "***"}', "response": "done", "error": None}]
    page = await client.get(f"/console/messages/{accepted.message_id}", headers=VIEWER)
    assert page.status_code == 200 and 'id="call-records"' in page.text
    assert "{&#34;pin&#34;: &#34;***&#34;}" in page.text


async def test_health_metrics_and_the_dashboard_show_the_open_breaker_and_its_parked_messages(sqlite_url: str) -> None:
    store = MessageStore(sqlite_url)
    store.create_schema()
    clock = ManualClock(NOW)
    calls = ExternalCalls(store, [ExternalSystem("HLR")], clock=clock)

    async def activate(exchange: Any) -> None:
        await exchange.ext_call("activate", lambda: "done", system="HLR")

    engine = Engine(store, RouteRegistry([Route("crm", "activate", [activate])]),
                    EngineSettings(repoll_interval=None, node_id="n1"), clock=clock, external_calls=calls)
    auth = AdminAuth([AdminUser("ops", "ops-secret"), AdminUser("viewer", "viewer-secret", frozenset({"web"}))])
    app = create_app(engine, admin_auth=auth, manage_engine=False)
    await engine.start()
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://testserver") as client:
            healthy = (await client.get("/health")).json()
            assert healthy["status"] == "ok" and healthy["breakers"] == []
            await calls.force("HLR", BreakerState.OPEN, "ops")
            for i in range(3):
                await engine.accept(InboundMessage(service="crm", operation="activate", payload="{}",
                                                   content_type="application/json", correlation_id=f"p-{i}",
                                                   source_system="crm"))
            await engine.wait_idle(10)
            health = await client.get("/health")
            assert health.status_code == 200 and health.json()["status"] == "ok", "the node works: only the body says"
            assert health.json()["breakers"] == [{"system": "HLR", "state": "OPEN", "since": NOW.isoformat(),
                                                  "openUntil": None, "parked": 3}]
            assert 'openroute_parked_messages{system="HLR"} 3.0' in (await client.get("/metrics")).text
            page = await client.get("/console/", headers=VIEWER)
            assert page.status_code == 200 and 'id="held-back-HLR"' in page.text
            assert "breaker-OPEN" in page.text and ">3</a>" in page.text
    finally:
        await engine.stop()
        store.dispose()
