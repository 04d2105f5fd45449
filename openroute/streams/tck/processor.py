"""The processor rules (4.x) of the verification kit, with a minimal upstream of its own."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import KW_ONLY, dataclass, field
from typing import Any

from ..protocol import UNBOUNDED, Processor, Publisher, Subscriber, Subscription, signal_end
from .probes import ProbeSubscriber, ProbeSubscription, run_all, violation, wait_on_subscription
from .publisher import PublisherVerification
from .subscriber import SubscriberVerification


@dataclass(eq=False)
class ProcessorVerification:
    """Processor rules: 4.1 (publisher and subscriber rules through the processor) and 4.2 (error handling).

    ``make_processor()`` must return a fresh processor that emits one element per element it receives.
    ``recovers``: the processor turns an upstream error into elements or completion (rule 4.2 allows it), so the
    publisher rules about failing streams are not applied through it.
    """

    make_processor: Callable[[], Processor[Any, Any]]
    _: KW_ONLY
    recovers: bool = False
    timeout: float = 5.0
    quiet_timeout: float = 0.05
    publisher_rules: PublisherVerification = field(init=False, repr=False)
    subscriber_rules: SubscriberVerification = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.publisher_rules = PublisherVerification(
            self._publisher_through_processor,
            make_failed_publisher=None if self.recovers else self._failing_through_processor,
            timeout=self.timeout,
            quiet_timeout=self.quiet_timeout,
        )
        self.subscriber_rules = SubscriberVerification(
            self._processor_with_downstream, requests_on_subscribe=True, timeout=self.timeout
        )

    def _publisher_through_processor(self, n: int) -> Publisher[Any]:
        processor = self.make_processor()
        RangePublisher(n).subscribe(processor)
        return processor

    def _failing_through_processor(self) -> Publisher[Any]:
        processor = self.make_processor()
        RangePublisher(2, fail_with=RuntimeError("upstream failure")).subscribe(processor)
        return processor

    def _processor_with_downstream(self) -> Processor[Any, Any]:
        processor = self.make_processor()
        processor.subscribe(ProbeSubscriber(request_on_subscribe=UNBOUNDED))
        return processor

    async def rule_4_1_obeys_the_publisher_rules(self) -> None:
        """4.1: as a publisher, the processor passes every publisher rule."""
        await run_all(self.publisher_rules)

    async def rule_4_1_obeys_the_subscriber_rules(self) -> None:
        """4.1: as a subscriber (with a downstream asking for everything), it passes every subscriber rule."""
        await run_all(self.subscriber_rules)

    async def rule_4_2_propagates_or_recovers_on_error(self) -> None:
        """4.2: on_error is passed downstream, or, when recovered, the upstream subscription is never used again."""
        processor = self.make_processor()
        downstream = ProbeSubscriber(request_on_subscribe=5)
        processor.subscribe(downstream)
        upstream = ProbeSubscription()
        processor.on_subscribe(upstream)
        await wait_on_subscription(upstream, lambda: upstream.requested > 0, self.timeout, "4.2", "a request upstream")
        processor.on_next(1)
        await downstream.wait_until(lambda: len(downstream.items) >= 1, self.timeout, "4.2", "the element")
        error = RuntimeError("rule 4.2 probe")
        processor.on_error(error)
        await downstream.wait_until(
            lambda: downstream.terminated or len(downstream.items) > 1, self.timeout, "4.2", "on_error downstream"
        )
        if downstream.error is None:
            requests_before = len(upstream.requests)
            downstream.request(10)
            await downstream.quiet(self.quiet_timeout)
            if len(upstream.requests) != requests_before:
                raise violation("4.2", "recovered from on_error but kept requesting from the failed upstream")
        downstream.check()


class RangePublisher(Publisher[Any]):
    """A minimal, independent, spec-conforming upstream for processor checks: 1..n, optionally then an error."""

    def __init__(self, n: int, fail_with: BaseException | None = None) -> None:
        self._n = n
        self._fail_with = fail_with

    def subscribe(self, subscriber: Subscriber[Any]) -> None:
        """Give ``subscriber`` its own run of 1..n (``None`` raises TypeError, rule 1.9)."""
        if subscriber is None:
            raise TypeError("subscriber must not be None")
        subscriber.on_subscribe(RangeSubscription(subscriber, self._n, self._fail_with))


class RangeSubscription(Subscription):
    """The subscription of :class:`RangePublisher`: emits 1..n within the demand, then completes (or fails with
    ``fail_with``)."""

    def __init__(self, subscriber: Subscriber[Any], n: int, fail_with: BaseException | None) -> None:
        self._subscriber: Subscriber[Any] | None = subscriber
        self._next = 1
        self._n = n
        self._fail_with = fail_with
        self._demand = 0
        self._emitting = False
        self._bad: int | None = None

    def request(self, n: int) -> None:
        """Add ``n`` to the demand and emit what it allows, from the outermost call only (rule 3.3); ``n <= 0`` signals
        ``on_error(ValueError)`` (rule 3.9)."""
        if self._subscriber is None:
            return
        if n <= 0:
            self._bad = n
        else:
            self._demand = min(self._demand + n, UNBOUNDED)
        if self._emitting:
            return
        self._emitting = True
        try:
            while self._subscriber is not None:
                subscriber = self._subscriber
                if self._bad is not None:
                    self._subscriber = None
                    subscriber.on_error(ValueError(f"request({self._bad})"))
                    return
                if self._next > self._n:
                    self._subscriber = None
                    signal_end(subscriber, self._fail_with)
                    return
                if self._demand == 0:
                    return
                self._demand -= 1
                item, self._next = self._next, self._next + 1
                subscriber.on_next(item)
        finally:
            self._emitting = False

    def cancel(self) -> None:
        """Stop emitting and drop the subscriber."""
        self._subscriber = None

