"""Retry policies: when a message that failed is tried again, and when it gives up; per error, when a route names
errors that get a policy of their own (:class:`ErrorPolicy`, the DSL's ``.on_error(...)``)."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum
from fnmatch import fnmatchcase

from openroute.definitions.errors import (
    BusinessError,
    CircuitOpenError,
    ConfigurationError,
    TechnicalError,
    ValidationError,
)


@dataclass(frozen=True)
class RetryPolicy:
    """How often and when a technically failed message is retried.

    ``max_attempts`` counts every processing attempt including the first; after the attempt that
    brings the failed count to ``max_attempts`` the message is FAILED. The delay before attempt
    ``n + 1`` after ``n`` failures is ``interval * backoff ** (n - 1)``, capped at ``max_interval``,
    then scaled by a random factor in ``[1 - jitter, 1 + jitter]`` (never above the cap).
    """

    max_attempts: int = 3
    interval: timedelta = timedelta(seconds=60)
    backoff: float = 2.0
    max_interval: timedelta = timedelta(hours=1)
    jitter: float = 0.0
    rng: random.Random = field(default_factory=random.Random, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ConfigurationError(f"max_attempts must be >= 1, got {self.max_attempts}")
        if self.interval < timedelta(0):
            raise ConfigurationError(f"interval must not be negative, got {self.interval}")
        if self.backoff < 1.0:
            raise ConfigurationError(f"backoff must be >= 1.0, got {self.backoff}")
        if self.max_interval < self.interval:
            raise ConfigurationError(f"max_interval {self.max_interval} is shorter than interval {self.interval}")
        if not 0.0 <= self.jitter < 1.0:
            raise ConfigurationError(f"jitter must be in [0, 1), got {self.jitter}")

    def exhausted(self, failed_count: int) -> bool:
        """True when a message that has failed ``failed_count`` times must not be retried."""
        return failed_count >= self.max_attempts

    def delay(self, failed_count: int) -> timedelta:
        """The wait before the next attempt of a message that has failed ``failed_count`` (>= 1) times."""
        if failed_count < 1:
            raise ValueError(f"failed_count must be >= 1, got {failed_count}")
        try:
            seconds = self.interval.total_seconds() * float(self.backoff) ** (failed_count - 1)
        except OverflowError:  # a huge exponent: the cap, not an error
            seconds = self.max_interval.total_seconds()
        seconds = min(seconds, self.max_interval.total_seconds())
        if self.jitter:
            seconds *= self.rng.uniform(1.0 - self.jitter, 1.0 + self.jitter)
            seconds = min(seconds, self.max_interval.total_seconds())
        return timedelta(seconds=seconds)

    def next_attempt(self, failed_count: int, now: datetime) -> datetime | None:
        """When to try again after ``failed_count`` failures, or None when the attempts are exhausted."""
        if self.exhausted(failed_count):
            return None
        return now + self.delay(failed_count)


DEFAULT_RETRY_POLICY = RetryPolicy()


#: error codes whose outcome the engine itself decides (engine/outcome.py): a route cannot give them a policy
ENGINE_DECIDED_CODES = frozenset({"VALIDATION_ERROR", "CALL_IN_DOUBT", "CIRCUIT_OPEN", "PROCESSING_ABANDONED"})
#: error classes whose outcome the engine itself decides (a call held in doubt is decided by its code)
_ENGINE_DECIDED_CLASSES = (ValidationError, CircuitOpenError)


class ErrorAction(StrEnum):
    """What happens to a message whose attempt ended with an error an :class:`ErrorPolicy` names."""

    #: tried again per the policy's ``retry`` (the route's own policy when it has none): a technical error
    RETRY = "retry"
    #: never retried: FAILED after this attempt, kept as the technical error it is (failed count + 1)
    NEVER_RETRY = "never_retry"
    #: FAILED at once as a business error: kept in the message's business errors for the confirmation
    FAIL = "fail"


def error_code(error: BaseException) -> str:
    """The code an error is stored and matched under: the ``code`` of a business or technical error, else the
    name of its class (e.g. ``KeyError``)."""
    if isinstance(error, BusinessError | TechnicalError):
        return error.code
    return type(error).__name__


@dataclass(frozen=True)
class ErrorPolicy:
    """A route's policy for the errors it names (``.on_error(...)`` in the DSL; Camel's ``onException``).

    ``codes`` are error codes (``TIMEOUT``, ``HTTP_503``) or shell-style patterns of them (``HTTP_5*``, matched
    case-sensitively against :func:`error_code`); ``exceptions`` are exception classes (an instance of a subclass
    matches). ``action`` says what happens (:class:`ErrorAction`); ``retry`` is the policy of
    :attr:`ErrorAction.RETRY` (None: the route's own). The errors the engine decides itself (a validation error, an
    open circuit breaker, a call in doubt, a dead node: :data:`ENGINE_DECIDED_CODES`) cannot be named.

    Raises ConfigurationError for a policy that cannot work (no error named, a blank code, a class that is not an
    exception, a ``retry`` with another action).
    """

    codes: tuple[str, ...] = ()
    exceptions: tuple[type[BaseException], ...] = ()
    action: ErrorAction = ErrorAction.RETRY
    retry: RetryPolicy | None = None

    def __post_init__(self) -> None:
        codes, exceptions = tuple(self.codes), tuple(self.exceptions)
        object.__setattr__(self, "codes", codes)
        object.__setattr__(self, "exceptions", exceptions)
        if not codes and not exceptions:
            raise ConfigurationError("on_error needs at least one error code or exception class")
        for code in codes:
            if not isinstance(code, str) or not code.strip() or code != code.strip():
                raise ConfigurationError(f"on_error: an error code must be a non-empty string without surrounding "
                                         f"spaces, got {code!r}")
            if code in ENGINE_DECIDED_CODES:
                raise ConfigurationError(f"on_error: {code} is decided by the engine itself (docs/routes.md)")
        for kind in exceptions:
            if not (isinstance(kind, type) and issubclass(kind, BaseException)):
                raise ConfigurationError(f"on_error: {kind!r} is neither an error code nor an exception class")
            if issubclass(kind, _ENGINE_DECIDED_CLASSES):
                raise ConfigurationError(f"on_error: {kind.__name__} is decided by the engine itself (docs/routes.md)")
        if self.action not in tuple(ErrorAction):
            raise ConfigurationError(f"on_error: action must be one of {[a.value for a in ErrorAction]}, "
                                     f"got {self.action!r}")
        object.__setattr__(self, "action", ErrorAction(self.action))
        if self.retry is not None and (self.action is not ErrorAction.RETRY or not isinstance(self.retry, RetryPolicy)):
            raise ConfigurationError(f"on_error: retry must be a RetryPolicy of the action 'retry', got {self.retry!r}")

    @property
    def names(self) -> tuple[str, ...]:
        """The codes and the class names this policy names, as written."""
        return (*self.codes, *(kind.__name__ for kind in self.exceptions))

    def matches(self, error: BaseException) -> bool:
        """Does this policy name ``error`` (its class, or its code by one of the patterns)?"""
        if self.exceptions and isinstance(error, self.exceptions):
            return True
        code = error_code(error)
        return any(fnmatchcase(code, pattern) for pattern in self.codes)


def policy_for(error: BaseException, policies: Sequence[ErrorPolicy]) -> ErrorPolicy | None:
    """The first of ``policies`` (in the order the route declares them) that names ``error``, else None."""
    for policy in policies:
        if policy.matches(error):
            return policy
    return None


def check_error_policies(policies: Sequence[ErrorPolicy], business_exceptions: Sequence[type[BaseException]] = ()
                         ) -> list[str]:
    """The problems of a route's error policies taken together: a code or class named twice, a class that is also
    one of the route's business exceptions (empty when there are none)."""
    problems: list[str] = []
    seen: set[str | type[BaseException]] = set()
    for policy in policies:
        if not isinstance(policy, ErrorPolicy):
            problems.append(f"error_policies must be ErrorPolicy objects, got {policy!r}")
            continue
        named: tuple[str | type[BaseException], ...] = (*policy.codes, *policy.exceptions)
        for name in named:
            if name in seen:
                problems.append(f"on_error: {name if isinstance(name, str) else name.__name__} is named twice")
            seen.add(name)
        for kind in policy.exceptions:
            if any(issubclass(kind, business) for business in business_exceptions):
                problems.append(f"on_error: {kind.__name__} is also a business exception (on_business_error): "
                                "give it one of the two")
    return problems
