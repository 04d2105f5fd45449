"""The probes of the verification kit: a subscriber and a subscription that record what the other side does.

They also hold the kit's shared vocabulary: :class:`RuleNotApplicable`, the violation error, a bounded wait.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from ..protocol import UNBOUNDED, Subscriber, Subscription


class RuleNotApplicable(Exception):
    """The rule cannot be checked for this publisher (e.g. rule 1.4 without a failing publisher factory)."""


def violation(rule: str, message: str) -> AssertionError:
    """The error a failed check raises: its message starts with the rule number."""
    return AssertionError(f"Reactive Streams rule {rule}: {message}")


async def wait_for_signal(event: asyncio.Event, condition: Callable[[], bool], timeout: float, rule: str,
                          what: Callable[[], str]) -> None:
    """Wait (bounded) until ``condition()`` holds, waking on ``event``; AssertionError naming the rule otherwise."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not condition():
        remaining = deadline - loop.time()
        if remaining <= 0:
            raise violation(rule, f"timed out after {timeout}s waiting for {what()}")
        event.clear()
        try:
            await asyncio.wait_for(event.wait(), remaining)
        except TimeoutError:
            pass


class ProbeSubscriber(Subscriber[Any]):
    """Records every signal and every protocol violation it can see from the subscriber side.

    ``request_on_subscribe`` is requested in ``on_subscribe``; ``request_in_on_next`` after every element
    (synchronously, from inside ``on_next``; 0 or less to provoke rule 3.9 there); ``cancel_after`` cancels from
    inside ``on_next`` after that many elements.
    """

    def __init__(
        self,
        request_on_subscribe: int = 0,
        request_in_on_next: int | None = None,
        cancel_after: int | None = None,
    ) -> None:
        self.subscription: Subscription | None = None
        self.items: list[Any] = []
        self.error: BaseException | None = None
        self.completed = False
        self.signals = 0
        self.on_subscribe_calls = 0
        self.violations: list[str] = []
        self.depth = 0
        self.max_depth = 0
        self._request_on_subscribe = request_on_subscribe
        self._request_in_on_next = request_in_on_next
        self._cancel_after = cancel_after
        self._event = asyncio.Event()

    @property
    def terminated(self) -> bool:
        """True once on_error or on_complete arrived."""
        return self.completed or self.error is not None

    def _enter(self, name: str) -> None:
        self.signals += 1
        # Elements emitted from inside on_subscribe are allowed: they answer the subscriber's own request there
        # (rule 3.2), so on_subscribe does not count as a running signal.
        if self.depth and name != "on_subscribe":
            self.violations.append(f"1.3: {name} signalled while another signal was still running")
        self.depth += 1
        self.max_depth = max(self.max_depth, self.depth)
        if self.terminated:
            self.violations.append(f"1.7: {name} after a terminal signal")
        if name != "on_subscribe" and self.on_subscribe_calls == 0:
            self.violations.append(f"1.9: {name} before on_subscribe")
        self._event.set()

    def on_subscribe(self, subscription: Subscription) -> None:
        """Record the subscription and request ``request_on_subscribe``; a second one is a 1.9/2.5 violation and is
        cancelled."""
        self._enter("on_subscribe")
        self.depth -= 1
        try:
            self.on_subscribe_calls += 1
            if subscription is None:
                self.violations.append("2.13: on_subscribe(None)")
            if self.on_subscribe_calls > 1:
                self.violations.append("1.9/2.5: on_subscribe called twice")
                subscription.cancel()
                return
            self.subscription = subscription
            if self._request_on_subscribe:
                subscription.request(self._request_on_subscribe)
        finally:
            pass

    def on_next(self, item: Any) -> None:
        """Record the element, then cancel after ``cancel_after`` elements or request ``request_in_on_next``; a ``None``
        element is a 2.13 violation, a signal out of order a 1.3, 1.7 or 1.9 one."""
        self._enter("on_next")
        try:
            if item is None:
                self.violations.append("2.13: on_next(None)")
            self.items.append(item)
            assert self.subscription is not None  # noqa: S101  the TCK's own checks: asserting is its job
            if self._cancel_after is not None and len(self.items) >= self._cancel_after:
                self.subscription.cancel()
            elif self._request_in_on_next is not None:
                self.subscription.request(self._request_in_on_next)
        finally:
            self.depth -= 1

    def on_error(self, error: BaseException) -> None:
        """Record the error; a ``None`` error is a 2.13 violation, a signal out of order a 1.3, 1.7 or 1.9 one."""
        self._enter("on_error")
        try:
            if error is None:
                self.violations.append("2.13: on_error(None)")
            self.error = error
        finally:
            self.depth -= 1

    def on_complete(self) -> None:
        """Record the completion; a signal out of order is a 1.3, 1.7 or 1.9 violation."""
        self._enter("on_complete")
        try:
            self.completed = True
        finally:
            self.depth -= 1

    def request(self, n: int) -> None:
        """Request through the current subscription."""
        assert self.subscription is not None, "no subscription yet"  # noqa: S101  the TCK's own checks: asserting is its job
        self.subscription.request(n)

    def cancel(self) -> None:
        """Cancel the current subscription."""
        assert self.subscription is not None, "no subscription yet"  # noqa: S101  the TCK's own checks: asserting is its job
        self.subscription.cancel()

    async def wait_until(self, condition: Callable[[], bool], timeout: float, rule: str, what: str) -> None:
        """Wait (bounded) until ``condition()`` holds; AssertionError naming the rule otherwise."""
        await wait_for_signal(self._event, condition, timeout, rule, lambda: f"{what} ({self.describe()})")

    async def quiet(self, timeout: float, since: int | None = None) -> bool:
        """True when no signal arrives within ``timeout`` (nor since the signal count ``since``)."""
        before = self.signals if since is None else since
        self._event.clear()
        try:
            await asyncio.wait_for(self._event.wait(), timeout)
        except TimeoutError:
            pass
        return self.signals == before

    def check(self) -> None:
        """Raise for any violation recorded so far."""
        if self.violations:
            rule, _, message = self.violations[0].partition(": ")
            raise violation(rule, message)

    def describe(self) -> str:
        """A short account of what was received."""
        state = "completed" if self.completed else f"failed with {self.error!r}" if self.error else "running"
        return f"{len(self.items)} elements, {state}"


