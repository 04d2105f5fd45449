"""Traces of a message across its asynchronous hops (W3C Trace Context, OpenTelemetry): a no-op while tracing is off.

With the ``otel`` extra installed and tracing on (``[tracing] enabled = true`` in openroute.toml, or :func:`enable`
with a tracer provider), each message is one trace, whatever nodes and restarts it meets::

    accept crm/setCustomer                 the sender's traceparent is its parent (a new trace without a valid one)
    ├── attempt crm/setCustomer            attempt 1, on node A
    │   ├── step check
    │   └── step charge
    │       └── call charge                the outbound request carries a traceparent naming this span
    ├── attempt crm/setCustomer            attempt 2 (PARTLY_FAILED before), on node B after A's restart
    └── confirm CRM                        the confirmation to the source system

The accepting span's ``traceparent`` is stored with the message (column ``message.traceparent``, migration 0012):
every later span of the message has it as parent, on any node, after any restart. The shipped outbound clients
(:class:`~openroute.outbound.ExternalHttpClient`, :class:`~openroute.outbound.SoapService`, the confirmation
transports) send the current span as the ``traceparent`` header.

The callers check the module flag :data:`ENABLED` before calling anything here, so while tracing is off a message
costs one attribute read per hop and nothing of OpenTelemetry is imported. In a test::

    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from openroute.runtime import tracing

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.enable(provider)          # ... run messages, then exporter.get_finished_spans()
    tracing.disable()

Spans and their attributes are listed in docs/operations.md (Tracing).
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Iterator, Mapping, MutableMapping
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from openroute.definitions.errors import ConfigurationError
from openroute.definitions.interceptors import CallNext, InterceptionContext, MessageInterceptor

if TYPE_CHECKING:
    import httpx

    from openroute.definitions.message import InboundMessage
    from openroute.persistence import StoredMessage

__all__ = [
    "ENABLED",
    "STEP_SPANS",
    "TRACEPARENT",
    "accept_span",
    "attempt_ended",
    "attempt_span",
    "call_span",
    "configure",
    "confirm_span",
    "confirmation_span",
    "current_traceparent",
    "disable",
    "enable",
    "inject",
    "propagate_from",
    "traceparent_of",
]

#: whether tracing is on: every caller checks it before calling anything else here (the cost of tracing while off)
ENABLED = False
#: the W3C header (and SOAP trace header field, and broker header) that carries the trace context
TRACEPARENT = "traceparent"
#: the instrumentation scope of openroute's spans
SCOPE = "openroute"
#: the error text of a configuration that asks for tracing on an install without the extra
MISSING_EXTRA = ("tracing is on ([tracing] enabled) but OpenTelemetry is not installed: install the otel extra "
                 "(pip install -e '.[otel]' in a checkout) or turn tracing off")

_tracer: Any = None
_owned_provider: Any = None  # made by configure(): flushed and shut down by disable()
_propagator: Any = None
_kinds: Any = None  # opentelemetry.trace.SpanKind



class _AcceptResult(Protocol):
    @property
    def message_id(self) -> int: ...
    @property
    def duplicate(self) -> bool: ...


_Accepted = TypeVar("_Accepted", bound=_AcceptResult)
_Attempted = TypeVar("_Attempted")

def enable(provider: Any = None) -> None:
    """Turn tracing on with ``provider`` (an OpenTelemetry ``TracerProvider``; default: the global one).

    Raises :class:`ConfigurationError` when OpenTelemetry is not installed."""
    global ENABLED, _tracer, _propagator, _kinds
    try:
        from opentelemetry import trace
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
    except ImportError:
        raise ConfigurationError(MISSING_EXTRA) from None
    _tracer = (provider or trace.get_tracer_provider()).get_tracer(SCOPE)
    _propagator = TraceContextTextMapPropagator()
    _kinds = trace.SpanKind
    ENABLED = True


def configure(*, service_name: str = "openroute", endpoint: str | None = None, timeout: float | None = None) -> None:
    """Turn tracing on with spans exported by OTLP over HTTP (protobuf) in batches, as ``service_name``.

    ``endpoint`` is the collector's traces URL (e.g. ``http://collector:4318/v1/traces``); None leaves it to the
    standard variables ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` / ``OTEL_EXPORTER_OTLP_ENDPOINT`` (default
    ``http://localhost:4318/v1/traces``), as ``OTEL_EXPORTER_OTLP_HEADERS`` gives the headers (credentials stay out
    of the file) and ``OTEL_TRACES_SAMPLER`` the sampler. ``timeout`` bounds one export (seconds).

    Raises :class:`ConfigurationError` when the ``otel`` extra is not installed."""
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError:
        raise ConfigurationError(MISSING_EXTRA) from None
    global _owned_provider
    disable()  # a provider made by an earlier call is flushed and shut down
    provider = TracerProvider(resource=Resource.create({"service.name": service_name}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint, timeout=timeout)))
    enable(provider)
    _owned_provider = provider


def disable() -> None:
    """Turn tracing off; a provider made by :func:`configure` exports what it holds and shuts down."""
    global ENABLED, _owned_provider
    ENABLED = False  # the tracer stays: a span begun before this ends normally (a shut-down provider drops it)
    provider, _owned_provider = _owned_provider, None
    if provider is not None:
        provider.shutdown()


def _parent(traceparent: str | None, *, fallback_to_current: bool) -> Any:
    """The context whose span is the remote parent named by ``traceparent``; an invalid or missing one is ignored
    (W3C Trace Context: a new trace), leaving the current context (``fallback_to_current``) or none."""
    from opentelemetry.context import Context

    base = None if fallback_to_current else Context()
    if not traceparent:
        return base
    return _propagator.extract({TRACEPARENT: traceparent}, context=base)


def traceparent_of(span: Any) -> str | None:
    """The W3C ``traceparent`` (version 00) naming ``span`` as the parent, None for an invalid span."""
    context = span.get_span_context()
    if not context.is_valid:
        return None
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{int(context.trace_flags):02x}"


def current_traceparent() -> str | None:
    """The ``traceparent`` of the span current in this task (None without one)."""
    from opentelemetry import trace

    return traceparent_of(trace.get_current_span())


def inject(headers: MutableMapping[str, str]) -> None:
    """Put the current span's ``traceparent`` (and ``tracestate``) into ``headers``; nothing without a span."""
    _propagator.inject(headers)


async def _inject_into_request(request: httpx.Request) -> None:
    """An httpx request hook: the outbound request carries the current span (while tracing is on)."""
    if ENABLED:
        _propagator.inject(request.headers)


def propagate_from(client: httpx.AsyncClient) -> httpx.AsyncClient:
    """Make the ``httpx.AsyncClient`` ``client`` send the current span as ``traceparent`` with every request
    while tracing is on (a request hook, added once); returns ``client``. Used by the shipped outbound clients."""
    hooks = client.event_hooks
    if _inject_into_request not in hooks["request"]:
        client.event_hooks = {**hooks, "request": [*hooks["request"], _inject_into_request]}
    return client


@contextlib.contextmanager
def accept_span(inbound: InboundMessage) -> Iterator[Any]:
    """The span of one accept, child of the sender's ``traceparent`` (ignored when invalid: a new trace); an
    exception leaving the block (nothing stored) is recorded and marks it failed."""
    endpoint = inbound.headers.get("endpoint") if isinstance(inbound.headers, Mapping) else None
    kind = _kinds.CONSUMER if endpoint == "channel" else _kinds.SERVER
    attributes = {"openroute.service": inbound.service, "openroute.operation": inbound.operation,
                  "openroute.source_system": inbound.source_system, "openroute.correlation_id": inbound.correlation_id}
    if endpoint:
        attributes["openroute.endpoint"] = endpoint
    traceparent = inbound.traceparent if isinstance(inbound.traceparent, str) else None
    with _tracer.start_as_current_span(f"accept {inbound.service}/{inbound.operation}", kind=kind,
                                       context=_parent(traceparent, fallback_to_current=True),
                                       attributes=attributes) as span:
        yield span


@contextlib.contextmanager
def attempt_span(message: StoredMessage, node_id: str) -> Iterator[Any]:
    """The span of one processing attempt of ``message`` (claimed), child of its stored ``traceparent``: the same
    trace on every node and after restarts (a message stored while tracing was off starts a trace of its own)."""
    attributes = {"openroute.message_id": message.id, "openroute.attempt": message.failed_count + 1,
                  "openroute.node_id": node_id, "openroute.service": message.service,
                  "openroute.operation": message.operation}
    with _tracer.start_as_current_span(f"attempt {message.service}/{message.operation}",
                                       context=_parent(message.traceparent, fallback_to_current=False),
                                       attributes=attributes) as span:
        yield span


async def traced_accept(inbound: InboundMessage, accept: Callable[[str | None], Awaitable[_Accepted]]) -> _Accepted:
    """``accept(traceparent)`` in the accept span (child of the sender's traceparent): the traceparent it stores is
    the span's own, so the message's attempts and confirmation hang under it."""
    with accept_span(inbound) as span:
        result = await accept(traceparent_of(span))
        span.set_attribute("openroute.message_id", result.message_id)
        span.set_attribute("openroute.duplicate", result.duplicate)
        return result


async def traced_attempt(message: StoredMessage, node_id: str, attempt: Awaitable[_Attempted]) -> _Attempted:
    """``attempt`` (the engine's attempt of the claimed ``message``) in its attempt span."""
    from openroute.persistence import StoredMessage

    with attempt_span(message, node_id) as span:
        attempted = await attempt
        if isinstance(attempted, StoredMessage):  # held back, dropped or waiting for children
            span.set_attribute("openroute.outcome", attempted.state.value)
        return attempted


def attempt_ended(outcome: str, error_code: str | None, error: BaseException | None) -> None:
    """Record the outcome state of the attempt whose span is current (failed: its error)."""
    from opentelemetry import trace
    from opentelemetry.trace import StatusCode

    span = trace.get_current_span()
    span.set_attribute("openroute.outcome", outcome)
    if error_code is not None:
        span.set_attribute("openroute.error_code", error_code)
    if error is not None:
        span.record_exception(error)
        span.set_status(StatusCode.ERROR, f"{type(error).__name__}: {error}"[:200])


class _StepSpans(MessageInterceptor):
    """The innermost interceptor while tracing is on: a span around each step (its exception recorded)."""

    async def around_step(self, context: InterceptionContext, call_next: CallNext) -> Any:
        with _tracer.start_as_current_span(f"step {context.step_name}",
                                           attributes={"openroute.step": context.step_name or "",
                                                       "openroute.message_id": context.message.id}):
            return await call_next()


#: added after every other interceptor by the engine while tracing is on
STEP_SPANS: MessageInterceptor = _StepSpans()


@contextlib.contextmanager
def call_span(key: str, system: str | None, idempotency_key: str, message_id: int) -> Iterator[Any]:
    """The span of one external call made (a client span: the shipped clients send it as the traceparent)."""
    attributes: dict[str, Any] = {"openroute.call.key": key, "openroute.call.idempotency_key": idempotency_key,
                                  "openroute.message_id": message_id}
    if system is not None:
        attributes["openroute.call.system"] = system
    with _tracer.start_as_current_span(f"call {system or key}", kind=_kinds.CLIENT, attributes=attributes) as span:
        yield span


@contextlib.contextmanager
def confirm_span(traceparent: str | None, message_id: int, source_system: str, state: str,
                 attempt: int) -> Iterator[Any]:
    """The span of one attempt to send a confirmation, child of the message's stored ``traceparent``."""
    attributes = {"openroute.message_id": message_id, "openroute.source_system": source_system,
                  "openroute.state": state, "openroute.confirmation.attempt": attempt}
    with _tracer.start_as_current_span(f"confirm {source_system}", kind=_kinds.CLIENT,
                                       context=_parent(traceparent, fallback_to_current=False),
                                       attributes=attributes) as span:
        yield span


def confirmation_span(traceparent: str | None, message_id: int, source_system: str, state: str,
                      attempt: int) -> contextlib.AbstractContextManager[Any]:
    """:func:`confirm_span` while tracing is on, else nothing: the span the composition root gives the confirmation
    service (``openroute.confirmation`` imports no runtime module)."""
    if not ENABLED:
        return contextlib.nullcontext()
    return confirm_span(traceparent, message_id, source_system, state, attempt)
