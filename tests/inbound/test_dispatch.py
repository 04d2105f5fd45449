"""``InboundDispatch`` (openroute/inbound/app.py): POSTs to the inbound endpoints skip the router and are answered
exactly as the router's routes answer them."""

from __future__ import annotations

import json
import re

import httpx
import pytest
from openroute.persistence import MessageStore
from starlette.applications import Starlette

from tests.inbound.conftest import API_KEY, SOAP11_HEADERS, basic, create_order, envelope, stored


def _same_answer(direct: httpx.Response, routed: httpx.Response) -> None:
    """The same answer but for the message id and the correlation id (``<name>-direct`` / ``<name>-routed``)."""
    assert direct.status_code == routed.status_code
    assert direct.headers.keys() == routed.headers.keys()
    for name in direct.headers.keys() - {"x-message-id", "content-length", "x-correlation-id"}:
        assert direct.headers[name] == routed.headers[name], name
    ids = re.compile(rb"<ib:messageId>\d+</ib:messageId>|\"messageId\":\d+|-direct|-routed")
    assert ids.sub(b"id", direct.content) == ids.sub(b"id", routed.content)


@pytest.fixture
async def routed(app: Starlette) -> httpx.AsyncClient:
    """A client whose requests come under a root path: the dispatch leaves them to the router."""
    transport = httpx.ASGITransport(app=app, root_path="/node")
    return httpx.AsyncClient(transport=transport, base_url="http://testserver/node")


async def test_soap_answers_and_faults_are_those_of_the_router(
    client: httpx.AsyncClient, routed: httpx.AsyncClient, store: MessageStore
) -> None:
    async with routed:
        for order, body in (("O-1", create_order("O-1")), ("O-2", "<unknown xmlns='urn:x'/>")):
            answers = []
            for name, sender in (("direct", client), ("routed", routed)):
                trace = {"correlationId": f"c-{order}-{name}", "sourceSystem": "CRM"}
                answers.append(await sender.post("/soap/orders", content=envelope(body, trace=trace),
                                                 headers={**SOAP11_HEADERS, **basic()}))
            _same_answer(*answers)
    assert [row["correlation_id"] for row in stored(store)] == ["c-O-1-direct", "c-O-1-routed"]


async def test_json_answers_and_refusals_are_those_of_the_router(
    client: httpx.AsyncClient, routed: httpx.AsyncClient, store: MessageStore
) -> None:
    headers = {"X-Api-Key": API_KEY, "X-Source-System": "ERP", "Content-Type": "application/json"}
    async with routed:
        for number, document in enumerate(({"orderId": "O-1", "customer": {"id": "C-1"}}, {"orderId": "O-2"})):
            answers = []
            for name, sender in (("direct", client), ("routed", routed)):
                answers.append(await sender.post("/api/orders/create", content=json.dumps(document),
                                                 headers={**headers, "X-Correlation-Id": f"j-{number}-{name}"}))
            _same_answer(*answers)
        assert answers[0].status_code == 400
    assert [row["correlation_id"] for row in stored(store)] == ["j-0-direct", "j-0-routed"]


def test_only_the_paths_of_the_post_routes_are_dispatched(app: Starlette) -> None:
    inbound = app.state.inbound
    assert inbound.post_endpoint("/soap/orders") == (inbound.soap, {"service": "orders"})
    assert inbound.post_endpoint("/api/orders/create") == (inbound.json, {"service": "orders", "operation": "create"})
    for path in ("/soap/", "/soap/a/b", "/api/orders", "/api/orders/", "/api//create", "/api/a/b/c", "/admin/x",
                 "/soapy/orders", "/api/openapi.json"):
        assert inbound.post_endpoint(path) is None, path


async def test_other_methods_and_paths_still_take_the_router(client: httpx.AsyncClient) -> None:
    assert (await client.get("/soap/orders?wsdl")).status_code == 200
    assert (await client.get("/api/openapi.json")).status_code == 200
    refused = await client.put("/soap/orders", content=b"<x/>")
    assert refused.status_code == 405 and refused.headers["allow"] == "POST"
    assert (await client.post("/soap/orders/extra", content=b"<x/>")).status_code == 404


async def test_dispatched_answers_carry_the_security_headers_after_their_own(
    client: httpx.AsyncClient, routed: httpx.AsyncClient
) -> None:
    from openroute.auth.headers import SECURITY_HEADERS

    trace = {"correlationId": "c-headers", "sourceSystem": "CRM"}
    accepted = await client.post("/soap/orders", content=envelope(create_order("O-9"), trace=trace),
                                 headers={**SOAP11_HEADERS, **basic()})
    fault = await client.post("/soap/orders", content=b"<broken", headers={**SOAP11_HEADERS, **basic()})
    async with routed:
        routed_fault = await routed.post("/soap/orders", content=b"<broken", headers={**SOAP11_HEADERS, **basic()})
    assert (accepted.status_code, fault.status_code) == (200, 500)
    for answer in (accepted, fault, routed_fault):
        names = [name for name, _ in answer.headers.multi_items()]
        assert names[-len(SECURITY_HEADERS):] == [name.lower() for name in SECURITY_HEADERS]
        for name, value in SECURITY_HEADERS.items():
            assert answer.headers.get_list(name) == [value], name
    assert fault.headers.multi_items() == routed_fault.headers.multi_items()


async def test_a_header_an_answer_sets_itself_is_kept() -> None:
    from starlette.requests import Request
    from starlette.responses import Response

    from openroute.inbound.app import InboundDispatch

    async def endpoint(request: Request) -> Response:
        return Response(b"x", headers={"X-Frame-Options": "SAMEORIGIN"})

    class Endpoints:
        def post_endpoint(self, path: str) -> object:
            return endpoint, {}

    async def router(scope: object, receive: object, send: object) -> None:
        raise AssertionError("dispatched requests skip the router")

    headers = ((b"x-frame-options", b"DENY"), (b"referrer-policy", b"same-origin"))
    dispatch = InboundDispatch(router, Endpoints(), headers=headers)  # type: ignore[arg-type]
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=dispatch), base_url="http://testserver") as http:
        answer = await http.post("/soap/orders", content=b"<x/>")
    assert answer.headers.get_list("x-frame-options") == ["SAMEORIGIN"]
    assert answer.headers["referrer-policy"] == "same-origin"
