"""The outbound SOAP helper against a fake billing service served by uvicorn in a background thread."""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import uvicorn
from lxml import etree
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from openroute.definitions.errors import BusinessError, ConfigurationError, TechnicalError, ValidationError
from openroute.outbound import SoapFaultError, SoapService, SoapTransportError

WSDL = Path(__file__).parent / "billing.wsdl"
SOAP = "http://schemas.xmlsoap.org/soap/envelope/"
NS = "urn:example:billing:v1"
PARSER = etree.XMLParser(resolve_entities=False, no_network=True, load_dtd=False)


def _fault(code: str, text: str) -> str:
    return (f'<s:Envelope xmlns:s="{SOAP}"><s:Body><s:Fault><faultcode>s:{code}</faultcode>'
            f"<faultstring>{text}</faultstring><detail><b:reason xmlns:b='{NS}'>{text}</b:reason></detail>"
            "</s:Fault></s:Body></s:Envelope>")


class Billing:
    """The fake service: answers by customer id (ok / fault / server-fault / down / slow / garbage)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, str]] = []
        self.release = threading.Event()

    async def handle(self, request: Request) -> Response:
        root = etree.fromstring(await request.body(), PARSER)
        charge = root.find(f"{{{SOAP}}}Body/{{{NS}}}charge")
        customer = charge.findtext(f"{{{NS}}}customerId")
        amount = charge.findtext(f"{{{NS}}}amount")
        self.calls.append((request.headers.get("soapaction", ""), customer, amount))
        if customer == "fault":
            return Response(_fault("Client", "customer is blocked"), 500, media_type="text/xml")
        if customer == "server-fault":
            return Response(_fault("Server", "ledger locked"), 500, media_type="text/xml")
        if customer == "down":
            return Response("service unavailable", 503, media_type="text/plain")
        if customer == "garbage":
            return Response("<not-xml", 200, media_type="text/xml")
        if customer == "slow":
            await asyncio.to_thread(self.release.wait, 10)  # hang until the test is over (past the timeout)
        answer = (f'<s:Envelope xmlns:s="{SOAP}"><s:Body><b:chargeResponse xmlns:b="{NS}">'
                  f"<b:invoiceId>INV-{customer}-{amount}</b:invoiceId></b:chargeResponse></s:Body></s:Envelope>")
        return Response(answer, 200, media_type="text/xml")


@pytest.fixture(scope="module")
def billing() -> Iterator[tuple[Billing, str]]:
    fake = Billing()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    app = Starlette(routes=[Route("/billing", fake.handle, methods=["POST"]),
                            Route("/billing.wsdl", lambda r: Response(WSDL.read_bytes(), media_type="text/xml"))])
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    ready = threading.Event()
    while thread.is_alive() and not server.started and not ready.wait(0.01):
        pass  # uvicorn has no "started" event: poll its flag (bounded by the thread dying or the next assert)
    assert server.started
    yield fake, f"http://127.0.0.1:{port}"
    fake.release.set()
    server.should_exit = True
    thread.join(20)


async def test_call_returns_the_answer(billing: tuple[Billing, str]) -> None:
    fake, url = billing
    async with SoapService(WSDL, address=f"{url}/billing", timeout=5) as service:
        assert service.operations == {"charge"} and service.name == "Billing"
        answer = await service.call("charge", customerId="C-1", amount="12.50")
    assert answer == "INV-C-1-12.50"
    assert ("urn:example:billing:charge", "C-1", "12.50") in [(a.strip('"'), c, m) for a, c, m in fake.calls]


async def test_wsdl_from_url(billing: tuple[Billing, str]) -> None:
    _fake, url = billing
    service = await SoapService.load(f"{url}/billing.wsdl", address=f"{url}/billing")
    try:
        assert await service.call("charge", customerId="C-2", amount=1) == "INV-C-2-1"
    finally:
        await service.aclose()


async def test_fault_is_a_business_error(billing: tuple[Billing, str]) -> None:
    _fake, url = billing
    async with SoapService(WSDL, address=f"{url}/billing") as service:
        with pytest.raises(SoapFaultError) as caught:
            await service.call("charge", customerId="fault", amount=1)
    assert isinstance(caught.value, BusinessError)
    assert caught.value.code == "Client" and caught.value.text == "customer is blocked"
    assert "customer is blocked" in (caught.value.detail or "")


async def test_fault_code_can_be_declared_technical(billing: tuple[Billing, str]) -> None:
    _fake, url = billing
    async with SoapService(WSDL, address=f"{url}/billing", technical_fault_codes={"Server"}) as service:
        with pytest.raises(SoapTransportError) as caught:
            await service.call("charge", customerId="server-fault", amount=1)
        assert caught.value.code == "SOAP_Server" and "ledger locked" in caught.value.text
        with pytest.raises(SoapFaultError):
            await service.call("charge", customerId="fault", amount=1)


@pytest.mark.parametrize(("customer", "code"), [("down", "HTTP_503"), ("garbage", "INVALID_RESPONSE"),
                                                ("slow", "TIMEOUT")])
async def test_transport_problems_are_technical_errors(billing: tuple[Billing, str], customer: str, code: str) -> None:
    _fake, url = billing
    async with SoapService(WSDL, address=f"{url}/billing", timeout=0.5) as service:
        with pytest.raises(SoapTransportError) as caught:
            await service.call("charge", customerId=customer, amount=1)
    assert isinstance(caught.value, TechnicalError) and caught.value.code == code


async def test_connection_refused_is_a_technical_error() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed again: nobody listens there
    async with SoapService(WSDL, address=f"http://127.0.0.1:{port}/billing", timeout=2) as service:
        with pytest.raises(SoapTransportError) as caught:
            await service.call("charge", customerId="C", amount=1)
    assert caught.value.code == "CONNECTION_ERROR"


async def test_bad_arguments_and_configuration() -> None:
    async with SoapService(WSDL, address="http://127.0.0.1:9/billing") as service:
        with pytest.raises(ValidationError, match="invalid request"):
            await service.call("charge", customerId="C", amount=1, colour="red")
        with pytest.raises(ConfigurationError, match="no operation 'refund'"):
            await service.call("refund")
    with pytest.raises(ConfigurationError, match="neither an http"):
        SoapService("/nowhere/billing.wsdl")
    with pytest.raises(ConfigurationError, match="timeout"):
        SoapService(WSDL, timeout=0)
    with pytest.raises(ConfigurationError, match="address"):
        SoapService(WSDL, address="ftp://billing")
    with pytest.raises(ConfigurationError, match="invalid WSDL"):
        SoapService(Path(__file__))
    with pytest.raises(ConfigurationError):
        SoapService(WSDL, service="Nope")
