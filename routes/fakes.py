"""Local fakes of the external systems the reference MVNO route calls: billing and the MNO (SOAP 1.1).

They answer like the real systems would (``routes/wsdl/billing.wsdl`` and ``mno.wsdl``), count every call, and
can be told to fail:

* ``fail_next(n)``: the next ``n`` calls fail with HTTP 503 (a transport error: the route retries them);
* ``fault_next(n, code="Server")``: the next ``n`` calls get a SOAP Fault (a business error: the message ends
  FAILED with the fault as its business error);
* a customer id starting with ``blocked`` always gets a SOAP Fault ``Client``.

They honour idempotency keys the way a careful real system does: a request whose WS-Addressing ``MessageID``
(the key ``SoapService`` sends inside an ``ext_call``) was answered with success before gets that same answer
again and has no second effect; ``calls`` counts every request, ``effects`` only the ones that acted, and
``repeats`` the requests dropped as repeats.

Three ways to reach a fake: in-process with :meth:`FakeSoapSystem.client` (no socket; what the demo and the route
tests use), as an ASGI app (:meth:`FakeSoapSystem.app`, which ``openroute run`` mounts on its own app under
``/fakes/<name>``), or on a real socket with :meth:`FakeSoapSystem.served` (uvicorn on an ephemeral port). The app
answers ``POST /`` (SOAP), ``GET /calls`` (its counters as JSON) and ``POST /fail?count=N&kind=transport|fault``
(program failures from outside, e.g. with curl against a running ``openroute run``).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from xml.sax.saxutils import escape

import httpx
from lxml import etree
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

SOAP_11 = "http://schemas.xmlsoap.org/soap/envelope/"
WSA = "http://www.w3.org/2005/08/addressing"
BILLING_NS = "http://openroute.dev/billing"
MNO_NS = "http://openroute.dev/mno"
MAX_REQUEST_BYTES = 1 << 20
_PARSER = etree.XMLParser(resolve_entities=False, no_network=True, load_dtd=False, huge_tree=False)


def _envelope(body: str) -> str:
    return f'<s:Envelope xmlns:s="{SOAP_11}"><s:Body>{body}</s:Body></s:Envelope>'


def _fault(code: str, text: str) -> Response:
    body = f"<s:Fault><faultcode>s:{escape(code)}</faultcode><faultstring>{escape(text)}</faultstring></s:Fault>"
    return Response(_envelope(body), 500, media_type="text/xml")


def _count(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"a number of calls must be an integer >= 0, got {value!r}")
    return value


@dataclass
class FakeSoapSystem:
    """One fake SOAP system: ``operation`` (request with a ``customerId``) answered with ``answer_field``."""

    name: str
    namespace: str
    operation: str
    answer_field: str
    calls: Counter[str] = field(default_factory=Counter)
    failures_left: int = 0
    faults_left: int = 0
    fault_code: str = "Server"
    #: requests that acted (a new idempotency key, or none), per customer id
    effects: Counter[str] = field(default_factory=Counter)
    #: requests dropped as repeats of an idempotency key already answered with success
    repeats: int = 0
    _answers: dict[str, str] = field(default_factory=dict, repr=False)

    def fail_next(self, count: int) -> None:
        """Make the next ``count`` calls fail with HTTP 503 (a technical error for the caller).

        Raises ``ValueError`` unless ``count`` is an integer >= 0 (0 clears it)."""
        self.failures_left = _count(count)

    def fault_next(self, count: int, code: str = "Server") -> None:
        """Make the next ``count`` calls answer a SOAP Fault with ``code`` (a business error for the caller).

        Raises ``ValueError`` unless ``count`` is an integer >= 0 and ``code`` a non-empty name."""
        if not isinstance(code, str) or not code.strip() or ":" in code:
            raise ValueError(f"a fault code must be a non-empty local name, got {code!r}")
        self.faults_left = _count(count)
        self.fault_code = code

    def reset(self) -> None:
        """Forget the calls and the programmed failures."""
        self.calls.clear()
        self.effects.clear()
        self._answers.clear()
        self.failures_left = self.faults_left = self.repeats = 0

    @property
    def total_calls(self) -> int:
        """How many requests reached the system (including failed ones)."""
        return sum(self.calls.values())

    async def handle(self, request: Request) -> Response:
        """Answer one SOAP 1.1 request (``POST /``)."""
        body = await request.body()
        if len(body) > MAX_REQUEST_BYTES:
            return _fault("Client", "request too large")
        try:
            root = etree.fromstring(body, _PARSER)
        except etree.XMLSyntaxError:
            return _fault("Client", "malformed request")
        element = root.find(f"{{{SOAP_11}}}Body/{{{self.namespace}}}{self.operation}")
        if element is None:
            return _fault("Client", f"expected {self.operation}")
        customer = element.findtext(f"{{{self.namespace}}}customerId") or ""
        self.calls[customer] += 1
        key = (root.findtext(f"{{{SOAP_11}}}Header/{{{WSA}}}MessageID") or "").strip()
        if key and key in self._answers:
            self.repeats += 1
            return Response(self._answers[key], 200, media_type="text/xml")
        if self.failures_left > 0:
            self.failures_left -= 1
            return Response(f"{self.name} temporarily unavailable", 503, media_type="text/plain")
        if self.faults_left > 0:
            self.faults_left -= 1
            return _fault(self.fault_code, f"{self.name} refused the request")
        if customer.startswith("blocked"):
            return _fault("Client", f"customer {customer} is blocked in {self.name}")
        self.effects[customer] += 1
        number = self.calls[customer]
        answer = _envelope(f'<r:{self.operation}Response xmlns:r="{self.namespace}">'
                           f"<r:{self.answer_field}>{escape(self.name.upper())}-{escape(customer)}-{number}"
                           f"</r:{self.answer_field}></r:{self.operation}Response>")
        if key:
            self._answers[key] = answer
        return Response(answer, 200, media_type="text/xml")

    def status(self) -> dict[str, object]:
        """The counters: calls and effects per customer id, total, repeats dropped, programmed failures left."""
        return {"name": self.name, "calls": dict(self.calls), "total": self.total_calls,
                "effects": dict(self.effects), "repeats": self.repeats,
                "failures_left": self.failures_left, "faults_left": self.faults_left}

    async def _status(self, _request: Request) -> Response:
        return JSONResponse(self.status())

    async def _program(self, request: Request) -> Response:
        kind = request.query_params.get("kind", "transport")
        try:
            count = int(request.query_params.get("count", "1"))
            if kind == "transport":
                self.fail_next(count)
            elif kind == "fault":
                self.fault_next(count, request.query_params.get("code", "Server"))
            else:
                raise ValueError(f"kind must be 'transport' or 'fault', got {kind!r}")
        except ValueError as error:
            return JSONResponse({"error": str(error)}, 400)
        return JSONResponse(self.status())

    def app(self) -> Starlette:
        """The fake as an ASGI app: ``POST /`` (SOAP), ``GET /calls``, ``POST /fail?count=N&kind=...``."""
        return Starlette(routes=[
            Route("/", self.handle, methods=["POST"]),
            Route("/calls", self._status, methods=["GET"]),
            Route("/fail", self._program, methods=["POST"]),
        ])

    def client(self) -> httpx.AsyncClient:
        """An HTTP client that reaches this fake in-process (no socket): use it with address ``http://<name>.fake/``."""
        return httpx.AsyncClient(transport=httpx.ASGITransport(app=self.app()), timeout=10.0)

    @contextlib.asynccontextmanager
    async def served(self, host: str = "127.0.0.1", start_timeout: float = 10.0) -> AsyncIterator[str]:
        """Serve the fake with uvicorn on an ephemeral port of ``host`` for the duration of the block; yields its
        URL. Raises ``TimeoutError`` when the server is not up within ``start_timeout`` seconds."""
        import uvicorn

        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, 0))
        port = sock.getsockname()[1]
        server = uvicorn.Server(uvicorn.Config(self.app(), log_level="warning", lifespan="off"))
        server.capture_signals = contextlib.nullcontext  # type: ignore[method-assign]  # the host owns the signals
        task = asyncio.create_task(server.serve(sockets=[sock]), name=f"fake-{self.name}")
        try:
            async with asyncio.timeout(start_timeout):
                while not server.started:  # uvicorn exposes no event for this: a bounded poll
                    if task.done():
                        task.result()
                        raise RuntimeError(f"fake {self.name} stopped while starting")
                    await asyncio.sleep(0.01)
            yield f"http://{host}:{port}/"
        finally:
            server.should_exit = True
            try:
                await asyncio.wait_for(task, 10)
            finally:
                sock.close()


def fake_billing() -> FakeSoapSystem:
    """A fake billing system (``createAccount`` -> ``accountId``)."""
    return FakeSoapSystem("billing", BILLING_NS, "createAccount", "accountId")


def fake_mno() -> FakeSoapSystem:
    """A fake mobile network operator (``activateSim`` -> ``activationId``)."""
    return FakeSoapSystem("mno", MNO_NS, "activateSim", "activationId")


