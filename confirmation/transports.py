"""Confirmation to external systems over SOAP (zeep, our WSDL) and HTTP JSON (httpx)."""

from __future__ import annotations

from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import zeep
import zeep.exceptions
from openroute.confirmation.callbacks import ExternalSystemConfirmation
from openroute.confirmation.model import ConfirmationRequest, ConfirmationSendError, InvalidConfirmationError
from openroute.confirmation.ports import PrepareClient
from zeep.proxy import AsyncServiceProxy
from zeep.transports import AsyncTransport

#: The WSDL shipped with the package; source systems implement it to receive confirmations.
DEFAULT_WSDL: Path = Path(str(resources.files("openroute.confirmation") / "wsdl" / "confirmation.wsdl"))
NAMESPACE = "urn:openroute:confirmation:v1"
_BINDING = f"{{{NAMESPACE}}}ConfirmationBinding"
_MAX_REASON = 500


def _check_url(url: str, what: str) -> str:
    if not isinstance(url, str):
        raise InvalidConfirmationError(f"{what} must be a string URL, got {url!r}")
    parts = urlsplit(url)
    if parts.scheme not in {"http", "https"} or not parts.netloc:
        raise InvalidConfirmationError(f"{what} must be an absolute http(s) URL, got {url!r}")
    return url


def _timeout(timeout: float, connect_timeout: float | None) -> httpx.Timeout:
    for name, value in (("timeout", timeout), ("connect_timeout", connect_timeout)):
        if value is None and name == "connect_timeout":
            continue
        if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
            raise InvalidConfirmationError(f"{name} must be a positive number of seconds, got {value!r}")
    return httpx.Timeout(timeout, connect=connect_timeout if connect_timeout is not None else timeout)


