"""The typed errors of openroute: one tree under :class:`OpenrouteError`.

Everything a caller may need to tell apart has its own class::

    OpenrouteError
    ├── ConfigurationError (ValueError)   a setting, retry policy or definition that cannot work
    │   └── InvalidConfirmationError      (openroute.confirmation) a malformed confirmation request or policy
    ├── DeploymentError                   the application cannot be assembled; lists every problem
    │   ├── DefinitionError               (openroute.messaging) a function shape the messaging layer cannot use
    │   └── ConfigError                   (openroute.messaging) an unreadable or malformed channel configuration
    ├── ValidationError                   the inbound message is invalid; nothing stored
    │   ├── PayloadTooLargeError
    │   └── MalformedPayloadError, UnsupportedMediaTypeError, ...   (openroute.inbound)
    ├── UnknownRouteError (LookupError)   no route for (service, operation)
    ├── BusinessError                     a business rule refused the message (FAILED at once)
    ├── TechnicalError                    a transient failure (retried)
    │   └── CircuitOpenError              an external system's circuit breaker refused the call (POSTPONED)
    ├── IllegalTransitionError            the state machine has no such transition
    ├── StaleMessageError                 another writer changed the message first
    ├── MessageDroppedByInterceptor       an interceptor dropped the message (SKIPPED)
    ├── NodeNotAcceptingError             an operator drained or stopped this node (HTTP 503)
    ├── StoreUnavailableError             the database cannot be reached now; nothing stored (HTTP 503)
    ├── ThrottledError                    the source system sent over its throttling limit (HTTP 429)
    ├── ConfirmationError                 (openroute.confirmation) the confirmation layer
    └── EmitterOverflowError, MessageDroppedError, ChannelClosedError, RedeliverError   (openroute.messaging,
                                          also RuntimeError)

"Bad configuration" has two names only: :class:`ConfigurationError` for one value that cannot work,
:class:`DeploymentError` (the MicroProfile name) for an application that cannot be assembled.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from openroute.messaging.errors import DeploymentError, OpenrouteError

__all__ = [
    "BusinessError",
    "CircuitOpenError",
    "ConfigurationError",
    "DeploymentError",
    "IllegalTransitionError",
    "MessageDroppedByInterceptor",
    "NodeNotAcceptingError",
    "OpenrouteError",
    "PayloadTooLargeError",
    "StaleMessageError",
    "StoreUnavailableError",
    "TechnicalError",
    "ThrottledError",
    "UnknownRouteError",
    "ValidationError",
    "is_expected_error",
]


class ConfigurationError(OpenrouteError, ValueError):
    """A setting, retry policy or route definition that cannot work (e.g. ``max_attempts=0``)."""


class ValidationError(OpenrouteError):
    """The inbound message is invalid; nothing is stored (HTTP 400 / SOAP Fault).

    Raised from a route step it ends the message FAILED at once, without retries.
    """


class PayloadTooLargeError(ValidationError):
    """The payload exceeds ``EngineSettings.max_payload_bytes``; nothing is stored."""

    def __init__(self, size: int, limit: int) -> None:
        super().__init__(f"payload of {size} bytes exceeds the limit of {limit} bytes")
        self.size = size
        self.limit = limit


class UnknownRouteError(OpenrouteError, LookupError):
    """No route is registered for (service, operation); nothing is stored."""

    def __init__(self, service: str, operation: str) -> None:
        super().__init__(f"no route for service {service!r}, operation {operation!r}")
        self.service = service
        self.operation = operation


class BusinessError(OpenrouteError):
    """A business rule refused the message: it ends FAILED at once, the error is kept for the confirmation.

    ``BusinessError("NO_CREDIT", "the customer has no credit")`` or, as for :class:`TechnicalError`, with keywords:
    ``BusinessError(code="NO_CREDIT", message="the customer has no credit")`` (``text=`` is the older keyword).
    """

    def __init__(self, code: str, message: str | None = None, *, text: str | None = None) -> None:
        text = _one_text(message, text)
        super().__init__(f"{code}: {text}")
        self.code = code
        self.text = text

    def to_dict(self) -> dict[str, Any]:
        """The JSON form stored in the message's ``business_errors``."""
        return {"code": self.code, "text": self.text}


class TechnicalError(OpenrouteError):
    """A transient failure (network, remote system down): the message is retried per its RetryPolicy.

    Any exception a step raises that is not a validation or business error is treated the same way;
    this class only lets a step choose the error code stored with the message, and is logged without a
    traceback. ``TechnicalError("billing is down")`` or with keywords, as for :class:`BusinessError`:
    ``TechnicalError(code="BILLING_DOWN", message="billing is down")``. The code is a keyword only, so the two
    errors never take their arguments in opposite orders.
    """

    def __init__(self, message: str | None = None, *, code: str = "TECHNICAL_ERROR", text: str | None = None) -> None:
        text = _one_text(message, text)
        super().__init__(text)
        self.code = code
        self.text = text


