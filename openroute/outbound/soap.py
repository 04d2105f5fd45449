"""Calling external SOAP services from a route step with zeep (async, over httpx).

A SOAP Fault becomes a :class:`~openroute.definitions.errors.BusinessError` (the message ends FAILED with the fault kept
for the confirmation), a transport problem a :class:`~openroute.definitions.errors.TechnicalError` (retried per the
route's retry policy), a request zeep cannot build from the arguments a
:class:`~openroute.definitions.errors.ValidationError`.

Inside an ``ext_call`` / ``call_once`` every request carries the call's idempotency key as a WS-Addressing
``MessageID`` SOAP header (``<wsa:MessageID xmlns:wsa="http://www.w3.org/2005/08/addressing">urn:uuid:KEY
</wsa:MessageID>``), the same on every attempt of the call, so a service that honours it can drop repeats. While
tracing is on (:mod:`openroute.runtime.tracing`) the HTTP request carries the call's span as the W3C ``traceparent``
header. Inside an ``ext_call(..., system=NAME)`` whose system has a ``transport`` (a test kit's fake,
:mod:`openroute.testing`) the requests go to that transport instead of ``address``.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import zeep
import zeep.exceptions
from lxml import etree
from zeep.proxy import AsyncServiceProxy
from zeep.transports import AsyncTransport

from openroute.definitions.errors import BusinessError, ConfigurationError, TechnicalError, ValidationError
from openroute.engine.idempotency import current_idempotency_key
from openroute.outbound._connections import network_transport
from openroute.outbound._substitute import substitute_client
from openroute.outbound.calls import current_call
from openroute.runtime import tracing

#: the WS-Addressing 1.0 namespace of the ``MessageID`` header that carries the idempotency key
WSA_NAMESPACE = "http://www.w3.org/2005/08/addressing"

_MAX_TEXT = 1000


def _short(text: str) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= _MAX_TEXT else text[: _MAX_TEXT - 3] + "..."


class SoapFaultError(BusinessError):
    """The external service answered with a SOAP Fault; ``code`` is the fault code's local name."""

    def __init__(self, service: str, code: str, text: str, detail: str | None = None) -> None:
        super().__init__(code, text)
        self.service = service
        self.detail = detail


class SoapTransportError(TechnicalError):
    """The call did not get a usable answer: timeout, connection refused, HTTP error status, broken XML."""


def message_id_header(idempotency_key: str) -> etree._Element:
    """The ``wsa:MessageID`` header element carrying ``idempotency_key`` (``urn:uuid:<key>`` for a UUID key)."""
    try:
        value = f"urn:uuid:{uuid.UUID(idempotency_key)}"
    except ValueError:
        value = f"urn:openroute:idempotency:{idempotency_key}"
    header = etree.Element(f"{{{WSA_NAMESPACE}}}MessageID", nsmap={"wsa": WSA_NAMESPACE})
    header.text = value
    return header


def _positive(name: str, value: float | None) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise ConfigurationError(f"{name} must be a positive number of seconds, got {value!r}")


class _CallTransport(AsyncTransport):
    """zeep's async transport, posting to the fake of the system of the ``ext_call`` in progress when it has one."""

    def __init__(self, client: httpx.AsyncClient, wsdl_client: httpx.Client) -> None:
        super().__init__(client=client, wsdl_client=wsdl_client)  # type: ignore[no-untyped-call]  # zeep is untyped

    async def post(self, address: str, message: Any, headers: Any) -> httpx.Response:
        context = current_call()
        substitute = substitute_client(context.system if context is not None else None)
        if substitute is None:
            return await self.client.post(address, content=message, headers=headers)
        # the service's own timeouts and headers, so the fake meets the request the network would
        return await substitute.post(address, content=message, headers={**self.client.headers, **headers},
                                     timeout=self.client.timeout)


