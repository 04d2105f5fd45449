"""Fixtures of the inbound tests: a real engine on each database, the app, an HTTP client, and helpers."""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
from openroute.persistence import MessageStore, message_table
from starlette.applications import Starlette

from openroute.definitions.errors import ValidationError
from openroute.definitions.route import Route, RouteRegistry
from openroute.engine import Engine, EngineSettings
from openroute.inbound import (
    ApiKey,
    BasicCredentials,
    InboundBinding,
    InboundSettings,
    LoginLimiter,
    ParsedPayload,
    QName,
    SourceSystemAuth,
)
from openroute.server import create_app

ORD = "urn:example:orders:v1"
SOAP11 = "http://schemas.xmlsoap.org/soap/envelope/"
SOAP12 = "http://www.w3.org/2003/05/soap-envelope"
TRACE = "urn:openroute:trace:v1"
API_KEY = "erp-key-0123456789abcdef"


def _no_negative_quantity(payload: ParsedPayload) -> None:
    if payload.json is not None:
        quantity = payload.json.get("quantity", 0)
    else:
        found = payload.xml.findtext(f"{{{ORD}}}quantity") if payload.xml is not None else None
        quantity = int(found) if found else 0
    if quantity < 0:
        raise ValidationError(f"quantity must not be negative, got {quantity}")


BINDINGS = [
    InboundBinding(
        "orders", "create", "xml",
        request_element=QName(ORD, "createOrder"), soap_action="urn:example:orders:create",
        namespaces={"o": ORD}, required=["o:orderId", "o:customer/o:id"],
        validators=[_no_negative_quantity],
        object_id="o:orderId", entity_type="string('order')", funnel_value="o:customer/o:id",
    ),
    InboundBinding(
        "orders", "cancel", "xml", request_element=QName(ORD, "cancelOrder"),
        namespaces={"o": ORD}, required=["o:orderId"], object_id="o:orderId",
    ),
    InboundBinding(
        "orders", "create", "json", required=["$.orderId", "$.customer.id"], validators=[_no_negative_quantity],
        object_id="$.orderId", entity_type=lambda p: "order", funnel_value="$.customer.id",
    ),
]


def routes() -> RouteRegistry:
    return RouteRegistry([Route("orders", "create", [lambda exchange: None]),
                          Route("orders", "cancel", [lambda exchange: None])])


@pytest.fixture
async def engine(store: MessageStore) -> AsyncIterator[Engine]:
    """An engine that is not started: accepted messages stay NEW, so tests see exactly what was stored."""
    node = Engine(store, routes(), EngineSettings(repoll_interval=None, node_id="inbound-test"))
    yield node
    await node.stop()


# one authenticator serves every test of the session: its limiter must not add up their refusals (the limit itself
# is tested in test_login_limit.py)
AUTH = SourceSystemAuth({"CRM": BasicCredentials("crm", "crm-secret"), "ERP": ApiKey(API_KEY)},
                        limiter=LoginLimiter(max_failures=10_000, max_failures_per_address=10_000))
SETTINGS = InboundSettings(max_body_bytes=64 * 1024, max_depth=32)


@pytest.fixture
def app(engine: Engine) -> Starlette:
    return create_app(engine, BINDINGS, inbound_auth=AUTH, settings=SETTINGS, manage_engine=False)


@pytest.fixture
async def client(app: Starlette) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://testserver") as http:
        yield http


def basic(user: str = "crm", password: str = "crm-secret") -> dict[str, str]:
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    return {"Authorization": f"Basic {token}"}


def stored(store: MessageStore) -> list[dict[str, Any]]:
    """Every row of the messages table."""
    with store.engine.connect() as connection:
        return [dict(r._mapping) for r in connection.execute(sa.select(message_table).order_by(message_table.c.id))]


def envelope(body: str, version: str = "1.1", trace: dict[str, str] | None = None) -> bytes:
    ns = SOAP11 if version == "1.1" else SOAP12
    header = ""
    if trace:
        fields = "".join(f"<tr:{k}>{v}</tr:{k}>" for k, v in trace.items())
        header = f'<env:Header><tr:traceHeader xmlns:tr="{TRACE}">{fields}</tr:traceHeader></env:Header>'
    return (f'<?xml version="1.0" encoding="UTF-8"?><env:Envelope xmlns:env="{ns}">{header}'
            f"<env:Body>{body}</env:Body></env:Envelope>").encode()


def create_order(order_id: str = "O-1", customer: str = "C-7", quantity: int = 2) -> str:
    return (f'<o:createOrder xmlns:o="{ORD}"><o:orderId>{order_id}</o:orderId>'
            f"<o:customer><o:id>{customer}</o:id></o:customer><o:quantity>{quantity}</o:quantity></o:createOrder>")


SOAP11_HEADERS = {"Content-Type": "text/xml; charset=utf-8", "SOAPAction": '"urn:example:orders:create"'}
SOAP12_HEADERS = {"Content-Type": 'application/soap+xml; charset=utf-8; action="urn:example:orders:create"'}


@pytest.fixture
def serve() -> Iterator[Any]:
    """Starts ``openroute run`` processes (:class:`tests.inbound.test_cli_run.Server`); kills those left running."""
    from tests.inbound.test_cli_run import ROOT, Server, _environment

    started: list[Server] = []

    class Started(Server):
        def __init__(self, args: list[str], cwd: Path = ROOT, env: dict[str, str] | None = None) -> None:
            super().__init__(args, cwd, env if env is not None else _environment())
            started.append(self)

    yield Started
    for server in started:
        if server.process.poll() is None:
            server.process.kill()
            server.process.wait(30)
