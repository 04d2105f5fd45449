"""The other hops of a trace: the SOAP trace header (and the HTTP header beside it), a broker header on a channel-fed
route, the children of a split, and the outbound SOAP client."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
from openroute.persistence import MessageState, MessageStore
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from openroute import route
from openroute.dsl import Application
from openroute.engine import Engine, EngineSettings
from openroute.inbound.channel import ChannelDelivery, ChannelInbound
from openroute.messaging import Message
from openroute.outbound import SoapService
from openroute.runtime import tracing
from openroute.server import create_app
from tests._support.servers import served
from tests.tracing.conftest import SENDER_SPAN, SENDER_TRACE, SENDER_TRACEPARENT, hex_ids, stored_form

SOAP11 = "http://schemas.xmlsoap.org/soap/envelope/"
TRACE_NS = "urn:openroute:trace:v1"
BILLING_WSDL = Path(__file__).parent.parent / "outbound" / "billing.wsdl"


def soap_order(trace: str) -> bytes:
    return (f'<env:Envelope xmlns:env="{SOAP11}"><env:Header><tr:traceHeader xmlns:tr="{TRACE_NS}">'
            f"<tr:sourceSystem>CRM</tr:sourceSystem><tr:correlationId>s-1</tr:correlationId>{trace}"
            '</tr:traceHeader></env:Header><env:Body><o:order xmlns:o="urn:openroute:service:crm"/></env:Body>'
            "</env:Envelope>").encode()


@contextlib.asynccontextmanager
async def soap_node(store: MessageStore) -> AsyncIterator[tuple[Engine, httpx.AsyncClient]]:
    engine = Engine(store, Application(route("crm", "order").process(lambda exchange: None)).routes,
                    EngineSettings(repoll_interval=None, node_id="soap-node"))
    app = create_app(engine, manage_engine=False)
    await engine.start()
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://testserver") as http:
            yield engine, http
    finally:
        await engine.stop()


SOAP_HEADERS = {"Content-Type": "text/xml; charset=utf-8", "SOAPAction": '"crm/order"'}


async def test_the_soap_trace_header_carries_the_traceparent(store: MessageStore, spans: InMemorySpanExporter) -> None:
    async with soap_node(store) as (engine, http):
        answer = await http.post("/soap/crm", content=soap_order(f"<tr:traceparent>{SENDER_TRACEPARENT}"
                                                                 "</tr:traceparent>"), headers=SOAP_HEADERS)
        assert answer.status_code == 200, answer.text
        await engine.wait_idle(10)
    [accept] = [s for s in spans.get_finished_spans() if s.name == "accept crm/order"]
    assert hex_ids(accept)[0] == SENDER_TRACE and hex_ids(accept)[2] == SENDER_SPAN
    assert accept.attributes is not None and accept.attributes["openroute.endpoint"] == "soap"
    [row] = store.find()
    assert row.state is MessageState.OK and row.traceparent == stored_form(accept)


async def test_a_soap_request_without_the_trace_field_takes_the_http_header(
    store: MessageStore, spans: InMemorySpanExporter
) -> None:
    async with soap_node(store) as (engine, http):
        answer = await http.post("/soap/crm", content=soap_order(""),
                                 headers={**SOAP_HEADERS, "traceparent": SENDER_TRACEPARENT})
        assert answer.status_code == 200, answer.text
        await engine.wait_idle(10)
    [accept] = [s for s in spans.get_finished_spans() if s.name == "accept crm/order"]
    assert hex_ids(accept)[0] == SENDER_TRACE and hex_ids(accept)[2] == SENDER_SPAN


async def test_a_broker_header_carries_the_traceparent_of_a_channel_fed_route(
    store: MessageStore, spans: InMemorySpanExporter
) -> None:
    app = Application(route("crm", "setCustomer").from_channel("crm-in").process(lambda exchange: None))
    engine = Engine(store, app.routes, EngineSettings(repoll_interval=None))
    await engine.start()
    inbound = ChannelInbound(engine, app.channels, {"openroute.messaging.incoming.crm-in.connector": "in-memory",
                                                   "openroute.messaging.incoming.crm-in.source-system": "CRM"},
                             environ={})
    await inbound.start()
    try:
        meta = ChannelDelivery(headers={"traceparent": SENDER_TRACEPARENT}, message_id="m-1",
                               content_type="application/json")
        delivery = inbound.app.connector("in-memory").source("crm-in").send(Message(json.dumps({"n": 1}), (meta,)))
        await asyncio.wait_for(delivery, 10)  # acked: stored
        await engine.wait_idle(10)
    finally:
        await inbound.stop()
        await engine.stop()
    [accept] = [s for s in spans.get_finished_spans() if s.name.startswith("accept ")]
    assert accept.kind is SpanKind.CONSUMER and hex_ids(accept)[:3:2] == (SENDER_TRACE, SENDER_SPAN)
    [attempt] = [s for s in spans.get_finished_spans() if s.name.startswith("attempt ")]
    assert hex_ids(attempt)[2] == hex_ids(accept)[1]
    [row] = store.find()
    assert row.traceparent == stored_form(accept)


async def test_the_children_of_a_split_hang_under_the_step_that_split(
    store: MessageStore, spans: InMemorySpanExporter
) -> None:
    app = Application(
        route("crm", "batch").split(lambda exchange: [{"n": 1}, {"n": 2}], into="item"),
        route("crm", "item").process(lambda exchange: None),
    )
    engine = Engine(store, app.routes, EngineSettings(repoll_interval=None))
    http_app = create_app(engine, manage_engine=False)
    await engine.start()
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=http_app), base_url="http://testserver") as http:
            answer = await http.post("/api/crm/batch", json={}, headers={
                "X-Source-System": "CRM", "X-Correlation-Id": "b-1", "traceparent": SENDER_TRACEPARENT})
            assert answer.status_code == 202
        await engine.wait_idle(10)
    finally:
        await engine.stop()
    finished = spans.get_finished_spans()
    [split] = [s for s in finished if s.name == "step split:item"]
    children = [s for s in finished if s.name == "attempt crm/item"]
    assert len(children) == 2
    assert {hex_ids(s)[0] for s in finished} == {SENDER_TRACE}
    assert [hex_ids(child)[2] for child in children] == [hex_ids(split)[1]] * 2
    parent, *rows = store.find()
    assert parent.state is MessageState.OK and [r.traceparent for r in rows] == [stored_form(split)] * 2


async def test_the_soap_client_sends_the_call_span_as_traceparent(spans: InMemorySpanExporter) -> None:
    seen: list[str | None] = []

    async def billing(request: Request) -> Response:
        seen.append(request.headers.get("traceparent"))
        answer = (f'<s:Envelope xmlns:s="{SOAP11}"><s:Body><b:chargeResponse xmlns:b="urn:example:billing:v1">'
                  "<b:invoiceId>INV-1</b:invoiceId></b:chargeResponse></s:Body></s:Envelope>")
        return Response(answer, 200, media_type="text/xml")

    async with served(Starlette(routes=[Route("/billing", billing, methods=["POST"])])) as url:
        shared = httpx.AsyncClient(timeout=5)
        async with SoapService(BILLING_WSDL, address=f"{url}/billing", http_client=shared) as service:
            tracing.propagate_from(shared)  # a second time: still one hook
            with tracing.call_span("charge", "BILLING", "key-1", 1):
                assert await service.call("charge", customerId="C-1", amount="1") == "INV-1"
            assert await service.call("charge", customerId="C-2", amount="1") == "INV-1"  # outside any span
        await shared.aclose()
    [call] = spans.get_finished_spans()
    assert call.kind is SpanKind.CLIENT and seen == [stored_form(call), None]