def _short(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= _MAX_REASON else text[: _MAX_REASON - 3] + "..."


def _unreachable(endpoint: str, error: httpx.HTTPError) -> ConfirmationSendError:
    """The send error of a call to ``endpoint`` that got no HTTP answer (a timeout, a refused connection, ...)."""
    if isinstance(error, httpx.TimeoutException):
        return ConfirmationSendError(_short(f"timeout calling {endpoint}: {type(error).__name__}"))
    return ConfirmationSendError(_short(f"cannot call {endpoint}: {type(error).__name__}: {error}"))


class _HttpConfirmation(ExternalSystemConfirmation):
    """A confirmation over HTTP to ``endpoint`` with an ``httpx.AsyncClient``: its own (closed by :meth:`aclose`) or
    one shared; ``what`` names the endpoint's argument in errors."""

    def __init__(
        self, source_system: str, endpoint: str, what: str, timeout: float, connect_timeout: float | None,
        http_client: httpx.AsyncClient | None, prepare_client: PrepareClient | None,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        super().__init__(source_system)
        self.endpoint = _check_url(endpoint, what)
        self._owns_client = http_client is None
        client = http_client or httpx.AsyncClient(timeout=_timeout(timeout, connect_timeout), transport=transport)
        # e.g. tracing's request hook: every request carries the confirmation's span as its traceparent header
        self._client = client if prepare_client is None else prepare_client(client)

    async def aclose(self) -> None:
        """Close the HTTP client if this confirmation created it."""
        if self._owns_client:
            await self._client.aclose()


class SoapConfirmation(_HttpConfirmation):
    """Confirms by calling the ``confirm`` operation of ``confirmation.wsdl`` at ``address`` with zeep.

    The confirmation id travels in the body: ``confirmationId``, the last (optional) element of ``confirmRequest``.

    A SOAP Fault, an HTTP error status, a timeout, a connection error, an unparsable answer or ``accepted=false``
    raise :class:`~confirmation.ConfirmationSendError` with the reason. ``timeout`` bounds each read/write/pool wait
    and ``connect_timeout`` (default: ``timeout``) the connection set-up, in seconds. Pass ``http_client`` to share
    an ``httpx.AsyncClient`` (its own timeouts then apply and :meth:`aclose` leaves it open); ``prepare_client``
    is applied to the client first (the composition root gives ``tracing.propagate_from``). ``transport`` is the
    transport of the client it makes (not with ``http_client``; the composition root gives openroute's network
    transport, the one of ``ExternalHttpClient``: its pool's look at idle connections costs less).
    """

    def __init__(
        self,
        source_system: str,
        address: str,
        *,
        timeout: float = 10.0,
        connect_timeout: float | None = None,
        wsdl: str | Path = DEFAULT_WSDL,
        http_client: httpx.AsyncClient | None = None,
        prepare_client: PrepareClient | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        super().__init__(source_system, address, "address", timeout, connect_timeout, http_client, prepare_client,
                         transport)
        self.address = self.endpoint
        # the WSDL is read once, here, synchronously; the throw-away sync client only matters for a remote WSDL
        with httpx.Client(timeout=_timeout(timeout, connect_timeout)) as wsdl_client:
            zeep_transport = AsyncTransport(client=self._client, wsdl_client=wsdl_client)
            # zeep's default settings already forbid DTDs and entities in answers (no XXE)
            self._zeep = zeep.AsyncClient(str(wsdl), transport=zeep_transport)
        # zeep's create_service() returns a synchronous proxy even on an AsyncClient, so bind the async one here
        self._service = AsyncServiceProxy(self._zeep, self._zeep.wsdl.bindings[_BINDING], address=self.address)

    async def confirm(self, request: ConfirmationRequest) -> None:
        """Call ``confirm`` once; raise :class:`~confirmation.ConfirmationSendError` if it did not succeed."""
        errors = (
            {"businessError": [{"code": e.code, "text": e.text} for e in request.business_errors]}
            if request.business_errors
            else None
        )
        try:
            # the JSON body's fields are the SOAP body's elements; zeep takes the time as a datetime
            answer = await self._service.confirm(
                **{**request.to_json(), "finishedAt": request.finished_at, "businessErrors": errors}
            )
        except zeep.exceptions.Fault as fault:
            raise ConfirmationSendError(_short(f"SOAP Fault {fault.code or ''}: {fault.message}")) from fault
        except zeep.exceptions.TransportError as error:
            raise ConfirmationSendError(
                _short(f"HTTP {error.status_code}: {error.message}"), status_code=error.status_code
            ) from error
        except httpx.HTTPError as error:
            raise _unreachable(self.address, error) from error
        except zeep.exceptions.Error as error:
            raise ConfirmationSendError(_short(f"invalid SOAP answer from {self.address}: {error}")) from error
        if answer is None or not answer.accepted:
            reason = getattr(answer, "reason", None) or "no reason given"
            raise ConfirmationSendError(_short(f"confirmation refused by {self.source_system}: {reason}"))


class HttpJsonConfirmation(_HttpConfirmation):
    """Confirms with an HTTP POST of :meth:`ConfirmationRequest.to_json` to ``url``; any 2xx status is success.

    Another status, a timeout or a connection error raise :class:`~confirmation.ConfirmationSendError`.
    ``headers`` are sent with every request (e.g. an API key); the request's confirmation id goes in the body
    (``confirmationId``) and in the ``Idempotency-Key`` and ``X-Confirmation-Id`` headers. ``http_client``,
    ``prepare_client`` and ``transport`` as for :class:`SoapConfirmation`.
    """

    def __init__(
        self,
        source_system: str,
        url: str,
        *,
        timeout: float = 10.0,
        connect_timeout: float | None = None,
        headers: Mapping[str, str] | None = None,
        http_client: httpx.AsyncClient | None = None,
        prepare_client: PrepareClient | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        super().__init__(source_system, url, "url", timeout, connect_timeout, http_client, prepare_client, transport)
        self.url = self.endpoint
        self._headers = dict(headers or {})

    async def confirm(self, request: ConfirmationRequest) -> None:
        """POST the confirmation once; raise :class:`~confirmation.ConfirmationSendError` unless the answer is 2xx."""
        try:
            response = await self._client.post(self.url, json=request.to_json(),
                                               headers={**self._headers, **request.idempotency_headers()})
        except httpx.HTTPError as error:
            raise _unreachable(self.url, error) from error
        if not response.is_success:
            raise ConfirmationSendError(
                _short(f"HTTP {response.status_code}: {response.text}"), status_code=response.status_code
            )
