"""A controllable subscriber for the messaging tests."""

from __future__ import annotations

import asyncio
from typing import Any

from openroute.streams.protocol import Subscriber, Subscription


class Collector(Subscriber[Any]):
    """Requests ``initial`` on subscribe and records every signal; ``request(n)`` asks for more."""

    def __init__(self, initial: int = 0) -> None:
        self.initial = initial
        self.items: list[Any] = []
        self.error: BaseException | None = None
        self.completed = False
        self.subscription: Subscription | None = None
        self._changed = asyncio.Event()

    def on_subscribe(self, subscription: Subscription) -> None:
        self.subscription = subscription
        if self.initial:
            subscription.request(self.initial)

    def on_next(self, item: Any) -> None:
        self.items.append(item)
        self._changed.set()

    def on_error(self, error: BaseException) -> None:
        self.error = error
        self._changed.set()

    def on_complete(self) -> None:
        self.completed = True
        self._changed.set()

    def request(self, n: int) -> None:
        assert self.subscription is not None
        self.subscription.request(n)

    @property
    def payloads(self) -> list[Any]:
        return [m.payload for m in self.items]

    async def wait_for(self, count: int, timeout: float = 5.0) -> None:
        """Wait until ``count`` items arrived or the stream terminated."""
        async def wait() -> None:
            while len(self.items) < count and not self.completed and self.error is None:
                self._changed.clear()
                await self._changed.wait()

        await asyncio.wait_for(wait(), timeout)

    async def wait_terminated(self, timeout: float = 5.0) -> None:
        async def wait() -> None:
            while not self.completed and self.error is None:
                self._changed.clear()
                await self._changed.wait()

        await asyncio.wait_for(wait(), timeout)
