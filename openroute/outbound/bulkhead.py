"""The bulkhead of an external system: at most ``max_concurrent_calls`` calls in flight per node, and optionally at
most ``max_calls_per_second`` call starts per node, as Resilience4j's Bulkhead and RateLimiter (or OpenHub's
throttling) do. A call over the limit waits in memory for its turn (first come, first served): it is neither failed
nor re-claimed. It spares a system that has just come back from the whole backlog at once.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from openroute.definitions.errors import ConfigurationError

__all__ = ["Bulkhead"]


class Bulkhead:
    """The limits of one system's calls on this node (None: no limit)."""

    def __init__(self, system: str, max_concurrent_calls: int | None = None,
                 max_calls_per_second: float | None = None) -> None:
        if max_concurrent_calls is not None and (isinstance(max_concurrent_calls, bool)
                                                 or not isinstance(max_concurrent_calls, int)
                                                 or max_concurrent_calls < 1):
            raise ConfigurationError(f"external system {system}: max_concurrent_calls must be an integer >= 1, "
                                     f"got {max_concurrent_calls!r}")
        if max_calls_per_second is not None and (isinstance(max_calls_per_second, bool)
                                                 or not isinstance(max_calls_per_second, int | float)
                                                 or max_calls_per_second <= 0):
            raise ConfigurationError(f"external system {system}: max_calls_per_second must be a positive number, "
                                     f"got {max_calls_per_second!r}")
        self.system = system
        self.max_concurrent_calls = max_concurrent_calls
        self.max_calls_per_second = max_calls_per_second
        self._slots = asyncio.Semaphore(max_concurrent_calls) if max_concurrent_calls else None
        self._interval = 1.0 / max_calls_per_second if max_calls_per_second else 0.0
        self._next_start = 0.0
        #: calls waiting for their turn now
        self.waiting = 0
        #: calls in flight now
        self.in_flight = 0

    @property
    def limits(self) -> bool:
        """Whether this bulkhead limits anything."""
        return self._slots is not None or self._interval > 0

    @asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        """Hold one place for a call: waits while ``max_concurrent_calls`` are in flight, then until the rate lets
        the call start."""
        self.waiting += 1
        try:
            if self._slots is not None:
                await self._slots.acquire()
            try:
                if self._interval:
                    # each start reserves the next instant the rate allows: the waits queue in arrival order
                    now = time.monotonic()
                    start = max(now, self._next_start)
                    self._next_start = start + self._interval
                    if start > now:
                        await asyncio.sleep(start - now)
            except BaseException:
                if self._slots is not None:
                    self._slots.release()
                raise
        finally:
            self.waiting -= 1
        self.in_flight += 1
        try:
            yield
        finally:
            self.in_flight -= 1
            if self._slots is not None:
                self._slots.release()
