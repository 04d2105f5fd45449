"""The outbound HTTP client (openroute/outbound/http.py) against a real local HTTP server: settings from the declared
system, the Idempotency-Key header, errors by kind, the request and response in the call record, one DEBUG line."""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import pytest
from openroute.persistence import MessageStore
from openroute.persistence.call_records import CallRecordStore
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from openroute import BusinessError, ConfigurationError, TechnicalError
from openroute.definitions.clock import ManualClock
from openroute.definitions.message import InboundMessage
from openroute.outbound import (
    IDEMPOTENCY_KEY_HEADER,
    CallRecordSettings,
    ExternalCalls,
    ExternalHttpClient,
    ExternalSystem,
)
from tests._support.servers import served

NOW = datetime(2026, 11, 25, 12, 0, tzinfo=UTC)


class Billing:
    """A small HTTP system: POST /charges answers JSON; /missing 404; /broken 500; /slow never in time."""

    def __init__(self) -> None:
        self.seen: list[dict[str, Any]] = []

    async def charges(self, request: Request) -> Response:
        body = await request.json()
        self.seen.append({"headers": dict(request.headers), "body": body})
        return JSONResponse({"chargeId": "CH-1", "card": body.get("card")})

    async def missing(self, _request: Request) -> Response:
        return JSONResponse({"error": "no such account"}, 404)

    async def broken(self, _request: Request) -> Response:
        return Response("database down", 500)

    async def slow(self, _request: Request) -> Response:
        await asyncio.sleep(1)
        return Response("late")

    def app(self) -> Starlette:
        return Starlette(routes=[Route("/charges", self.charges, methods=["POST"]),
                                 Route("/missing", self.missing, methods=["POST"]),
                                 Route("/broken", self.broken, methods=["POST"]),
                                 Route("/slow", self.slow, methods=["POST"])])


@pytest.fixture
async def billing_url() -> AsyncIterator[tuple[Billing, str]]:
    billing = Billing()
    app = Starlette()
    app.mount("/api", billing.app())
    async with served(app) as url:
        yield billing, f"{url}/api/"


async def test_a_route_calls_a_declared_system_with_its_settings_key_and_record(
    sqlite_url: str, billing_url: tuple[Billing, str], caplog: pytest.LogCaptureFixture
) -> None:
    from openroute.persistence import MessageState

    from openroute.definitions.route import Route as RouteDefinition
    from openroute.definitions.route import RouteRegistry
    from openroute.engine import Engine, EngineSettings

    billing, url = billing_url
    store = MessageStore(sqlite_url)
    store.create_schema()
    system = ExternalSystem("BILLING", base_url=url, timeout=5, headers={"X-Client": "openroute"},
                            records=CallRecordSettings(enabled=True, secret_fields=("card",)))
    calls = ExternalCalls(store, [system], clock=ManualClock(NOW))
    client = ExternalHttpClient("BILLING")

    async def charge(exchange: Any) -> Any:
        return await exchange.ext_call("charge", lambda: client.post_json(
            "/charges", {"amount": 10, "card": "4111"}, idempotency_key=f"msg-{exchange.message.id}-charge"),
            system="BILLING")

    engine = Engine(store, RouteRegistry([RouteDefinition("crm", "order", [charge])]),
                    EngineSettings(repoll_interval=None, node_id="n1"), clock=ManualClock(NOW), external_calls=calls)
    caplog.set_level(logging.DEBUG, "openroute.outbound")
    await engine.start()
    try:
        accepted = await engine.accept(InboundMessage(
            service="crm", operation="order", payload="{}", content_type="application/json", correlation_id="o-1",
            source_system="crm"))
        await engine.wait_idle(10)
    finally:
        await engine.stop()
        await client.aclose()
    row = store.get(accepted.message_id)
    assert row is not None and row.state is MessageState.OK
    [seen] = billing.seen
    assert seen["headers"][IDEMPOTENCY_KEY_HEADER.lower()] == f"msg-{accepted.message_id}-charge"
    assert seen["headers"]["x-client"] == "openroute" and seen["body"] == {"amount": 10, "card": "4111"}
    [record] = CallRecordStore(store).of_message(accepted.message_id)
    assert record.outcome == "OK" and record.system == "BILLING" and record.call_key == "charge"
    assert record.request == f'POST {url}charges\n{{"amount": 10, "card": "***"}}'
    assert record.response == 'HTTP 200\n{"chargeId":"CH-1","card":"***"}'  # as received, masked
    lines = [r for r in caplog.records if r.name == "openroute.outbound" and r.levelno == logging.DEBUG]
    assert len(lines) == 1 and lines[0].getMessage().startswith(f"call BILLING charge for message {row.id}: OK in")
    store.dispose()


async def test_errors_by_kind(billing_url: tuple[Billing, str]) -> None:
    _billing, url = billing_url
    async with ExternalHttpClient(ExternalSystem("BILLING", base_url=url, timeout=0.3)) as client:
        with pytest.raises(BusinessError) as business:
            await client.post_json("missing", {})
        assert business.value.code == "HTTP_404" and "no such account" in business.value.text
        with pytest.raises(TechnicalError) as technical:
            await client.post_json("broken", {})
        assert technical.value.code == "HTTP_500" and "database down" in str(technical.value)
        with pytest.raises(TechnicalError) as slow:
            await client.post_json("slow", {})
        assert slow.value.code == "TIMEOUT"
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()  # nobody listens there now
    async with ExternalHttpClient(ExternalSystem("BILLING", base_url=f"http://127.0.0.1:{port}/")) as client:
        with pytest.raises(TechnicalError) as refused:
            await client.post_json("charges", {})
        assert refused.value.code == "CONNECTION_ERROR"


async def test_a_client_by_name_outside_its_ext_call_says_what_is_missing() -> None:
    client = ExternalHttpClient("BILLING")
    with pytest.raises(ConfigurationError, match=r"used outside an ext_call\(..., system='BILLING'\) step"):
        await client.post_json("/charges", {})
    await client.aclose()
    with pytest.raises(ConfigurationError, match="has no base_url"):
        await ExternalHttpClient(ExternalSystem("X")).request("GET")
