"""Clocks: the engine never calls ``datetime.now`` itself, so tests can drive time by hand."""

from __future__ import annotations

import functools
import threading
from datetime import UTC, datetime, timedelta
from typing import Protocol, runtime_checkable


@runtime_checkable
class Clock(Protocol):
    """A source of the current time."""

    def now(self) -> datetime:
        """The current time, timezone-aware, in UTC."""
        ...


class SystemClock:
    """The real wall clock."""

    #: ``now()``: the wall-clock time now, in UTC. ``datetime.now(UTC)`` itself, bound without a method of ours: the
    #: engine reads it at every accept and attempt, and a Python frame around it cost ~290 instructions a read
    now = staticmethod(functools.partial(datetime.now, UTC))


class ManualClock:
    """A clock that only moves when told to (thread-safe, since the store runs off the event loop)."""

    def __init__(self, start: datetime | None = None) -> None:
        start = start or datetime(2024, 1, 1, tzinfo=UTC)
        if start.tzinfo is None:
            raise ValueError("ManualClock needs a timezone-aware start time")
        self._now = start.astimezone(UTC)
        self._lock = threading.Lock()

    def now(self) -> datetime:
        """The clock's time: the start plus every :meth:`advance` so far."""
        with self._lock:
            return self._now

    def advance(self, delta: timedelta) -> datetime:
        """Move the clock forward by ``delta`` (never backwards) and return the new time."""
        if delta < timedelta(0):
            raise ValueError(f"a clock does not go backwards (delta {delta})")
        with self._lock:
            self._now += delta
            return self._now


def aware_datetime(value: str, error: type[Exception], not_iso: str, no_zone: str) -> datetime:
    """``value`` read as an ISO 8601 date-time with a time zone; else ``error(not_iso)`` or ``error(no_zone)``."""
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        raise error(not_iso) from None
    if parsed.tzinfo is None:
        raise error(no_zone)
    return parsed
