"""Local fakes of the external systems the reference MVNO route calls: billing and the MNO (SOAP 1.1).

They answer like the real systems would, count every call, and can be told to fail: ``fail_next(n)`` makes the
next ``n`` calls fail with HTTP 503 (a transport error: the route retries), a customer id starting with
``blocked`` gets a SOAP Fault ``Client`` (a business error: the message ends FAILED). ``openroute run`` and
``openroute demo`` use them in-process when no real endpoints are configured; tests do the same.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import httpx
from lxml import etree
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

SOAP_11 = "http://schemas.xmlsoap.org/soap/envelope/"
BILLING_NS = "http://openroute.dev/billing"
MNO_NS = "http://openroute.dev/mno"
_PARSER = etree.XMLParser(resolve_entities=False, no_network=True, load_dtd=False, huge_tree=False)


def _envelope(body: str) -> str:
    return f'<s:Envelope xmlns:s="{SOAP_11}"><s:Body>{body}</s:Body></s:Envelope>'


def _fault(code: str, text: str) -> Response:
    body = f"<s:Fault><faultcode>s:{code}</faultcode><faultstring>{text}</faultstring></s:Fault>"
    return Response(_envelope(body), 500, media_type="text/xml")


@dataclass
class FakeSoapSystem:
    """One fake SOAP system: ``operation`` with a request of ``fields``, answered with ``answer_field``."""

    name: str
    namespace: str
    operation: str
    answer_field: str
    calls: Counter[str] = field(default_factory=Counter)
    failures_left: int = 0

    def fail_next(self, count: int) -> None:
        """Make the next ``count`` calls fail with HTTP 503 (a technical error for the caller)."""
        self.failures_left = count

    @property
    def total_calls(self) -> int:
        """How many requests reached the system (including failed ones)."""
        return sum(self.calls.values())

    async def handle(self, request: Request) -> Response:
        body = await request.body()
        try:
            root = etree.fromstring(body, _PARSER)
        except etree.XMLSyntaxError:
            return _fault("Client", "malformed request")
        element = root.find(f"{{{SOAP_11}}}Body/{{{self.namespace}}}{self.operation}")
        if element is None:
            return _fault("Client", f"expected {self.operation}")
        customer = element.findtext(f"{{{self.namespace}}}customerId") or ""
        self.calls[customer] += 1
        if self.failures_left > 0:
            self.failures_left -= 1
            return Response(f"{self.name} temporarily unavailable", 503, media_type="text/plain")
        if customer.startswith("blocked"):
            return _fault("Client", f"customer {customer} is blocked in {self.name}")
        number = self.calls[customer]
        answer = (f'<r:{self.operation}Response xmlns:r="{self.namespace}">'
                  f"<r:{self.answer_field}>{self.name.upper()}-{customer}-{number}</r:{self.answer_field}>"
                  f"</r:{self.operation}Response>")
        return Response(_envelope(answer), 200, media_type="text/xml")

    def app(self) -> Starlette:
        """The fake as an ASGI app answering ``POST /<name>``."""
        return Starlette(routes=[Route(f"/{self.name}", self.handle, methods=["POST"])])

    def client(self) -> httpx.AsyncClient:
        """An HTTP client that reaches this fake in-process (no socket)."""
        return httpx.AsyncClient(transport=httpx.ASGITransport(app=self.app()), timeout=10.0)


def fake_billing() -> FakeSoapSystem:
    """A fake billing system (``createAccount`` -> ``accountId``)."""
    return FakeSoapSystem("billing", BILLING_NS, "createAccount", "accountId")


def fake_mno() -> FakeSoapSystem:
    """A fake mobile network operator (``activateSim`` -> ``activationId``)."""
    return FakeSoapSystem("mno", MNO_NS, "activateSim", "activationId")
