"""The fake of a SOAP system called with :class:`~openroute.outbound.SoapService`, answering from its WSDL."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Self
from xml.sax.saxutils import escape

import httpx
import zeep
from lxml import etree
from zeep.wsdl.bindings.soap import Soap12Binding

from openroute.testing._fakes import FakeRemote, FakeRequest

__all__ = ["FakeSoapService"]

SOAP_11 = "http://schemas.xmlsoap.org/soap/envelope/"
SOAP_12 = "http://www.w3.org/2003/05/soap-envelope"
WSA = "http://www.w3.org/2005/08/addressing"
_KEY_PREFIXES = ("urn:uuid:", "urn:openroute:idempotency:")
_PARSER = etree.XMLParser(resolve_entities=False, no_network=True, load_dtd=False, huge_tree=False)

#: an operation's answer: its output values (rendered through the WSDL), the XML of the response element, or a
#: callable of the request giving one of these
SoapAnswer = Mapping[str, Any] | str | Callable[[FakeRequest], Any]


class FakeSoapService(FakeRemote):
    """A fake SOAP system described by ``wsdl`` (a file; ``service`` / ``port`` pick the port, default the first).

    :meth:`answer` gives an operation its answer: a mapping of the output message's values, rendered by zeep from
    the WSDL (so a value the WSDL does not allow fails the test), the XML of the response element, or a callable of
    the :class:`FakeRequest`. An operation without an answer gets a SOAP Fault ``Server`` saying so. The request's
    operation is found by its SOAPAction, else by its Body element; its WS-Addressing ``MessageID`` (what
    ``SoapService`` sends inside an ``ext_call``) is recorded as the request's ``idempotency_key``. Failures:
    :meth:`fault` (a SOAP Fault: a business error of the caller) and :meth:`fail` (HTTP status, timeout, no
    connection: technical errors); ``latency`` as for every fake::

        mno = FakeSoapService(WSDL / "mno.wsdl").answer("activateSim", {"activationId": "A-1"})
        kit = await route_test_kit(app, external_systems={"MNO": mno})
    """

    def __init__(self, wsdl: str | Path, *, service: str | None = None, port: str | None = None,
                 latency: float = 0.0) -> None:
        super().__init__(latency=latency)
        client = zeep.Client(str(wsdl))
        found = client.wsdl.services[service] if service else next(iter(client.wsdl.services.values()))
        bound = found.ports[port] if port else next(iter(found.ports.values()))
        self.name = found.name
        self._binding = bound.binding
        self._soap = SOAP_12 if isinstance(self._binding, Soap12Binding) else SOAP_11
        operations = self._binding._operations
        self._by_action = {op.soapaction: name for name, op in operations.items() if op.soapaction}
        self._by_element = {op.input.body.qname.text: name for name, op in operations.items()
                            if getattr(op.input, "body", None) is not None and op.input.body.qname is not None}
        self._answers: dict[str, SoapAnswer] = {}

    @property
    def operations(self) -> frozenset[str]:
        """The operations of the WSDL port."""
        return frozenset(self._binding._operations)

    def answer(self, operation: str, answer: SoapAnswer) -> Self:
        """Answer ``operation`` with ``answer`` (see the class). Returns the fake; ValueError for an operation the
        WSDL does not have."""
        self._known(operation)
        self._answers[operation] = answer
        return self

    def fault(self, code: str = "Client", text: str = "refused by the fake", *, times: int | None = 1,
              operation: str | None = None) -> Self:
        """Answer the next ``times`` requests (of ``operation``, or of any) with a SOAP Fault ``code`` (``Client``,
        ``Server``: a business error for ``SoapService`` unless its ``technical_fault_codes`` name it). Returns the
        fake."""
        if not isinstance(code, str) or not code.strip() or ":" in code:
            raise ValueError(f"a fault code must be a non-empty local name, got {code!r}")
        if operation is not None:
            self._known(operation)
        return self._program(times, lambda _request, _recorded: self._fault(code, text), operation)

    def _known(self, operation: str) -> None:
        if operation not in self._binding._operations:
            raise ValueError(f"{self.name} has no operation {operation!r}; it has {sorted(self.operations)}")

    def _record(self, request: httpx.Request, content: bytes) -> FakeRequest:
        recorded = super()._record(request, content)
        action = recorded.headers.get("soapaction", "").strip('"')
        if not action:  # SOAP 1.2 carries it in the Content-Type
            content_type = recorded.headers.get("content-type", "")
            action = content_type.partition('action="')[2].partition('"')[0]
        operation, key = self._by_action.get(action), None
        try:
            root = etree.fromstring(content, _PARSER)
        except etree.XMLSyntaxError:
            root = None
        if root is not None:
            key = (root.findtext(f"{{{self._soap}}}Header/{{{WSA}}}MessageID") or "").strip() or None
            for prefix in _KEY_PREFIXES:
                if key is not None and key.startswith(prefix):
                    key = key.removeprefix(prefix)
            body = root.find(f"{{{self._soap}}}Body")
            element = body[0] if body is not None and len(body) else None
            if operation is None and element is not None:
                tag = etree.QName(element)
                operation = self._by_element.get(tag.text) or (tag.localname if tag.localname in self.operations
                                                               else None)
        return FakeRequest(recorded.method, recorded.url, recorded.path, recorded.headers, content, key, operation)

    def _answer(self, request: httpx.Request, recorded: FakeRequest) -> httpx.Response:
        operation = recorded.operation
        if operation is None:
            return self._fault("Client", f"{self.name}: no operation of the WSDL matches the request")
        if operation not in self._answers:
            return self._fault("Server", f"{self.name}: the fake has no answer for {operation} "
                                         f"(fake.answer({operation!r}, {{...}}))")
        answer = self._answers[operation]
        if callable(answer):
            answer = answer(recorded)
        if isinstance(answer, str):
            envelope = f'<s:Envelope xmlns:s="{self._soap}"><s:Body>{answer}</s:Body></s:Envelope>'
        else:
            rendered = self._binding._operations[operation].output.serialize(**dict(answer))
            envelope = etree.tostring(rendered.content, encoding="unicode")
        return httpx.Response(200, text=envelope, headers={"Content-Type": self._media_type()})

    def _fault(self, code: str, text: str) -> httpx.Response:
        if self._soap == SOAP_12:
            value = "s:Sender" if code == "Client" else "s:Receiver" if code == "Server" else escape(code)
            fault = (f"<s:Fault><s:Code><s:Value>{value}</s:Value></s:Code>"
                     f'<s:Reason><s:Text xml:lang="en">{escape(text)}</s:Text></s:Reason></s:Fault>')
        else:
            fault = (f"<s:Fault><faultcode>s:{escape(code)}</faultcode>"
                     f"<faultstring>{escape(text)}</faultstring></s:Fault>")
        envelope = f'<s:Envelope xmlns:s="{self._soap}"><s:Body>{fault}</s:Body></s:Envelope>'
        return httpx.Response(500, text=envelope, headers={"Content-Type": self._media_type()})

    def _media_type(self) -> str:
        return "application/soap+xml; charset=utf-8" if self._soap == SOAP_12 else "text/xml; charset=utf-8"