class SoapService:
    """One external SOAP service described by a WSDL (a file path or an http(s) URL).

    ``service`` / ``port`` pick the WSDL port (default: the first); ``address`` overrides the port's location
    (e.g. the test or production endpoint). ``timeout`` bounds each read / write / pool wait and
    ``connect_timeout`` (default ``timeout``) the connection set-up, in seconds. ``technical_fault_codes``
    lists fault codes (local names such as ``Server`` or ``Receiver``) to treat as technical errors instead of
    business errors. The WSDL is read in the constructor (blocking); use :meth:`load` on an event loop.
    """

    def __init__(
        self,
        wsdl: str | Path,
        *,
        address: str | None = None,
        service: str | None = None,
        port: str | None = None,
        timeout: float = 10.0,
        connect_timeout: float | None = None,
        technical_fault_codes: Iterable[str] = (),
        http_client: httpx.AsyncClient | None = None,
    ) -> None:
        _positive("timeout", timeout)
        _positive("connect_timeout", connect_timeout)
        if address is not None:
            parts = urlsplit(address)
            if parts.scheme not in {"http", "https"} or not parts.netloc:
                raise ConfigurationError(f"address must be an absolute http(s) URL, got {address!r}")
        location = str(wsdl)
        if not urlsplit(location).scheme.startswith("http") and not Path(location).is_file():
            raise ConfigurationError(f"WSDL {location!r} is neither an http(s) URL nor an existing file")
        limits = httpx.Timeout(timeout, connect=connect_timeout if connect_timeout is not None else timeout)
        self._owns_client = http_client is None
        # while tracing is on every request carries the current span as its traceparent header (a request hook)
        self._client = tracing.propagate_from(http_client or httpx.AsyncClient(timeout=limits,
                                                                               transport=network_transport()))
        # answers must not carry DTDs or entities either (no XXE from a compromised peer)
        settings = zeep.Settings(forbid_dtd=True, forbid_entities=True, forbid_external=True, xml_huge_tree=False)
        try:
            with httpx.Client(timeout=limits) as wsdl_client:
                transport = _CallTransport(self._client, wsdl_client)
                self._zeep = zeep.AsyncClient(location, transport=transport, settings=settings)
        except (httpx.HTTPError, zeep.exceptions.TransportError) as error:
            raise SoapTransportError(f"cannot load WSDL {location}: {_short(str(error))}",
                                     code="WSDL_UNAVAILABLE") from None
        except (zeep.exceptions.Error, etree.XMLSyntaxError, OSError) as error:
            raise ConfigurationError(f"invalid WSDL {location}: {_short(str(error))}") from None
        try:
            wsdl_service: Any = self._zeep._get_service(service)
            wsdl_port = self._zeep._get_port(wsdl_service, port)
        except ValueError as error:
            raise ConfigurationError(str(error)) from None
        self.name = wsdl_service.name
        self.address = address or wsdl_port.binding_options["address"]
        self._binding = wsdl_port.binding
        self._proxy = AsyncServiceProxy(self._zeep, wsdl_port.binding, address=self.address)
        self.technical_fault_codes = frozenset(technical_fault_codes)

    @classmethod
    async def load(cls, wsdl: str | Path, **options: Any) -> SoapService:
        """Like the constructor, with the WSDL read off the event loop."""
        return await asyncio.to_thread(lambda: cls(wsdl, **options))

    @property
    def operations(self) -> frozenset[str]:
        """The operation names of the bound port."""
        return frozenset(self._binding._operations)

    async def call(self, operation: str, *args: Any, _idempotency_key: str | None = None, **kwargs: Any) -> Any:
        """Call ``operation`` once and return zeep's answer object (or its single value).

        The request carries ``_idempotency_key`` (default: the key of the ``ext_call`` running now, if any) as a
        WS-Addressing ``MessageID`` header, added to any ``_soapheaders`` given.
        """
        if operation not in self._binding._operations:
            raise ConfigurationError(
                f"{self.name} has no operation {operation!r}; it has {sorted(self._binding._operations)}"
            )
        key = _idempotency_key if _idempotency_key is not None else current_idempotency_key()
        if key is not None:
            headers = kwargs.get("_soapheaders")
            if headers is not None and not isinstance(headers, list):
                raise ConfigurationError("_soapheaders must be a list of header elements when an idempotency key is "
                                         "sent")
            kwargs["_soapheaders"] = [*(headers or []), message_id_header(key)]
        try:
            return await self._proxy[operation](*args, **kwargs)
        except zeep.exceptions.Fault as fault:
            code = etree.QName(fault.code).localname if fault.code and "}" in str(fault.code) else str(fault.code or "")
            code = code.rpartition(":")[2] or "Fault"
            detail = None if fault.detail is None else _short(etree.tostring(fault.detail, encoding="unicode"))
            text = _short(fault.message or "SOAP Fault without a reason")
            if code in self.technical_fault_codes:
                reason = f"{self.name}.{operation}: SOAP Fault {code}: {text}"
                raise SoapTransportError(reason, code=f"SOAP_{code}") from None
            raise SoapFaultError(self.name, code, text, detail) from None
        except zeep.exceptions.TransportError as error:
            # zeep reports an unparsable 200 answer as a transport error too
            kind = f"HTTP_{error.status_code}" if error.status_code >= 400 else "INVALID_RESPONSE"
            reason = f"{self.name}.{operation}: HTTP {error.status_code}: {_short(error.message)}"
            raise SoapTransportError(reason, code=kind) from None
        except httpx.TimeoutException as error:
            raise SoapTransportError(
                f"{self.name}.{operation}: timeout calling {self.address} ({type(error).__name__})", code="TIMEOUT"
            ) from None
        except httpx.HTTPError as error:
            raise SoapTransportError(
                f"{self.name}.{operation}: cannot call {self.address}: {type(error).__name__}: {_short(str(error))}",
                code="CONNECTION_ERROR",
            ) from None
        except (zeep.exceptions.ValidationError, TypeError) as error:
            raise ValidationError(f"{self.name}.{operation}: invalid request: {_short(str(error))}") from None
        except (zeep.exceptions.Error, etree.XMLSyntaxError) as error:
            raise SoapTransportError(
                f"{self.name}.{operation}: invalid SOAP answer: {_short(str(error))}", code="INVALID_RESPONSE"
            ) from None

    async def aclose(self) -> None:
        """Close the HTTP client if this service created it."""
        if self._owns_client:
            await self._client.aclose()

    async def __aenter__(self) -> SoapService:
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.aclose()
