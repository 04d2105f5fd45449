"""The outbound HTTP client for declared external systems (on httpx), beside :class:`~openroute.outbound.SoapService`.

Inside an ``ext_call(..., system="BILLING")`` step it takes the base URL, timeouts and headers of
``[external_systems.BILLING]``, so a route names the system and nothing else::

    billing = ExternalHttpClient("BILLING")

    async def charge(exchange: Exchange) -> Any:
        return await billing.post_json("/charges", {"amount": 10}, idempotency_key=exchange.idempotency_key("charge"))

    route("crm", "order").json().ext_call("charge", charge, system="BILLING")

The call's breaker, timeout, record and DEBUG log line come from the ``ext_call`` around it
(:class:`~openroute.outbound.ExternalCalls`); the client adds the ``Idempotency-Key`` header and gives the request
and response it sent and got to the call record; while tracing is on (:mod:`openroute.runtime.tracing`) every request
carries the call's span as the W3C ``traceparent`` header. A timeout or connection problem, an HTTP 5xx, 408 or 429 is a
:class:`~openroute.definitions.errors.TechnicalError` (retried, counted by the breaker); any other 4xx a
:class:`~openroute.definitions.errors.BusinessError` with code ``HTTP_<status>`` (an answer: the breaker counts a
success).
"""

from __future__ import annotations

import json as jsonlib
import logging
import time
from collections.abc import Mapping
from typing import Any
from urllib.parse import urljoin

import httpx

from openroute.definitions.errors import BusinessError, ConfigurationError, TechnicalError
from openroute.outbound._connections import network_transport
from openroute.outbound._substitute import substitute_client
from openroute.outbound.calls import current_call
from openroute.outbound.systems import ExternalSystem
from openroute.runtime import tracing

__all__ = ["IDEMPOTENCY_KEY_HEADER", "ExternalHttpClient"]

log = logging.getLogger("openroute.outbound")

#: the header that carries a call's idempotency key to the remote system
IDEMPOTENCY_KEY_HEADER = "Idempotency-Key"

_TECHNICAL_STATUSES = frozenset({408, 429})
_MAX_TEXT = 1000
#: the URLs a client keeps, by path
_KEPT_PATHS = 64


