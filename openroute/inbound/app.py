"""The inbound HTTP endpoints: SOAP 1.1 / 1.2 (+ WSDL) and JSON, in front of :meth:`Engine.accept`.

Every request goes: authenticate (headers only) -> content type and size checks -> bounded streaming read ->
secure parse -> binding checks and extraction -> ``engine.accept`` (commits) -> acknowledgment. Any error is
answered (SOAP Fault / HTTP 4xx) before anything is stored.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

import anyio.to_thread
from lxml import etree
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from openroute.auth.credentials import SourceSystemAuth, require_system
from openroute.auth.errors import (
    CLIENT_DISCONNECTED,
    AuthenticationError,
    UnknownOperationError,
    UnsupportedMediaTypeError,
    status_and_code,
)
from openroute.definitions.binding import InboundBinding, ParsedPayload
from openroute.definitions.body import InvalidBodyError
from openroute.definitions.errors import ConfigurationError, StoreUnavailableError, ThrottledError, ValidationError
from openroute.definitions.message import InboundMessage
from openroute.definitions.route import Route as RouteDefinition
from openroute.engine import AcceptResult, Engine
from openroute.inbound.openapi import InboundContract
from openroute.inbound.parsing import (
    check_json_type,
    checked_message,
    parse_json,
    parse_timestamp,
    parse_xml,
    read_body,
)
from openroute.inbound.soap import (
    SOAP11,
    SOAP12,
    SoapVersion,
    accept_envelope,
    fault_envelope,
    fault_status,
    read_envelope,
    soap_version_of,
    wsdl_document,
)
from openroute.persistence import message_table
from openroute.runtime import tracing
from openroute.runtime.logs import repeated_errors

if TYPE_CHECKING:
    from openroute.inbound.throttling import Throttling

log = logging.getLogger("openroute.inbound")

#: HTTP trace headers (JSON endpoint; the SOAP endpoint falls back to them when its trace header lacks a field)
CORRELATION_HEADER = "x-correlation-id"
SOURCE_SYSTEM_HEADER = "x-source-system"
PROCESS_HEADER = "x-process-id"
TIMESTAMP_HEADER = "x-message-timestamp"

#: called once per inbound request: (endpoint "soap" | "json", outcome code, HTTP status, seconds)
RequestObserver = Callable[[str, str, int, float], None]


@dataclass(frozen=True)
class InboundSettings:
    """Limits of the inbound endpoints."""

    #: largest request body read (the SOAP envelope included); larger ones are cut off while streaming
    max_body_bytes: int = 1024 * 1024
    #: deepest nesting of XML elements / JSON containers accepted
    max_depth: int = 64
    #: URL prefixes
    soap_prefix: str = "/soap"
    json_prefix: str = "/api"

    def __post_init__(self) -> None:
        if not isinstance(self.max_body_bytes, int) or self.max_body_bytes < 1:
            raise ConfigurationError(f"max_body_bytes must be a positive integer, got {self.max_body_bytes!r}")
        if not isinstance(self.max_depth, int) or not 2 <= self.max_depth <= 1000:
            raise ConfigurationError(f"max_depth must be an integer in 2..1000, got {self.max_depth!r}")
        for name in ("soap_prefix", "json_prefix"):
            value = getattr(self, name)
            if not value.startswith("/") or value.endswith("/"):
                raise ConfigurationError(f"{name} must start and not end with '/', got {value!r}")


@dataclass(frozen=True, slots=True)
class _Served:
    """A binding served and its route, resolved once here (the accept looks the route up for each message: the
    endpoints do not)."""

    binding: InboundBinding
    route: RouteDefinition


@dataclass(frozen=True)
class _Trace:
    correlation_id: str
    generated: bool
    source_system: str
    process_id: str | None
    timestamp: datetime | None
    #: the sender's W3C traceparent, read only while tracing is on
    traceparent: str | None


class InboundEndpoints:
    """The SOAP and JSON endpoints of ``bindings`` in front of ``engine``.

    Each binding must have a route in ``engine.routes``; at most one XML and one JSON binding per
    (service, operation). With ``auth`` every request must authenticate as a source system and may only
    send as that system; without it the source system comes from the trace header (required). With
    ``throttling`` every request passes its source system's rule for the operation before anything is stored.
    """

    def __init__(
        self,
        engine: Engine,
        bindings: Iterable[InboundBinding],
        *,
        auth: SourceSystemAuth | None = None,
        settings: InboundSettings | None = None,
        observer: RequestObserver | None = None,
        throttling: Throttling | None = None,
    ) -> None:
        self.engine = engine
        self.throttling = throttling
        self.auth = auth
        self.settings = settings or InboundSettings()
        self.observer = observer
        self._json: dict[tuple[str, str], _Served] = {}
        self._xml: dict[str, list[InboundBinding]] = {}
        self._by_element: dict[str, dict[str, _Served]] = {}
        self._by_action: dict[str, dict[str, _Served]] = {}
        for binding in bindings:
            self._add(binding)

    def _add(self, binding: InboundBinding) -> None:
        if not isinstance(binding, InboundBinding):
            raise ConfigurationError(f"expected an InboundBinding, got {binding!r}")
        if binding.key not in self.engine.routes:
            raise ConfigurationError(f"binding {binding.service}/{binding.operation} has no route in the engine")
        served = _Served(binding, self.engine.routes.get(binding.service, binding.operation))
        if binding.content_type == "json":
            if binding.key in self._json:
                raise ConfigurationError(f"two JSON bindings for {binding.service}/{binding.operation}")
            self._json[binding.key] = served
            return
        xml = self._xml.setdefault(binding.service, [])
        if any(b.operation == binding.operation for b in xml):
            raise ConfigurationError(f"two XML bindings for {binding.service}/{binding.operation}")
        elements = self._by_element.setdefault(binding.service, {})
        actions = self._by_action.setdefault(binding.service, {})
        if binding.request_element is not None:
            key = etree.QName(binding.request_element).text
            if key in elements:
                raise ConfigurationError(f"service {binding.service}: request element {key} is bound twice")
            elements[key] = served
        if binding.soap_action:
            if binding.soap_action in actions:
                raise ConfigurationError(f"service {binding.service}: SOAPAction {binding.soap_action} is bound twice")
            actions[binding.soap_action] = served
        xml.append(binding)

    @property
    def bindings(self) -> list[InboundBinding]:
        """Every binding served."""
        return [*(s.binding for s in self._json.values()), *(b for group in self._xml.values() for b in group)]

    def routes(self) -> list[Route]:
        """The routes: ``POST/GET {soap_prefix}/{service}`` and ``POST {json_prefix}/{service}/{operation}``, and
        the JSON contract (``GET {json_prefix}/openapi.json``, ``GET {json_prefix}/docs``: :mod:`.openapi`)."""
        contract = InboundContract(lambda: self.bindings, self.engine.routes, prefix=self.settings.json_prefix,
                                   secured=self.auth is not None)
        # the POST routes first: Starlette tries the routes in turn for every request, and a path matches at most
        # one route of each method here, so the order changes only which Allow header a 405 of /docs/{asset} has
        return [
            Route(self.settings.soap_prefix + "/{service}", self.soap, methods=["POST"]),
            Route(self.settings.json_prefix + "/{service}/{operation}", self.json, methods=["POST"]),
            Route(self.settings.soap_prefix + "/{service}", self.wsdl, methods=["GET"]),
            *contract.routes(),
        ]

    def post_endpoint(self, path: str) -> tuple[Callable[[Request], Awaitable[Response]], dict[str, str]] | None:
        """The endpoint and path parameters of a POST to ``path`` as :meth:`routes` match it (``[^/]+`` for each
        parameter), or None for a path no POST route of these endpoints matches."""
        soap = self.settings.soap_prefix + "/"
        if path.startswith(soap):
            service = path[len(soap):]
            if service and "/" not in service:
                return self.soap, {"service": service}
        json_prefix = self.settings.json_prefix + "/"
        if path.startswith(json_prefix):
            service, slash, operation = path[len(json_prefix):].partition("/")
            if service and slash and operation and "/" not in operation:
                return self.json, {"service": service, "operation": operation}
        return None

    # -- shared steps ----------------------------------------------------------------------------------------
    def _authenticate(self, headers: Mapping[str, str], request: Request) -> str | None:
        if self.auth is None:
            return None
        return self.auth.authenticate(headers, request.client.host if request.client else None,
                                      claimed=headers.get(SOURCE_SYSTEM_HEADER))

    def _trace(self, headers: Mapping[str, str], authenticated: str | None, soap: Mapping[str, str]) -> _Trace:
        claimed = soap.get("sourceSystem") or headers.get(SOURCE_SYSTEM_HEADER)
        if authenticated is not None:
            if soap:  # the header's claim was checked with the credentials; a SOAP trace header claims on its own
                require_system(authenticated, claimed)
            source = authenticated
        elif claimed:
            source = claimed
        else:
            raise ValidationError("the source system is missing (trace header sourceSystem / X-Source-System)")
        correlation_id = soap.get("correlationId") or headers.get(CORRELATION_HEADER)
        generated = not correlation_id
        return _Trace(
            correlation_id=correlation_id or uuid.uuid4().hex,
            generated=generated,
            source_system=source,
            process_id=soap.get("processId") or headers.get(PROCESS_HEADER),
            timestamp=parse_timestamp(soap.get("timestamp") or headers.get(TIMESTAMP_HEADER)),
            traceparent=soap.get(tracing.TRACEPARENT) or headers.get(tracing.TRACEPARENT) if tracing.ENABLED else None,
        )

    async def _throttle(self, trace: _Trace, operation: str) -> AcceptResult | None:
        """Count the request under its throttling rule; None: go on. Over the limit, a re-send of a message already
        stored (same source system and correlation id) gets the duplicate's answer, as it would within the limit:
        a sender that re-sends what it was not sure had arrived learns that it had. Anything else raises
        :class:`ThrottledError` (nothing stored)."""
        assert self.throttling is not None  # noqa: S101  narrows an Optional for mypy: the caller checked
        try:
            await self.throttling.check(trace.source_system, operation)
        except ThrottledError as throttled:
            if trace.generated:  # a correlation id made up for this request matches nothing stored
                raise
            c = message_table.c
            try:
                stored = await anyio.to_thread.run_sync(lambda: self.engine.store.find(
                    c.source_system == trace.source_system, c.correlation_id == trace.correlation_id, limit=1))
            except Exception:  # the store cannot tell now: the refusal stands (try later, as 429 says)
                raise throttled from None
            if not stored:
                raise
            return AcceptResult(stored[0].id, stored[0].correlation_id, True, stored[0].state)
        return None

    @staticmethod
    def _message(
        served: _Served, payload: ParsedPayload, trace: _Trace, content_type: str, headers: dict[str, str],
    ) -> InboundMessage:
        """The message handed to ``engine.accept`` once the binding's checks passed; raises ValidationError
        (InvalidBodyError for a typed route's body)."""
        return checked_message(
            served.binding, served.route, payload, content_type=content_type, correlation_id=trace.correlation_id,
            source_system=trace.source_system, process_id=trace.process_id, message_timestamp=trace.timestamp,
            headers=headers, traceparent=trace.traceparent,
        )

    def _observe(self, endpoint: str, code: str, status: int, started: float) -> None:
        if self.observer is not None:
            try:
                self.observer(endpoint, code, status, time.perf_counter() - started)
            except Exception as error:
                repeated_errors.log(log, "request observer failed", error=error)

    @staticmethod
    def _classify(error: BaseException, endpoint: str, path: str) -> tuple[int, str, str]:
        status, code = status_and_code(error)
        if isinstance(error, StoreUnavailableError):  # the store's outage log has the one line of the outage
            log.debug("%s request to %s refused: %s", endpoint, path, code)
            return status, code, str(error)
        if status == 500:
            repeated_errors.log(log, "%s request to %s failed", endpoint, path, error=error)
            return status, code, "internal error (see the server log)"
        # a client that went away (the request deadline logs its own line) is not a refusal worth a line
        (log.debug if code == CLIENT_DISCONNECTED else log.info)("%s request to %s refused: %s %s", endpoint, path,
                                                                   code, error)
        return status, code, str(error)

    # -- SOAP ------------------------------------------------------------------------------------------------
    async def soap(self, request: Request) -> Response:
        """A SOAP 1.1 (``text/xml``) or 1.2 (``application/soap+xml``) request to ``{soap_prefix}/{service}``."""
        started = time.perf_counter()
        service = request.path_params["service"]
        version: SoapVersion = SOAP11
        correlation_id: str | None = None
        headers = _header_values(request.scope)
        try:
            try:
                version, action = soap_version_of(headers.get("content-type"))
            except UnsupportedMediaTypeError as media_error:
                unsupported: UnsupportedMediaTypeError | None = media_error
            else:
                unsupported = None
            authenticated = self._authenticate(headers, request)
            if service not in self._xml:
                raise UnknownOperationError(service, "*")
            if unsupported is not None:
                raise unsupported
            if version is SOAP11:
                action = (headers.get("soapaction") or "").strip().strip('"') or None
            body = await read_body(request.receive, headers.get("content-length"), self.settings.max_body_bytes)
            root = parse_xml(body, self.settings.max_depth)
            envelope = read_envelope(root, version)
            correlation_id = envelope.trace.get("correlationId") or headers.get(CORRELATION_HEADER)
            served = self._dispatch(service, envelope.body_element, action)
            payload = envelope.payload()
            trace = self._trace(headers, authenticated, envelope.trace)
            correlation_id = trace.correlation_id
            stored_headers = {"endpoint": "soap", "soapVersion": version.name}
            if action:
                stored_headers["soapAction"] = action[:255]
            resent = None if self.throttling is None else await self._throttle(trace, served.binding.operation)
            inbound = self._message(served, payload, trace, "application/xml", stored_headers)
            # the two documents are freed now, while warm, and the collector does not meet their proxies while the
            # accept waits for its commit with the requests in flight
            del root, envelope, payload
            result = resent or await self.engine.accept(inbound)
        except Exception as error:
            status, code, reason = self._classify(error, "SOAP", request.url.path)
            sender = status < 500
            http_status = fault_status(version, sender, status)
            extra = _error_headers(error)
            if correlation_id:
                extra["X-Correlation-Id"] = correlation_id
            self._observe("soap", code, http_status, started)
            return Response(
                fault_envelope(version, sender, code, reason, correlation_id, _field_errors(error)), http_status,
                headers=extra, media_type=f"{version.content_type}; charset=utf-8",
            )
        self._observe("soap", "DUPLICATE" if result.duplicate else "ACCEPTED", 200, started)
        return _Answer(
            accept_envelope(version, result.message_id, result.correlation_id, result.duplicate, result.state.value),
            200, result, _SOAP_CONTENT_TYPES[version.name],
        )

    def _dispatch(self, service: str, element: etree._Element, action: str | None) -> _Served:
        qname = element.tag  # {namespace}local, as the bindings are keyed
        served = self._by_element[service].get(qname)
        if served is None and action:
            candidate = self._by_action[service].get(action)
            if candidate is not None and candidate.binding.request_element is None:
                served = candidate
        if served is None:
            raise UnknownOperationError(service, qname)
        expected = served.binding.soap_action
        if expected and action and action != expected:
            raise ValidationError(
                f"SOAPAction {action!r} does not match the body element {qname} (expects {expected!r})"
            )
        return served

    async def wsdl(self, request: Request) -> Response:
        """``GET {soap_prefix}/{service}?wsdl``: the WSDL of the service's SOAP operations (no authentication)."""
        service = request.path_params["service"]
        if "wsdl" not in {key.lower() for key in request.query_params}:
            return JSONResponse({"error": "NOT_FOUND", "reason": "SOAP endpoint: POST a request or GET ?wsdl"}, 404)
        bindings = self._xml.get(service)
        if not bindings:
            return JSONResponse({"error": "UNKNOWN_OPERATION", "reason": f"no SOAP service {service!r}"}, 404)
        address = str(request.url.replace(query=""))
        return Response(wsdl_document(service, bindings, address), 200, media_type="text/xml; charset=utf-8")

    # -- JSON ------------------------------------------------------------------------------------------------
    async def json(self, request: Request) -> Response:
        """``POST {json_prefix}/{service}/{operation}`` with a JSON object body (``application/json``)."""
        started = time.perf_counter()
        service = request.path_params["service"]
        operation = request.path_params["operation"]
        headers = _header_values(request.scope)
        correlation_id = headers.get(CORRELATION_HEADER)
        try:
            authenticated = self._authenticate(headers, request)
            served = self._json.get((service, operation))
            if served is None:
                raise UnknownOperationError(service, operation)
            check_json_type(headers.get("content-type"))
            body = await read_body(request.receive, headers.get("content-length"), self.settings.max_body_bytes)
            text, document = parse_json(body, self.settings.max_depth)
            trace = self._trace(headers, authenticated, {})
            correlation_id = trace.correlation_id
            resent = None if self.throttling is None else await self._throttle(trace, operation)
            inbound = self._message(served, ParsedPayload("json", text, json=document), trace, "application/json",
                                    {"endpoint": "json"})
            del document  # as the SOAP endpoint's documents: not kept while the accept waits
            result = resent or await self.engine.accept(inbound)
        except Exception as error:
            status, code, reason = self._classify(error, "JSON", request.url.path)
            extra = _error_headers(error)
            if correlation_id:
                extra["X-Correlation-Id"] = correlation_id
            self._observe("json", code, status, started)
            fields = _field_errors(error)
            answer = {"error": code, "reason": reason, **({"fields": fields} if fields else {})}
            return JSONResponse(answer, status, headers=extra)
        status = 200 if result.duplicate else 202
        self._observe("json", "DUPLICATE" if result.duplicate else "ACCEPTED", status, started)
        accepted: dict[str, object] = {
            "messageId": result.message_id,
            "correlationId": result.correlation_id,
            "status": "DUPLICATE" if result.duplicate else "ACCEPTED",
            "state": result.state.value,
        }
        return _Answer(_JSON_ENCODER.encode(accepted).encode("utf-8"), status, result, b"application/json")


class InboundDispatch:
    """ASGI middleware handing ``POST {soap_prefix}/{service}`` and ``POST {json_prefix}/{service}/{operation}`` to
    their endpoints directly, with the scope the router would give them (``endpoint``, ``path_params``): each
    inbound request skips the exception middleware, the tries of every route in turn and the request-response
    wrappers (about a sixth of an accepted request's Python). The app's routes come first for those paths anyway
    (:meth:`InboundEndpoints.routes` precede the others), the endpoints answer every error themselves, and what
    escapes them reaches the server-error middleware as before. Requests under a ``root_path`` take the router.

    ``headers`` (raw name, value pairs, names in lower case) go into every answer of the endpoints that lacks them,
    after its own, as a middleware adding them to every response would put them: installed outside that middleware,
    the inbound requests skip it (a wrapper of ``send`` per request)::

        Starlette(routes=..., middleware=[Middleware(InboundDispatch, endpoints=inbound, headers=security_headers),
                                          Middleware(SecurityHeaders)])
    """

    def __init__(self, app: ASGIApp, endpoints: InboundEndpoints,
                 headers: Sequence[tuple[bytes, bytes]] = ()) -> None:
        self.app = app
        self.endpoints = endpoints
        self.headers = tuple(headers)
        # the acknowledgment's own names are known: the headers it lacks are known too
        self._answer_headers = [item for item in self.headers if item[0] not in _ANSWER_HEADER_NAMES]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Serve an inbound POST straight from its endpoint table; everything else goes to the wrapped app."""
        if scope["type"] == "http" and scope["method"] == "POST" and not scope.get("root_path"):
            found = self.endpoints.post_endpoint(scope["path"])
            if found is not None:
                scope["endpoint"], scope["path_params"] = found
                response = await found[0](Request(scope, receive, send))
                if self.headers:
                    raw = response.raw_headers
                    if type(response) is _Answer:
                        raw.extend(self._answer_headers)
                    else:
                        present = {bytes(name).lower() for name, _ in raw}
                        raw.extend(item for item in self.headers if item[0] not in present)
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


#: what JSONResponse renders with (json.dumps with arguments builds a new encoder per call)
_JSON_ENCODER = json.JSONEncoder(ensure_ascii=False, allow_nan=False, indent=None, separators=(",", ":"))
_SOAP_CONTENT_TYPES = {version.name: f"{version.content_type}; charset=utf-8".encode("latin-1")
                       for version in (SOAP11, SOAP12)}


#: the names of an acknowledgment's headers (:class:`_Answer`)
_ANSWER_HEADER_NAMES = frozenset({b"x-correlation-id", b"x-message-id", b"content-length", b"content-type"})


class _Answer(Response):
    """The acknowledgment of an accepted request: the headers Starlette's ``Response`` would send for
    ``headers={"X-Correlation-Id": ..., "X-Message-Id": ...}``, in its order, built directly (its
    ``init_headers`` was a tenth of a JSON request's Python)."""

    def __init__(self, body: bytes, status: int, result: AcceptResult, content_type: bytes) -> None:
        self.status_code = status
        self.background = None
        self.body = body
        self.raw_headers = [
            (b"x-correlation-id", result.correlation_id.encode("latin-1")),
            (b"x-message-id", str(result.message_id).encode("latin-1")),
            (b"content-length", str(len(body)).encode("latin-1")),
            (b"content-type", content_type),
        ]


def _field_errors(error: BaseException) -> list[dict[str, str]]:
    """The field errors of a body that does not match its route's model (none for other errors)."""
    return [item.to_dict() for item in error.field_errors] if isinstance(error, InvalidBodyError) else []


def _header_values(scope: Mapping[str, Any]) -> dict[str, str]:
    """The request's headers by lower-case name, the first of repeated ones, as Starlette's ``Headers.get``
    gives them: one pass instead of a scan of the raw list for each of the request's ~7 lookups."""
    values: dict[str, str] = {}
    for name, value in scope["headers"]:
        key = name.decode("latin-1").lower()
        if key not in values:
            values[key] = value.decode("latin-1")
    return values


def _error_headers(error: BaseException) -> dict[str, str]:
    """The headers an error answer carries besides the correlation id: the challenge of a 401, the wait of a
    "try later" (429, 503)."""
    if isinstance(error, AuthenticationError):
        return {"WWW-Authenticate": 'Basic realm="openroute"'}
    retry_after = getattr(error, "retry_after", None)
    if isinstance(retry_after, int):
        return {"Retry-After": str(retry_after)}
    return {}


def bindings_for(routes: Iterable[Any], explicit: Iterable[InboundBinding] = ()) -> list[InboundBinding]:
    """``explicit`` bindings plus default XML and JSON bindings for every route that has none of that kind."""
    from openroute.definitions.binding import default_bindings

    result = list(explicit)
    have = {(b.service, b.operation, b.content_type) for b in result}
    for route in routes:
        for binding in default_bindings(route.service, route.operation):
            if (binding.service, binding.operation, binding.content_type) not in have:
                result.append(binding)
    return result
