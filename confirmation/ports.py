"""What the confirmations are given by whoever builds them (``openroute.config``, the composition root).

This package imports only the store and third-party libraries (DESIGN.md), so what it uses of the layers above
comes in as small Protocols and plain values: the span of an attempt and the traced HTTP client (the runtime's
``openroute.runtime.tracing``), the log of errors that repeat (``openroute.runtime.logs.repeated_errors``), and the
broker channels of a :class:`~openroute.confirmation.ChannelConfirmation`
(``openroute.messaging.publisher.ChannelPublisher``). Without them a confirmation makes no span, logs every traceback
and builds its HTTP client as it is.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from contextlib import AbstractContextManager
from datetime import UTC, datetime
from typing import Protocol, cast

import httpx
from openroute.confirmation.model import InvalidConfirmationError

__all__ = ["Clock", "ConfirmationSpan", "ErrorLog", "PlainErrorLog", "PrepareClient", "no_span", "now_function"]

#: what a confirmation over HTTP does to its ``httpx.AsyncClient`` first (e.g. ``tracing.propagate_from``: every
#: request carries the current span as its ``traceparent``)
PrepareClient = Callable[[httpx.AsyncClient], httpx.AsyncClient]


class ConfirmationSpan(Protocol):
    """The span of one attempt to send a confirmation, child of the message's stored ``traceparent``."""

    def __call__(self, traceparent: str | None, message_id: int, source_system: str, state: str,
                 attempt: int) -> AbstractContextManager[object]:
        """A context manager around the attempt; an exception leaving it marks the span failed."""
        ...


def no_span(traceparent: str | None, message_id: int, source_system: str, state: str,
            attempt: int) -> AbstractContextManager[object]:
    """No span (tracing is not given)."""
    return contextlib.nullcontext()


class ErrorLog(Protocol):
    """Where an unexpected error of a callback is logged, e.g. ``openroute.runtime.logs.repeated_errors`` (a traceback
    once per interval for an error that repeats)."""

    def log(self, logger: logging.Logger, message: str, *args: object, error: BaseException) -> None:
        """``logger.error(message % args)`` with ``error``."""


class PlainErrorLog:
    """Every error with its traceback."""

    def log(self, logger: logging.Logger, message: str, *args: object, error: BaseException) -> None:
        """``logger.error(message % args)`` with ``error``'s traceback."""
        logger.error(message, *args, exc_info=error)


class Clock(Protocol):
    """What the service reads the time from (e.g. ``openroute.definitions.clock.SystemClock``, or a test's clock)."""

    def now(self) -> datetime:
        """The current time, timezone-aware."""
        ...


def now_function(clock: Clock | Callable[[], datetime] | None) -> Callable[[], datetime]:
    """The function a service reads the time with: ``clock.now``, ``clock`` itself, or the UTC wall clock (None)."""
    if clock is None:
        return lambda: datetime.now(UTC)
    now = getattr(clock, "now", None)
    if callable(now):
        return cast(Callable[[], datetime], now)
    if callable(clock):
        return clock
    raise InvalidConfirmationError(f"clock must have now() or be callable, got {clock!r}")
