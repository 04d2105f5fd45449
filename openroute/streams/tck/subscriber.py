"""The subscriber rules (2.x) of the verification kit."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import KW_ONLY, dataclass
from typing import Any

from ..protocol import Subscriber
from .probes import ProbeSubscription, RuleNotApplicable, violation, wait_on_subscription


@dataclass(eq=False)
class SubscriberVerification:
    """The subscriber rules (2.x) for subscribers from ``make_subscriber()``, driven by a probe subscription.

    ``requests_on_subscribe``: the subscriber asks for elements by itself (rule 2.1 is then checked).
    """

    make_subscriber: Callable[[], Subscriber[Any]]
    _: KW_ONLY
    requests_on_subscribe: bool = True
    timeout: float = 5.0

    async def rule_2_1_requests_before_receiving(self) -> None:
        """2.1: the subscriber signals demand before it expects elements."""
        if not self.requests_on_subscribe:
            raise RuleNotApplicable("rule 2.1 does not apply: this subscriber requests only when told to")
        subscriber = self.make_subscriber()
        probe = ProbeSubscription()
        subscriber.on_subscribe(probe)
        await wait_on_subscription(
            probe, lambda: probe.requested > 0 or probe.cancelled, self.timeout, "2.1", "a request")

    async def rule_2_5_cancels_a_second_subscription(self) -> None:
        """2.5: on_subscribe while already subscribed cancels the new subscription."""
        subscriber = self.make_subscriber()
        first, second = ProbeSubscription(), ProbeSubscription()
        subscriber.on_subscribe(first)
        subscriber.on_subscribe(second)
        await wait_on_subscription(
            second, lambda: second.cancelled, self.timeout, "2.5", "the second subscription cancelled")
        if first.cancelled and not second.cancelled:
            raise violation("2.5", "cancelled the active subscription instead of the new one")

    async def rule_2_8_accepts_elements_after_cancelling(self) -> None:
        """2.8: elements still arriving after the subscriber cancelled are accepted without error."""
        subscriber = self.make_subscriber()
        probe = ProbeSubscription()
        subscriber.on_subscribe(probe)
        for item in (1, 2, 3):
            if not probe.cancelled and probe.requested < item:
                break  # never push beyond the demand of a subscriber that is still active
            try:
                subscriber.on_next(item)
            except Exception as error:
                raise violation("2.8", f"on_next after cancel raised {error!r}") from error

    async def rule_2_9_on_complete_without_request(self) -> None:
        """2.9: on_complete right after on_subscribe (no request fulfilled) is accepted."""
        subscriber = self.make_subscriber()
        subscriber.on_subscribe(ProbeSubscription())
        subscriber.on_complete()
        await self._settles(subscriber, "2.9")

    async def rule_2_10_on_error_without_request(self) -> None:
        """2.10: on_error right after on_subscribe is accepted (and reported as the same object)."""
        subscriber = self.make_subscriber()
        subscriber.on_subscribe(ProbeSubscription())
        error = RuntimeError("rule 2.10 probe")
        completion = getattr(subscriber, "completion", None)
        settled_before = completion is not None and completion.done()  # e.g. a subscriber that cancels at once
        subscriber.on_error(error)
        if completion is not None and not settled_before:
            try:
                await asyncio.wait_for(asyncio.shield(completion), self.timeout)
            except RuntimeError as raised:
                if raised is not error:
                    raise violation("2.10", "completion failed with a different error object") from raised
                return
            raise violation("2.10", "completion did not fail with the error")

    async def rule_2_13_none_signals_raise_type_error(self) -> None:
        """2.13: on_subscribe(None), on_next(None) and on_error(None) raise TypeError."""
        for signal, argument in (("on_subscribe", None), ("on_next", None), ("on_error", None)):
            subscriber = self.make_subscriber()
            if signal != "on_subscribe":
                subscriber.on_subscribe(ProbeSubscription())
            try:
                getattr(subscriber, signal)(argument)
            except TypeError:
                continue
            except Exception as other:
                raise violation("2.13", f"{signal}(None) raised {other!r} instead of TypeError") from other
            raise violation("2.13", f"{signal}(None) did not raise TypeError")

    async def _settles(self, subscriber: Subscriber[Any], rule: str) -> None:
        completion = getattr(subscriber, "completion", None)
        if completion is not None:
            try:
                await asyncio.wait_for(asyncio.shield(completion), self.timeout)
            except TimeoutError as error:
                raise violation(rule, "completion did not resolve") from error