class CircuitOpenError(TechnicalError):
    """The circuit breaker of external system ``system`` is open (or its trial calls are all taken): the call was
    not made. The message parks on the system without counting an attempt until the breaker lets calls through
    (``engine/outcome.py``); ``retry_at`` is when the breaker may let calls through at the earliest."""

    def __init__(self, system: str, retry_at: datetime, state: str = "OPEN") -> None:
        super().__init__(f"the circuit breaker of {system} is {state}: call not made, retry at {retry_at.isoformat()}",
                         code="CIRCUIT_OPEN")
        self.system = system
        self.retry_at = retry_at
        self.state = state

    @property
    def parks(self) -> bool:
        """Whether the message parks on the system (an OPEN or HALF_OPEN breaker refused it) rather than being due
        again at ``retry_at`` (nodes raced for the breaker's row: ``contended``)."""
        return self.state in ("OPEN", "HALF_OPEN")


def _one_text(message: str | None, text: str | None) -> str:
    if message is None and text is None:
        raise TypeError("the error needs its message (message=...)")
    if message is not None and text is not None:
        raise TypeError("give message= or text=, not both")
    return message if message is not None else str(text)


class IllegalTransitionError(OpenrouteError):
    """The state machine has no transition between the two states; nothing was written."""

    def __init__(self, from_state: Any, to_state: Any) -> None:
        super().__init__(f"illegal transition {getattr(from_state, 'value', from_state)} -> "
                         f"{getattr(to_state, 'value', to_state)}")
        self.from_state = from_state
        self.to_state = to_state


class StaleMessageError(OpenrouteError):
    """Another writer changed the message first (optimistic lock lost); nothing was written."""

    def __init__(self, message_id: int, version: int) -> None:
        super().__init__(f"message {message_id} is no longer at version {version}: another writer changed it")
        self.message_id = message_id
        self.version = version


class MessageDroppedByInterceptor(OpenrouteError):
    """An interceptor dropped the message: it ends SKIPPED with error code DROPPED and this reason (recorded)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class NodeNotAcceptingError(OpenrouteError):
    """An operator drained (HANDLES_EXISTING_MESSAGES) or stopped this node: it takes no new messages (HTTP 503,
    send to another node); nothing was stored."""

    code = "NODE_NOT_ACCEPTING"

    def __init__(self, node_id: str, state: str) -> None:
        super().__init__(f"node {node_id} is {state} and takes no new messages; nothing was stored")
        self.node_id = node_id
        self.state = state


class StoreUnavailableError(OpenrouteError):
    """The message store cannot be reached now (database down, connection lost): nothing was stored; the sender
    should try again after ``retry_after`` seconds (HTTP 503 with ``Retry-After``, SOAP Server fault)."""

    code = "STORE_UNAVAILABLE"

    def __init__(self, retry_after: int = 5) -> None:
        super().__init__(
            f"the message store is unreachable; nothing was stored, retry in {retry_after} s"
        )
        self.retry_after = retry_after


class ThrottledError(OpenrouteError):
    """The source system sent more requests of the operation than its throttling rule allows: nothing was stored;
    the window frees up after ``retry_after`` seconds (HTTP 429 with ``Retry-After``, SOAP fault ``THROTTLED``)."""

    code = "THROTTLED"

    def __init__(self, source_system: str, operation: str, limit: int, interval: float, retry_after: int) -> None:
        super().__init__(
            f"source system {source_system!r} sent more than {limit} {operation!r} requests in {interval:g} s; "
            f"nothing was stored, retry in {retry_after} s"
        )
        self.source_system = source_system
        self.operation = operation
        self.limit = limit
        self.interval = interval
        self.retry_after = retry_after


#: modules whose errors are failures of a remote system (expected: retried, logged without a traceback)
_REMOTE_MODULES = ("httpx", "httpcore", "zeep", "aio_pika", "aiormq", "pamqp", "psycopg", "h11", "ssl")


def is_expected_error(error: BaseException) -> bool:
    """True for the failures a route expects: business and validation errors, :class:`TechnicalError` and errors
    of remote systems (network and OS errors, timeouts, errors of the HTTP/SOAP/AMQP clients). They are stored and
    logged by code and text; anything else is a bug somewhere and keeps its traceback."""
    if isinstance(error, BusinessError | ValidationError | TechnicalError | OSError | TimeoutError):
        return True
    return any(type(error).__module__.split(".", 1)[0] == name for name in _REMOTE_MODULES)