class ExternalHttpClient:
    """HTTP calls to one external system: ``system`` is its declared name (settings read from the ``ext_call`` in
    progress) or an :class:`ExternalSystem` (settings given here, e.g. in tests or outside a route).

    ``transport`` replaces the network (e.g. ``httpx.ASGITransport`` of a fake); so does the ``transport`` of the
    system's settings (a test kit's fake of the system, :mod:`openroute.testing`). Close it with :meth:`aclose`.
    """

    def __init__(self, system: str | ExternalSystem, *, transport: httpx.AsyncBaseTransport | None = None) -> None:
        self._settings: ExternalSystem | None = None
        if isinstance(system, ExternalSystem):
            self.name, self._settings = system.name, system
        elif isinstance(system, str) and system:
            self.name = system
        else:
            raise ConfigurationError(f"ExternalHttpClient needs a system name or an ExternalSystem, got {system!r}")
        self._client = tracing.propagate_from(httpx.AsyncClient(transport=transport or network_transport()))
        # what a call derives from the settings alone, kept for the settings it was derived from: the timeouts and
        # the URL of each path (a route calls a few paths, each call built them anew)
        self._derived: tuple[ExternalSystem, httpx.Timeout, dict[str, str]] | None = None

    def settings(self) -> ExternalSystem:
        """The system's settings: given to the constructor, else those of the ``ext_call`` in progress.

        Raises ConfigurationError when neither names this system or it has no ``base_url``."""
        settings = self._settings
        if settings is None:
            context = current_call()
            if context is None or context.system.name != self.name:
                raise ConfigurationError(
                    f"ExternalHttpClient({self.name!r}) is used outside an ext_call(..., system={self.name!r}) step, "
                    "or by an engine without external systems (Engine(external_calls=...)): call it inside that step "
                    "of an engine that has them (openroute run, RouteTestKit), or give it an ExternalSystem"
                )
            settings = context.system
        if settings.base_url is None:
            raise ConfigurationError(f"external system {self.name} has no base_url ([external_systems.{self.name}]; "
                                     f"in a RouteTestKit: external_systems={{{self.name!r}: FakeHttpService()}})")
        return settings

    async def request(
        self,
        method: str,
        path: str = "",
        *,
        json: Any = None,
        content: str | bytes | None = None,
        params: Mapping[str, str] | None = None,
        headers: Mapping[str, str] | None = None,
        idempotency_key: str | None = None,
    ) -> httpx.Response:
        """Send one request to ``base_url`` + ``path``; returns the response when its status is below 400.

        ``idempotency_key`` (e.g. ``exchange.idempotency_key("charge")``) is sent as the ``Idempotency-Key`` header.
        Raises TechnicalError (code TIMEOUT, CONNECTION_ERROR or HTTP_<status> for 5xx/408/429) or BusinessError
        (code HTTP_<status> for another 4xx)."""
        settings = self.settings()
        url, timeout = self._target(settings, path)
        sent = dict(settings.headers)
        sent.update(headers or {})
        if idempotency_key is not None:
            if not isinstance(idempotency_key, str) or not idempotency_key:
                raise ValueError(f"idempotency_key must be a non-empty string, got {idempotency_key!r}")
            sent[IDEMPOTENCY_KEY_HEADER] = idempotency_key
        body: bytes | None = None
        if json is not None:
            body = jsonlib.dumps(json, ensure_ascii=False).encode()
            sent.setdefault("Content-Type", "application/json")
        elif content is not None:
            body = content.encode() if isinstance(content, str) else content
        context = current_call()
        if context is not None:
            context.request = _record_text(settings, f"{method.upper()} {url}", body)
        started = time.perf_counter()
        where = f"{self.name} {method.upper()} {url}"
        try:
            client = substitute_client(settings) or self._client
            response = await client.request(method, url, content=body, params=params, headers=sent, timeout=timeout)
        except httpx.TimeoutException as error:
            raise TechnicalError(f"{where}: timeout ({type(error).__name__})", code="TIMEOUT") from None
        except httpx.HTTPError as error:
            raise TechnicalError(f"{where}: {type(error).__name__}: {_short(str(error))}",
                                 code="CONNECTION_ERROR") from None
        if context is not None:
            context.response = _record_text(settings, f"HTTP {response.status_code}", response.content)
        else:  # inside a guarded call the guard logs the one line
            log.debug("call %s: HTTP %s in %d ms", where, response.status_code, (time.perf_counter() - started) * 1000)
        status = response.status_code
        if status >= 500 or status in _TECHNICAL_STATUSES:
            raise TechnicalError(f"{where}: HTTP {status}: {_short(response.text)}", code=f"HTTP_{status}")
        if status >= 400:
            raise BusinessError(f"HTTP_{status}", f"{where}: {_short(response.text)}")
        return response

    def _target(self, settings: ExternalSystem, path: str) -> tuple[str, httpx.Timeout]:
        """The URL of ``path`` and the timeouts of ``settings``, derived once per settings (and path)."""
        derived = self._derived
        if derived is None or derived[0] is not settings:
            timeout = httpx.Timeout(settings.timeout, connect=settings.connect_timeout or settings.timeout)
            derived = self._derived = (settings, timeout, {})
        urls = derived[2]
        url = urls.get(path)
        if url is None:
            url = urljoin(settings.base_url or "", path.lstrip("/")) if path else settings.base_url or ""
            if len(urls) < _KEPT_PATHS:  # paths built per call (ids in them) are joined each time, not kept
                urls[path] = url
        return url, derived[1]

    async def get_json(self, path: str = "", *, params: Mapping[str, str] | None = None,
                       headers: Mapping[str, str] | None = None) -> Any:
        """GET ``path`` and return its JSON answer (None for an empty body); errors as :meth:`request`."""
        return _json(await self.request("GET", path, params=params, headers=headers), self.name)

    async def post_json(self, path: str, payload: Any, *, idempotency_key: str | None = None,
                        headers: Mapping[str, str] | None = None) -> Any:
        """POST ``payload`` as JSON to ``path`` and return the JSON answer (None for an empty body); errors as
        :meth:`request`, plus TechnicalError INVALID_RESPONSE for an answer that is not JSON."""
        response = await self.request("POST", path, json=payload, idempotency_key=idempotency_key, headers=headers)
        return _json(response, self.name)

    async def aclose(self) -> None:
        """Close the connections."""
        await self._client.aclose()

    async def __aenter__(self) -> ExternalHttpClient:
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.aclose()


def _json(response: httpx.Response, name: str) -> Any:
    if not response.content:
        return None
    try:
        return response.json()
    except ValueError:
        raise TechnicalError(f"{name}: the answer is not JSON: {_short(response.text)}",
                             code="INVALID_RESPONSE") from None


def _record_text(settings: ExternalSystem, first_line: str, body: bytes | None) -> str:
    text = "" if not body else settings.records.clean(body.decode("utf-8", "replace")) or ""
    return f"{first_line}\n{text}" if text else first_line


def _short(text: str) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= _MAX_TEXT else text[: _MAX_TEXT - 3] + "..."
