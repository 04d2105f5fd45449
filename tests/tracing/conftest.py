"""Fixtures of the tracing tests: the SDK's in-memory exporter behind openroute.runtime.tracing, a real local HTTP
system (called by a route step, sent the confirmations), and a node (engine, confirmation service, inbound app) on each
database."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from openroute.confirmation import ConfirmationService, DelegateConfirmationCallback, HttpJsonConfirmation
from openroute.persistence import MessageStore
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from openroute.definitions.clock import ManualClock
from openroute.definitions.retry import RetryPolicy
from openroute.definitions.route import Route as RouteDefinition
from openroute.definitions.route import RouteRegistry
from openroute.engine import Engine, EngineSettings
from openroute.outbound import ExternalCalls, ExternalHttpClient, ExternalSystem
from openroute.runtime import tracing
from openroute.server import create_app
from tests._support.servers import served

NOW = datetime(2026, 11, 25, 12, 0, tzinfo=UTC)
#: the sender's trace context (W3C Trace Context's own example)
SENDER_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
SENDER_SPAN = "00f067aa0ba902b7"
SENDER_TRACEPARENT = f"00-{SENDER_TRACE}-{SENDER_SPAN}-01"
RETRY = RetryPolicy(max_attempts=3, interval=timedelta(seconds=1))


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    """Tracing on, every finished span kept in memory; off again after the test."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.enable(provider)
    try:
        yield exporter
    finally:
        tracing.disable()
        provider.shutdown()


@dataclass
class Remote:
    """The external system: ``POST /charges`` (fails the first ``failures`` calls with HTTP 500) and ``POST /confirm``
    (receives the confirmations); ``seen`` holds (path, headers) of every request."""

    failures: int = 0
    seen: list[tuple[str, dict[str, str]]] = field(default_factory=list)
    url: str = ""

    async def charges(self, request: Request) -> Response:
        self.seen.append(("/charges", dict(request.headers)))
        if self.failures > 0:
            self.failures -= 1
            return Response("ledger down", 500)
        return JSONResponse({"chargeId": "CH-1"})

    async def confirm(self, request: Request) -> Response:
        self.seen.append(("/confirm", dict(request.headers)))
        return JSONResponse({"accepted": True})

    def headers_of(self, path: str) -> list[dict[str, str]]:
        return [headers for seen_path, headers in self.seen if seen_path == path]


@pytest.fixture
async def remote() -> AsyncIterator[Remote]:
    system = Remote()
    app = Starlette()
    app.mount("/api", Starlette(routes=[Route("/charges", system.charges, methods=["POST"]),
                                        Route("/confirm", system.confirm, methods=["POST"])]))
    async with served(app) as url:
        system.url = f"{url}/api/"
        yield system


@dataclass
class Node:
    """One node serving route crm/order (a step ``charge`` calling the remote) with confirmations to CRM."""

    engine: Engine
    confirmation: ConfirmationService
    http: httpx.AsyncClient
    billing: ExternalHttpClient

    async def close(self) -> None:
        await self.engine.stop()
        await self.http.aclose()
        await self.billing.aclose()
        await self.confirmation.callback.aclose()  # type: ignore[attr-defined]  # the delegate closes its transports


async def start_node(store: MessageStore, remote: Remote, clock: ManualClock, node_id: str) -> Node:
    """A started node on ``store``: engine (no repoll job: tests call repoll_once), confirmations, inbound app."""
    system = ExternalSystem("BILLING", base_url=remote.url, timeout=5, breaker=None)
    billing = ExternalHttpClient("BILLING")

    async def charge(exchange: Any) -> None:  # the route's one step: one external call to BILLING
        await exchange.ext_call("charge", lambda: billing.post_json("/charges", {"amount": 10}), system="BILLING")

    engine = Engine(store, RouteRegistry([RouteDefinition("crm", "order", [charge], retry_policy=RETRY)]),
                    EngineSettings(repoll_interval=None, node_id=node_id), clock=clock,
                    external_calls=ExternalCalls(store, [system], clock=clock))
    confirmation = ConfirmationService(  # with the span and the traced client the composition root gives
        store, DelegateConfirmationCallback([HttpJsonConfirmation("CRM", f"{remote.url}confirm", timeout=5,
                                                                  prepare_client=tracing.propagate_from)]),
        clock=clock, node_id=node_id, span=tracing.confirmation_span)
    app = create_app(engine, confirmation=confirmation, manage_engine=False)
    http = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://testserver")
    await engine.start()
    return Node(engine, confirmation, http, billing)


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(NOW)


@pytest.fixture
async def node(store: MessageStore, remote: Remote, clock: ManualClock) -> AsyncIterator[Node]:
    started = await start_node(store, remote, clock, "node-a")
    try:
        yield started
    finally:
        await started.close()


def hex_ids(span: ReadableSpan) -> tuple[str, str, str | None]:
    """(trace id, span id, parent span id) of ``span`` in hex, as a traceparent writes them."""
    context = span.get_span_context()
    assert context is not None
    parent = None if span.parent is None else f"{span.parent.span_id:016x}"
    return f"{context.trace_id:032x}", f"{context.span_id:016x}", parent


def stored_form(span: ReadableSpan) -> str:
    """The traceparent naming ``span`` (its flags as the SDK set them: sampled, and random trace id in level 2)."""
    context = span.get_span_context()
    assert context is not None
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{int(context.trace_flags):02x}"


def traceparent_parts(value: str) -> tuple[str, str]:
    """(trace id, parent span id) of a version-00 traceparent header."""
    version, trace_id, parent_id, _flags = value.split("-")
    assert version == "00"
    return trace_id, parent_id