def has_terminated(probe: ProbeSubscriber) -> Callable[[], bool]:
    """The condition "the probe got on_error or on_complete", for :meth:`ProbeSubscriber.wait_until`."""
    return lambda: probe.terminated


def has_subscription(probe: ProbeSubscriber) -> Callable[[], bool]:
    """The condition "the probe got on_subscribe", for :meth:`ProbeSubscriber.wait_until`."""
    return lambda: probe.subscription is not None


class ProbeSubscription(Subscription):
    """Upstream stand-in that records what a subscriber asks for."""

    def __init__(self) -> None:
        self.requested = 0
        self.requests: list[int] = []
        self.cancelled = False
        self.event = asyncio.Event()

    def request(self, n: int) -> None:
        """Record ``n`` in :attr:`requests`; a positive ``n`` adds to :attr:`requested` (capped at UNBOUNDED)."""
        self.requests.append(n)
        if n > 0:
            self.requested = min(self.requested + n, UNBOUNDED)
        self.event.set()

    def cancel(self) -> None:
        """Record the cancel in :attr:`cancelled`."""
        self.cancelled = True
        self.event.set()


async def wait_on_subscription(probe: ProbeSubscription, condition: Callable[[], bool], timeout: float, rule: str,
                               what: str) -> None:
    """Wait (bounded) until ``condition()`` holds for what the subscriber did to ``probe``."""
    await wait_for_signal(probe.event, condition, timeout, rule, lambda: what)


def rule_names(verification: object) -> list[str]:
    """The rule methods of a verification object, in rule order."""
    return sorted(name for name in dir(verification) if name.startswith("rule_"))


async def run_all(verification: object) -> list[str]:
    """Run every rule; return the names of rules not applicable here; raise on the first violation."""
    skipped = []
    for name in rule_names(verification):
        try:
            await getattr(verification, name)()
        except RuleNotApplicable:
            skipped.append(name)
    return skipped
