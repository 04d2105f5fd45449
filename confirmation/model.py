"""What a confirmation says, and the errors of the confirmation layer."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from openroute.definitions.errors import ConfigurationError, OpenrouteError

#: The outcome states a source system is told about (SKIPPED messages are never confirmed).
CONFIRMED_STATES: frozenset[str] = frozenset({"OK", "FAILED", "CANCEL"})


class ConfirmationError(OpenrouteError):
    """Base class of every error raised by the confirmation layer."""


class InvalidConfirmationError(ConfirmationError, ConfigurationError):
    """A confirmation request, policy or configuration is malformed (bad input, never retried)."""


class ConfirmationSendError(ConfirmationError):
    """One attempt to deliver a confirmation failed; the reason is stored and the attempt retried per policy.

    ``reason`` is the short text kept in ``last_error``; ``status_code`` is the HTTP status when there was one.
    """

    def __init__(self, reason: str, *, status_code: int | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.status_code = status_code


@dataclass(frozen=True)
class BusinessErrorInfo:
    """A business error reported to the source system (e.g. ``code="E102"``, ``text="unknown customer"``)."""

    code: str
    text: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.code, str) or not self.code:
            raise InvalidConfirmationError(f"business error code must be a non-empty string, got {self.code!r}")
        if not isinstance(self.text, str):
            raise InvalidConfirmationError(f"business error text must be a string, got {type(self.text).__name__}")


@dataclass(frozen=True, kw_only=True)
class ConfirmationRequest:
    """The final outcome of one message, as told to the system that sent it (keyword arguments only).

    ``state`` is ``"OK"``, ``"FAILED"`` or ``"CANCEL"``. ``message_id`` is the store's id of the message, an
    integer as in the accept answer (``xs:long`` in the confirmation's XSD, a JSON number). ``finished_at`` should be
    an aware UTC datetime. ``error_code`` / ``error_text`` are the error of the final state only (an OK message has
    none, whatever its earlier attempts met). ``confirmation_id`` is the stable id
    of this confirmation (the same on every attempt to send it; persisted confirmations always have one): the
    transports send it in the body and as the ``Idempotency-Key`` / ``X-Confirmation-Id`` HTTP headers, so the
    source system can drop a repeat.
    """

    message_id: int
    correlation_id: str
    source_system: str
    process_id: str | None = None
    service: str | None = None
    operation: str | None = None
    state: str
    business_errors: tuple[BusinessErrorInfo, ...] = field(default_factory=tuple)
    error_code: str | None = None
    error_text: str | None = None
    finished_at: datetime | None = None
    confirmation_id: str | None = None
    #: the W3C traceparent stored with the message (``openroute.runtime.tracing``): the parent of the confirmation's
    #: span
    traceparent: str | None = None

    def __post_init__(self) -> None:
        if isinstance(self.message_id, bool) or not isinstance(self.message_id, int) or self.message_id < 1:
            raise InvalidConfirmationError(f"message_id must be a positive integer, got {self.message_id!r}")
        for name in ("correlation_id", "source_system"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value:
                raise InvalidConfirmationError(f"{name} must be a non-empty string, got {value!r}")
        if self.state not in CONFIRMED_STATES:
            raise InvalidConfirmationError(
                f"state must be one of {sorted(CONFIRMED_STATES)}, got {self.state!r}"
            )
        if not isinstance(self.business_errors, tuple):
            # a list is accepted for convenience, but the frozen request keeps an immutable tuple
            if isinstance(self.business_errors, list):
                object.__setattr__(self, "business_errors", tuple(self.business_errors))
            else:
                raise InvalidConfirmationError(
                    f"business_errors must be a tuple of BusinessErrorInfo, got {type(self.business_errors).__name__}"
                )
        for error in self.business_errors:
            if not isinstance(error, BusinessErrorInfo):
                raise InvalidConfirmationError(f"business_errors must hold BusinessErrorInfo, got {error!r}")
        if self.confirmation_id is not None and (
            not isinstance(self.confirmation_id, str) or not self.confirmation_id or len(self.confirmation_id) > 64
        ):
            raise InvalidConfirmationError(
                f"confirmation_id must be a non-empty string of at most 64 characters, got {self.confirmation_id!r}")
        if self.finished_at is not None and (
            not isinstance(self.finished_at, datetime) or self.finished_at.tzinfo is None
        ):
            raise InvalidConfirmationError(f"finished_at must be an aware datetime, got {self.finished_at!r}")

    def idempotency_headers(self) -> dict[str, str]:
        """The HTTP headers carrying :attr:`confirmation_id` (none without one)."""
        if self.confirmation_id is None:
            return {}
        return {"Idempotency-Key": self.confirmation_id, "X-Confirmation-Id": self.confirmation_id}

    def to_json(self) -> dict[str, object]:
        """The JSON document sent by :class:`~confirmation.HttpJsonConfirmation` (camelCase, like the SOAP body)."""
        return {
            "correlationId": self.correlation_id,
            "messageId": self.message_id,
            "sourceSystem": self.source_system,
            "processId": self.process_id,
            "service": self.service,
            "operation": self.operation,
            "state": self.state,
            "finishedAt": self.finished_at.isoformat() if self.finished_at else None,
            "businessErrors": [{"code": e.code, "text": e.text} for e in self.business_errors],
            "errorCode": self.error_code,
            "errorText": self.error_text,
            "confirmationId": self.confirmation_id,
        }


@dataclass(frozen=True)
class ConfirmationInfo:
    """A confirmation row as the admin API shows it."""

    message_id: int
    source_system: str
    outcome_state: str
    status: str
    attempts: int
    next_attempt_at: datetime | None
    last_error: str | None
    created_at: datetime
    updated_at: datetime
    sent_at: datetime | None
    confirmation_id: str | None = None
    claimed_by: str | None = None


@dataclass(frozen=True)
class ProcessReport:
    """What one :meth:`ConfirmationService.process_due` pass did.

    ``sent``: delivered and marked SENT; ``retry_scheduled``: failed, due again later; ``given_up``: failed for the
    last time, now FAILED; ``lost_claims``: rows another node claimed first (or took over after our lease expired);
    ``errors``: attempts whose outcome could not be written (the row is retried when its lease expires).
    """

    sent: int = 0
    retry_scheduled: int = 0
    given_up: int = 0
    lost_claims: int = 0
    errors: int = 0

    @property
    def attempted(self) -> int:
        """Confirmations this pass tried to send."""
        return self.sent + self.retry_scheduled + self.given_up
