"""The verification kit must fail on publishers and subscribers that break a rule (else its passes mean nothing)."""

from __future__ import annotations

from typing import Any
from unittest.mock import Mock

import pytest

from openroute.streams import Publisher, Subscriber, Subscription
from openroute.streams.tck import PublisherVerification, SubscriberVerification


class Broken(Publisher[int]):
    """A publisher of 1..n with one configurable defect."""

    def __init__(self, n: int, defect: str) -> None:
        self.n, self.defect = n, defect
        self.kept: list[Subscriber[int]] = []

    def subscribe(self, subscriber: Subscriber[int]) -> None:
        if subscriber is None:
            if self.defect == "accepts_none":
                return
            raise TypeError
        if self.defect == "keeps_subscriber":
            self.kept.append(subscriber)
        subscriber.on_subscribe(_BrokenSubscription(self, subscriber))


class _BrokenSubscription(Subscription):
    def __init__(self, publisher: Broken, subscriber: Subscriber[int]) -> None:
        self.p, self.s, self.next, self.cancelled = publisher, subscriber, 1, False

    def request(self, n: int) -> None:
        if self.cancelled and self.p.defect != "ignores_cancel":
            return
        if n <= 0:
            if self.p.defect != "ignores_bad_request":
                self.s.on_error(ValueError())
            return
        count = self.p.n if self.p.defect == "ignores_demand" else n
        for _ in range(count):  # recursive on purpose: request() from on_next nests (defect for rule 3.3)
            if self.next > self.p.n:
                self.s.on_complete()
                if self.p.defect != "signals_after_complete":
                    return
                continue
            item, self.next = self.next, self.next + 1
            self.s.on_next(item)
            if self.p.defect == "recursive":
                continue
            if self.cancelled and self.p.defect != "ignores_cancel":
                return

    def cancel(self) -> None:
        self.cancelled = True


@pytest.mark.parametrize(
    ("defect", "rule", "reported"),
    [
        ("ignores_demand", "rule_1_1_on_next_not_more_than_requested", "1.1"),
        ("accepts_none", "rule_1_9_subscribe_none_raises_type_error", "1.9"),
        ("ignores_bad_request", "rule_3_9_non_positive_request_signals_value_error", "3.9"),
        ("recursive", "rule_3_3_recursion_between_request_and_on_next_is_bounded", "3.3"),
        ("keeps_subscriber", "rule_3_13_cancel_drops_the_subscriber", "3.13"),
        ("ignores_cancel", "rule_3_6_request_after_cancel_is_a_no_op", "3.6"),
        ("signals_after_complete", "rule_1_6_terminal_signal_ends_the_subscription", "1.6"),
        ("signals_after_complete", "rule_1_2_may_signal_fewer_than_requested_then_complete", "1.7"),
        # on_error for request(0) is signalled at once, i.e. nested inside the on_next that asked
        ("errors_at_once", "rule_3_9_non_positive_request_from_on_next", "1.3"),
    ],
)
async def test_publisher_rule_violation_is_reported(defect: str, rule: str, reported: str) -> None:
    verification = PublisherVerification(lambda n: Broken(n, defect), timeout=0.5)
    with pytest.raises(AssertionError, match=rf"rule {reported}:"):
        await getattr(verification, rule)()


def lax_subscriber() -> Subscriber[Any]:
    """A subscriber that refuses nothing: it accepts None and never cancels a second subscription."""
    subscriber: Subscriber[Any] = Mock(spec=Subscriber)
    return subscriber


async def test_subscriber_rule_violations_are_reported() -> None:
    verification = SubscriberVerification(lax_subscriber, timeout=0.2)
    with pytest.raises(AssertionError, match=r"rule 2\.13"):
        await verification.rule_2_13_none_signals_raise_type_error()
    with pytest.raises(AssertionError, match=r"rule 2\.5"):
        await verification.rule_2_5_cancels_a_second_subscription()
