"""A verification kit for Reactive Streams implementations, in the spirit of the spec's TCK (plain asyncio).

Pass it a factory and it checks every applicable rule; a failed check raises :class:`AssertionError` whose
message starts with the rule number::

    from openroute.streams.tck import verify_publisher
    await verify_publisher(lambda n: MyPublisher(range(n)))

``make_publisher(n)`` must return a fresh publisher of exactly ``n`` elements followed by completion. Each
rule is also a method of :class:`PublisherVerification` / :class:`SubscriberVerification` /
:class:`ProcessorVerification` named after it (``rule_1_9_...``), so a test suite can run one rule per test.

Waits are bounded by ``timeout``. Checks that something does *not* happen (rule 1.1: no element beyond the
demand) wait ``quiet_timeout`` for a signal that must not come.
"""

from __future__ import annotations

import asyncio
import gc
import inspect
import weakref
from collections.abc import Awaitable, Callable
from typing import Any

from .protocol import UNBOUNDED, Processor, Publisher, Subscriber, Subscription


class RuleNotApplicable(Exception):
    """The rule cannot be checked for this publisher (e.g. rule 1.4 without a failing publisher factory)."""


def _violation(rule: str, message: str) -> AssertionError:
    return AssertionError(f"Reactive Streams rule {rule}: {message}")


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
        self._enter("on_error")
        try:
            if error is None:
                self.violations.append("2.13: on_error(None)")
            self.error = error
        finally:
            self.depth -= 1

    def on_complete(self) -> None:
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
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while not condition():
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise _violation(rule, f"timed out after {timeout}s waiting for {what} ({self.describe()})")
            self._event.clear()
            try:
                await asyncio.wait_for(self._event.wait(), remaining)
            except TimeoutError:
                pass

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
            raise _violation(rule, message)

    def describe(self) -> str:
        """A short account of what was received."""
        state = "completed" if self.completed else f"failed with {self.error!r}" if self.error else "running"
        return f"{len(self.items)} elements, {state}"


def _terminated(probe: ProbeSubscriber) -> Callable[[], bool]:
    return lambda: probe.terminated


def _subscribed(probe: ProbeSubscriber) -> Callable[[], bool]:
    return lambda: probe.subscription is not None


class _ProbeSubscription(Subscription):
    """Upstream stand-in that records what a subscriber asks for."""

    def __init__(self) -> None:
        self.requested = 0
        self.requests: list[int] = []
        self.cancelled = False
        self.event = asyncio.Event()

    def request(self, n: int) -> None:
        self.requests.append(n)
        if n > 0:
            self.requested = min(self.requested + n, UNBOUNDED)
        self.event.set()

    def cancel(self) -> None:
        self.cancelled = True
        self.event.set()


async def _wait_probe(probe: _ProbeSubscription, condition: Callable[[], bool], timeout: float, rule: str,
                      what: str) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not condition():
        remaining = deadline - loop.time()
        if remaining <= 0:
            raise _violation(rule, f"timed out after {timeout}s waiting for {what}")
        probe.event.clear()
        try:
            await asyncio.wait_for(probe.event.wait(), remaining)
        except TimeoutError:
            pass


class PublisherVerification:
    """The publisher-side rules (1.x and the subscription rules 3.x) for publishers from ``make_publisher``.

    ``max_elements`` is the largest stream the factory can make (None: any size). ``make_failed_publisher``,
    when given, makes a publisher that fails after ``on_subscribe`` (rule 1.4). ``make_publisher`` may return
    an awaitable of the publisher (for sources set up with I/O). ``completes=False``: an endless source that
    emits ``n`` elements and then nothing (the rules watching for ``on_complete`` are not applicable).
    """

    def __init__(
        self,
        make_publisher: Callable[[int], Publisher[Any] | Awaitable[Publisher[Any]]],
        *,
        max_elements: int | None = None,
        make_failed_publisher: Callable[[], Publisher[Any]] | None = None,
        completes: bool = True,
        timeout: float = 5.0,
        quiet_timeout: float = 0.05,
    ) -> None:
        self.make_publisher = make_publisher
        self.max_elements = max_elements
        self.completes = completes
        self.make_failed_publisher = make_failed_publisher
        self.timeout = timeout
        self.quiet_timeout = quiet_timeout

    def _size(self, wanted: int, at_least: int = 1, rule: str = "", completes: bool = False) -> int:
        if completes and not self.completes:
            raise RuleNotApplicable(
                f"rule {rule} does not apply: it watches for on_complete, and this publisher never completes "
                "(an endless source; the spec TCK skips it the same way, publisherUnableToSignalOnComplete)")
        if self.max_elements is None:
            return wanted
        if self.max_elements < at_least:
            raise RuleNotApplicable(
                f"rule {rule} does not apply: it needs a publisher of at least {at_least} elements and this one "
                f"emits at most {self.max_elements} (the spec TCK skips it the same way, maxElementsFromPublisher)")
        return min(wanted, self.max_elements)

    async def _make(self, n: int) -> Publisher[Any]:
        publisher = self.make_publisher(n)
        if inspect.isawaitable(publisher):  # a source that needs I/O to set up (a broker queue, filled with n)
            publisher = await publisher
        return publisher

    async def _subscribe(self, n: int, probe: ProbeSubscriber) -> Publisher[Any]:
        publisher = await self._make(n)
        publisher.subscribe(probe)
        return publisher

    async def _finish(self, probe: ProbeSubscriber) -> None:
        probe.check()
        if probe.subscription is not None and not probe.terminated:
            probe.cancel()

    async def rule_1_1_on_next_not_more_than_requested(self) -> None:
        """1.1: the number of on_next signals never exceeds the total requested."""
        n = self._size(10, at_least=4, rule="1.1")
        probe = ProbeSubscriber()
        await self._subscribe(n, probe)
        await probe.wait_until(lambda: probe.subscription is not None, self.timeout, "1.9", "on_subscribe")
        probe.request(3)
        await probe.wait_until(lambda: len(probe.items) >= 3 or probe.terminated, self.timeout, "1.1", "3 elements")
        if not await probe.quiet(self.quiet_timeout) or len(probe.items) > 3:
            raise _violation("1.1", f"requested 3, got {probe.describe()}")
        probe.request(1)
        await probe.wait_until(lambda: len(probe.items) >= 4, self.timeout, "1.1", "a 4th element")
        if not await probe.quiet(self.quiet_timeout) or len(probe.items) > 4:
            raise _violation("1.1", f"requested 4, got {probe.describe()}")
        await self._finish(probe)

    async def rule_1_2_may_signal_fewer_than_requested_then_complete(self) -> None:
        """1.2: a publisher with fewer elements than requested emits them and terminates."""
        n = self._size(3, at_least=0, rule="1.2", completes=True)
        probe = ProbeSubscriber(request_on_subscribe=n + 10)
        await self._subscribe(n, probe)
        await probe.wait_until(lambda: probe.terminated, self.timeout, "1.2", "on_complete")
        if probe.error is not None or len(probe.items) != n:
            raise _violation("1.2", f"expected {n} elements then on_complete, got {probe.describe()}")
        await self._finish(probe)

    async def rule_1_3_signals_are_serial(self) -> None:
        """1.3: signals never overlap, even when the subscriber requests from inside on_next."""
        n = self._size(50, at_least=0, rule="1.3", completes=True)
        probe = ProbeSubscriber(request_on_subscribe=1, request_in_on_next=1)
        await self._subscribe(n, probe)
        await probe.wait_until(lambda: probe.terminated, self.timeout, "1.3", "on_complete")
        if probe.max_depth > 1:
            raise _violation("1.3", "a signal started while another was running")
        await self._finish(probe)

    async def rule_1_4_failure_is_signalled_by_on_error(self) -> None:
        """1.4: a failing publisher signals on_error (after on_subscribe)."""
        if self.make_failed_publisher is None:
            raise RuleNotApplicable("rule 1.4 does not apply: this publisher cannot fail after on_subscribe "
                                    "(no make_failed_publisher; the spec TCK skips it when createFailedPublisher "
                                    "returns null)")
        probe = ProbeSubscriber(request_on_subscribe=UNBOUNDED)
        self.make_failed_publisher().subscribe(probe)
        await probe.wait_until(lambda: probe.terminated, self.timeout, "1.4", "on_error")
        if probe.error is None:
            raise _violation("1.4", f"expected on_error, got {probe.describe()}")
        probe.check()

    async def rule_1_5_completes_after_the_last_element(self) -> None:
        """1.5: a finite stream signals on_complete after its last element (the TCK asks for one more to see it)."""
        n = self._size(5, at_least=0, rule="1.5", completes=True)
        probe = ProbeSubscriber(request_on_subscribe=n + 1)
        await self._subscribe(n, probe)
        await probe.wait_until(lambda: probe.terminated, self.timeout, "1.5", "on_complete")
        if not probe.completed or len(probe.items) != n:
            raise _violation("1.5", f"expected {n} elements then on_complete, got {probe.describe()}")
        await self._finish(probe)

    async def rule_1_5_empty_stream_completes(self) -> None:
        """1.5 / 2.9: an empty stream signals on_complete (the TCK asks for one element to see it)."""
        probe = ProbeSubscriber(request_on_subscribe=1)
        await self._subscribe(self._size(0, at_least=0, rule="1.5", completes=True), probe)
        await probe.wait_until(lambda: probe.terminated, self.timeout, "1.5", "on_complete")
        if not probe.completed or probe.items:
            raise _violation("1.5", f"expected on_complete only, got {probe.describe()}")
        await self._finish(probe)

    async def rule_1_6_terminal_signal_ends_the_subscription(self) -> None:
        """1.6 / 1.7: after on_complete the subscription is over; further requests signal nothing."""
        n = self._size(2, at_least=0, rule="1.6", completes=True)
        probe = ProbeSubscriber(request_on_subscribe=n + 1)
        await self._subscribe(n, probe)
        await probe.wait_until(lambda: probe.terminated, self.timeout, "1.6", "on_complete")
        before = probe.signals
        probe.request(5)
        if not await probe.quiet(self.quiet_timeout, since=before):
            raise _violation("1.6", f"signal after the terminal signal ({probe.describe()})")
        probe.check()

    async def rule_1_7_no_signals_after_on_error(self) -> None:
        """1.7: nothing follows on_error, whatever the subscriber requests afterwards."""
        if self.make_failed_publisher is None:
            raise RuleNotApplicable("rule 1.7 (after on_error) does not apply: this publisher cannot fail after "
                                    "on_subscribe (no make_failed_publisher; the spec TCK skips it the same way)")
        probe = ProbeSubscriber(request_on_subscribe=10)
        self.make_failed_publisher().subscribe(probe)
        await probe.wait_until(lambda: probe.terminated, self.timeout, "1.7", "on_error")
        before = probe.signals
        probe.request(10)
        if not await probe.quiet(self.quiet_timeout, since=before):
            raise _violation("1.7", f"signal after on_error ({probe.describe()})")
        probe.check()

    async def rule_1_9_on_subscribe_comes_first(self) -> None:
        """1.9: on_subscribe is the first signal, exactly once."""
        n = self._size(3, at_least=0, rule="1.9", completes=True)
        probe = ProbeSubscriber(request_on_subscribe=n + 1)
        await self._subscribe(n, probe)
        await probe.wait_until(lambda: probe.terminated, self.timeout, "1.9", "the stream to end")
        if probe.on_subscribe_calls != 1:
            raise _violation("1.9", f"on_subscribe called {probe.on_subscribe_calls} times")
        await self._finish(probe)

    async def rule_1_9_subscribe_none_raises_type_error(self) -> None:
        """1.9: subscribe(None) raises TypeError (Java: NullPointerException)."""
        publisher = await self._make(self._size(1, at_least=0, rule="1.9"))
        try:
            publisher.subscribe(None)  # type: ignore[arg-type]
        except TypeError:
            return
        raise _violation("1.9", "subscribe(None) did not raise TypeError")

    async def rule_1_11_each_subscriber_gets_on_subscribe(self) -> None:
        """1.11: with two subscribers, each gets on_subscribe and a well-formed stream (unicast: an error)."""
        n = self._size(3, at_least=0, rule="1.11", completes=True)
        publisher = await self._make(n)
        first, second = ProbeSubscriber(request_on_subscribe=n + 1), ProbeSubscriber(request_on_subscribe=n + 1)
        publisher.subscribe(first)
        publisher.subscribe(second)
        for probe in (first, second):
            await probe.wait_until(_terminated(probe), self.timeout, "1.11", "the stream to end")
            if probe.on_subscribe_calls != 1:
                raise _violation("1.11", "a subscriber did not get exactly one on_subscribe")
            probe.check()

    async def rule_3_2_request_from_on_next_is_allowed(self) -> None:
        """3.2: request may be called synchronously from on_next."""
        n = self._size(10, rule="3.2", completes=True)
        probe = ProbeSubscriber(request_on_subscribe=1, request_in_on_next=1)
        await self._subscribe(n, probe)
        await probe.wait_until(lambda: probe.terminated, self.timeout, "3.2", "on_complete")
        if not probe.completed or len(probe.items) != n:
            raise _violation("3.2", f"expected {n} elements then on_complete, got {probe.describe()}")
        await self._finish(probe)

    async def rule_3_3_recursion_between_request_and_on_next_is_bounded(self) -> None:
        """3.3: requesting one element at a time from on_next does not nest on_next calls."""
        n = self._size(2000, rule="3.3", completes=True)
        probe = ProbeSubscriber(request_on_subscribe=1, request_in_on_next=1)
        try:
            await self._subscribe(n, probe)
        except RecursionError as error:
            raise _violation("3.3", "the stack overflowed") from error
        await probe.wait_until(lambda: probe.terminated or probe.max_depth > 1, self.timeout, "3.3", "on_complete")
        if probe.max_depth > 1:
            raise _violation("3.3", f"on_next nested {probe.max_depth} deep")
        if not probe.completed:
            raise _violation("3.3", f"expected completion, got {probe.describe()}")
        await self._finish(probe)

    async def rule_3_6_request_after_cancel_is_a_no_op(self) -> None:
        """3.6: after cancel, request signals nothing."""
        n = self._size(10, at_least=0, rule="3.6")
        probe = ProbeSubscriber()
        await self._subscribe(n, probe)
        await probe.wait_until(lambda: probe.subscription is not None, self.timeout, "1.9", "on_subscribe")
        before = probe.signals
        probe.cancel()
        probe.request(5)
        if not await probe.quiet(self.quiet_timeout, since=before) or probe.items:
            raise _violation("3.6", f"signals after cancel ({probe.describe()})")
        probe.check()

    async def rule_3_7_cancel_is_idempotent(self) -> None:
        """3.5 / 3.7: cancel may be called repeatedly; later calls do nothing."""
        n = self._size(10, at_least=2, rule="3.7")
        probe = ProbeSubscriber(request_on_subscribe=2)
        await self._subscribe(n, probe)
        await probe.wait_until(lambda: len(probe.items) >= 2, self.timeout, "3.7", "2 elements")
        before = probe.signals
        for _ in range(3):
            probe.cancel()
        if not await probe.quiet(self.quiet_timeout, since=before):
            raise _violation("3.7", f"signals after cancel ({probe.describe()})")
        probe.check()

    async def rule_3_8_demand_accumulates_while_not_cancelled(self) -> None:
        """3.8: separate requests add up; the publisher delivers their sum."""
        n = self._size(10, at_least=6, rule="3.8")
        probe = ProbeSubscriber()
        await self._subscribe(n, probe)
        await probe.wait_until(lambda: probe.subscription is not None, self.timeout, "1.9", "on_subscribe")
        probe.request(2)
        probe.request(3)
        await probe.wait_until(lambda: len(probe.items) >= 5, self.timeout, "3.8", "5 elements for 2 + 3 requested")
        if not await probe.quiet(self.quiet_timeout) or len(probe.items) != 5:
            raise _violation("3.8", f"requested 2 + 3, got {probe.describe()}")
        await self._finish(probe)

    async def rule_3_9_non_positive_request_signals_value_error(self) -> None:
        """3.9: request(0) and request(-1) make the publisher signal on_error(ValueError)."""
        n = self._size(10, rule="3.9")
        for bad in (0, -1):
            probe = ProbeSubscriber()
            await self._subscribe(n, probe)
            await probe.wait_until(_subscribed(probe), self.timeout, "1.9", "on_subscribe")
            probe.request(bad)
            await probe.wait_until(_terminated(probe), self.timeout, "3.9", f"on_error after request({bad})")
            if not isinstance(probe.error, ValueError):
                raise _violation("3.9", f"request({bad}) gave {probe.describe()} instead of on_error(ValueError)")
            probe.check()

    async def rule_3_9_non_positive_request_from_on_next(self) -> None:
        """3.9 with 1.3: request(0) from inside on_next still gives a serial on_error(ValueError)."""
        n = self._size(10, at_least=2, rule="3.9")
        probe = ProbeSubscriber(request_on_subscribe=1, request_in_on_next=0)
        await self._subscribe(n, probe)
        await probe.wait_until(lambda: probe.terminated, self.timeout, "3.9", "on_error after request(0)")
        if not isinstance(probe.error, ValueError):
            raise _violation("3.9", f"request(0) in on_next gave {probe.describe()}")
        await probe.quiet(self.quiet_timeout)
        probe.check()

    async def rule_3_12_cancel_stops_signals(self) -> None:
        """3.12: after cancel from on_next the publisher eventually stops signalling."""
        n = self._size(1000, at_least=3, rule="3.12")
        probe = ProbeSubscriber(request_on_subscribe=UNBOUNDED, cancel_after=2)
        await self._subscribe(n, probe)
        await probe.wait_until(lambda: len(probe.items) >= 2, self.timeout, "3.12", "2 elements")
        await probe.quiet(self.quiet_timeout)
        if probe.terminated or len(probe.items) >= n:
            raise _violation("3.12", f"the stream went on after cancel ({probe.describe()})")
        probe.check()

    async def rule_3_13_cancel_drops_the_subscriber(self) -> None:
        """3.13: after cancel the publisher holds no reference to the subscriber."""
        n = self._size(10, rule="3.13")
        publisher, subscription, ref = await self._subscribed_then_cancelled(n)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout
        # Cancellation of asynchronous sources completes on later loop turns; look until it has or time is up.
        # Reference counting alone frees the subscriber at once or a loop turn later; a full collection (its cost
        # grows with every object of the process) runs from the second turn on, for a subscriber in a cycle.
        turns = 0
        while ref() is not None:
            if turns:
                gc.collect()
                if ref() is None:
                    break
                if loop.time() > deadline:
                    raise _violation("3.13", "the subscriber is still referenced after cancel")
            await asyncio.sleep(0)
            turns += 1
        del publisher, subscription

    async def _subscribed_then_cancelled(
        self, n: int
    ) -> tuple[Publisher[Any], Subscription, weakref.ReferenceType[ProbeSubscriber]]:
        probe = ProbeSubscriber(request_on_subscribe=1)
        publisher = await self._subscribe(n, probe)
        await probe.wait_until(lambda: len(probe.items) >= 1, self.timeout, "3.13", "1 element")
        subscription = probe.subscription
        assert subscription is not None  # noqa: S101  the TCK's own checks: asserting is its job
        subscription.cancel()
        probe.check()
        return publisher, subscription, weakref.ref(probe)

    async def rule_3_15_and_3_16_cancel_and_request_return_normally(self) -> None:
        """3.15 / 3.16: cancel and request return normally, whatever the state of the subscription."""
        n = self._size(3, at_least=0, rule="3.15", completes=True)
        probe = ProbeSubscriber(request_on_subscribe=n + 1)
        await self._subscribe(n, probe)
        await probe.wait_until(lambda: probe.terminated, self.timeout, "3.16", "the stream to end")
        calls: tuple[Callable[[], None], ...] = (
            lambda: probe.request(1), probe.cancel, lambda: probe.request(UNBOUNDED), probe.cancel)
        for call in calls:
            try:
                call()
            except Exception as error:
                raise _violation("3.15/3.16", f"request/cancel raised {error!r}") from error
        probe.check()

    async def rule_3_17_demand_is_capped_at_unbounded(self) -> None:
        """3.17: demand summing past 2**63-1 is treated as unbounded, not as an error."""
        n = self._size(20, at_least=0, rule="3.17", completes=True)
        probe = ProbeSubscriber()
        await self._subscribe(n, probe)
        await probe.wait_until(lambda: probe.subscription is not None, self.timeout, "1.9", "on_subscribe")
        probe.request(UNBOUNDED - 1)
        probe.request(UNBOUNDED)
        probe.request(UNBOUNDED)
        await probe.wait_until(lambda: probe.terminated, self.timeout, "3.17", "on_complete")
        if not probe.completed or len(probe.items) != n:
            raise _violation("3.17", f"expected {n} elements then on_complete, got {probe.describe()}")
        probe.check()


class SubscriberVerification:
    """The subscriber rules (2.x) for subscribers from ``make_subscriber()``, driven by a probe subscription.

    ``requests_on_subscribe``: the subscriber asks for elements by itself (rule 2.1 is then checked).
    """

    def __init__(
        self,
        make_subscriber: Callable[[], Subscriber[Any]],
        *,
        requests_on_subscribe: bool = True,
        timeout: float = 5.0,
    ) -> None:
        self.make_subscriber = make_subscriber
        self.requests_on_subscribe = requests_on_subscribe
        self.timeout = timeout

    async def rule_2_1_requests_before_receiving(self) -> None:
        """2.1: the subscriber signals demand before it expects elements."""
        if not self.requests_on_subscribe:
            raise RuleNotApplicable("rule 2.1 does not apply: this subscriber requests only when told to")
        subscriber = self.make_subscriber()
        probe = _ProbeSubscription()
        subscriber.on_subscribe(probe)
        await _wait_probe(probe, lambda: probe.requested > 0 or probe.cancelled, self.timeout, "2.1", "a request")

    async def rule_2_5_cancels_a_second_subscription(self) -> None:
        """2.5: on_subscribe while already subscribed cancels the new subscription."""
        subscriber = self.make_subscriber()
        first, second = _ProbeSubscription(), _ProbeSubscription()
        subscriber.on_subscribe(first)
        subscriber.on_subscribe(second)
        await _wait_probe(second, lambda: second.cancelled, self.timeout, "2.5", "the second subscription cancelled")
        if first.cancelled and not second.cancelled:
            raise _violation("2.5", "cancelled the active subscription instead of the new one")

    async def rule_2_8_accepts_elements_after_cancelling(self) -> None:
        """2.8: elements still arriving after the subscriber cancelled are accepted without error."""
        subscriber = self.make_subscriber()
        probe = _ProbeSubscription()
        subscriber.on_subscribe(probe)
        for item in (1, 2, 3):
            if not probe.cancelled and probe.requested < item:
                break  # never push beyond the demand of a subscriber that is still active
            try:
                subscriber.on_next(item)
            except Exception as error:
                raise _violation("2.8", f"on_next after cancel raised {error!r}") from error

    async def rule_2_9_on_complete_without_request(self) -> None:
        """2.9: on_complete right after on_subscribe (no request fulfilled) is accepted."""
        subscriber = self.make_subscriber()
        subscriber.on_subscribe(_ProbeSubscription())
        subscriber.on_complete()
        await self._settles(subscriber, "2.9")

    async def rule_2_10_on_error_without_request(self) -> None:
        """2.10: on_error right after on_subscribe is accepted (and reported as the same object)."""
        subscriber = self.make_subscriber()
        subscriber.on_subscribe(_ProbeSubscription())
        error = RuntimeError("rule 2.10 probe")
        completion = getattr(subscriber, "completion", None)
        settled_before = completion is not None and completion.done()  # e.g. a subscriber that cancels at once
        subscriber.on_error(error)
        if completion is not None and not settled_before:
            try:
                await asyncio.wait_for(asyncio.shield(completion), self.timeout)
            except RuntimeError as raised:
                if raised is not error:
                    raise _violation("2.10", "completion failed with a different error object") from raised
                return
            raise _violation("2.10", "completion did not fail with the error")

    async def rule_2_13_none_signals_raise_type_error(self) -> None:
        """2.13: on_subscribe(None), on_next(None) and on_error(None) raise TypeError."""
        for signal, argument in (("on_subscribe", None), ("on_next", None), ("on_error", None)):
            subscriber = self.make_subscriber()
            if signal != "on_subscribe":
                subscriber.on_subscribe(_ProbeSubscription())
            try:
                getattr(subscriber, signal)(argument)
            except TypeError:
                continue
            except Exception as other:
                raise _violation("2.13", f"{signal}(None) raised {other!r} instead of TypeError") from other
            raise _violation("2.13", f"{signal}(None) did not raise TypeError")

    async def _settles(self, subscriber: Subscriber[Any], rule: str) -> None:
        completion = getattr(subscriber, "completion", None)
        if completion is not None:
            try:
                await asyncio.wait_for(asyncio.shield(completion), self.timeout)
            except TimeoutError as error:
                raise _violation(rule, "completion did not resolve") from error


class ProcessorVerification:
    """Processor rules: 4.1 (publisher and subscriber rules through the processor) and 4.2 (error handling).

    ``make_processor()`` must return a fresh processor that emits one element per element it receives.
    ``recovers``: the processor turns an upstream error into elements or completion (rule 4.2 allows it), so the
    publisher rules about failing streams are not applied through it.
    """

    def __init__(
        self,
        make_processor: Callable[[], Processor[Any, Any]],
        *,
        recovers: bool = False,
        timeout: float = 5.0,
        quiet_timeout: float = 0.05,
    ) -> None:
        self.make_processor = make_processor
        self.timeout = timeout
        self.quiet_timeout = quiet_timeout
        self.publisher_rules = PublisherVerification(
            self._publisher_through_processor,
            make_failed_publisher=None if recovers else self._failing_through_processor,
            timeout=timeout,
            quiet_timeout=quiet_timeout,
        )
        self.subscriber_rules = SubscriberVerification(
            self._processor_with_downstream, requests_on_subscribe=True, timeout=timeout
        )

    def _publisher_through_processor(self, n: int) -> Publisher[Any]:
        processor = self.make_processor()
        _RangePublisher(n).subscribe(processor)
        return processor

    def _failing_through_processor(self) -> Publisher[Any]:
        processor = self.make_processor()
        _RangePublisher(2, fail_with=RuntimeError("upstream failure")).subscribe(processor)
        return processor

    def _processor_with_downstream(self) -> Processor[Any, Any]:
        processor = self.make_processor()
        processor.subscribe(ProbeSubscriber(request_on_subscribe=UNBOUNDED))
        return processor

    async def rule_4_1_obeys_the_publisher_rules(self) -> None:
        """4.1: as a publisher, the processor passes every publisher rule."""
        await _run_all(self.publisher_rules)

    async def rule_4_1_obeys_the_subscriber_rules(self) -> None:
        """4.1: as a subscriber (with a downstream asking for everything), it passes every subscriber rule."""
        await _run_all(self.subscriber_rules)

    async def rule_4_2_propagates_or_recovers_on_error(self) -> None:
        """4.2: on_error is passed downstream, or, when recovered, the upstream subscription is never used again."""
        processor = self.make_processor()
        downstream = ProbeSubscriber(request_on_subscribe=5)
        processor.subscribe(downstream)
        upstream = _ProbeSubscription()
        processor.on_subscribe(upstream)
        await _wait_probe(upstream, lambda: upstream.requested > 0, self.timeout, "4.2", "a request upstream")
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
                raise _violation("4.2", "recovered from on_error but kept requesting from the failed upstream")
        downstream.check()


class _RangePublisher(Publisher[Any]):
    """A minimal, independent, spec-conforming upstream for processor checks: 1..n, optionally then an error."""

    def __init__(self, n: int, fail_with: BaseException | None = None) -> None:
        self._n = n
        self._fail_with = fail_with

    def subscribe(self, subscriber: Subscriber[Any]) -> None:
        if subscriber is None:
            raise TypeError("subscriber must not be None")
        subscriber.on_subscribe(_RangeSubscription(subscriber, self._n, self._fail_with))


class _RangeSubscription(Subscription):
    def __init__(self, subscriber: Subscriber[Any], n: int, fail_with: BaseException | None) -> None:
        self._subscriber: Subscriber[Any] | None = subscriber
        self._next = 1
        self._n = n
        self._fail_with = fail_with
        self._demand = 0
        self._emitting = False
        self._bad: int | None = None

    def request(self, n: int) -> None:
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
                    if self._fail_with is not None:
                        subscriber.on_error(self._fail_with)
                    else:
                        subscriber.on_complete()
                    return
                if self._demand == 0:
                    return
                self._demand -= 1
                item, self._next = self._next, self._next + 1
                subscriber.on_next(item)
        finally:
            self._emitting = False

    def cancel(self) -> None:
        self._subscriber = None


def rule_names(verification: object) -> list[str]:
    """The rule methods of a verification object, in rule order."""
    return sorted(name for name in dir(verification) if name.startswith("rule_"))


async def _run_all(verification: object) -> list[str]:
    """Run every rule; return the names of rules not applicable here; raise on the first violation."""
    skipped = []
    for name in rule_names(verification):
        try:
            await getattr(verification, name)()
        except RuleNotApplicable:
            skipped.append(name)
    return skipped


async def verify_publisher(
    make_publisher: Callable[[int], Publisher[Any] | Awaitable[Publisher[Any]]],
    *,
    max_elements: int | None = None,
    make_failed_publisher: Callable[[], Publisher[Any]] | None = None,
    completes: bool = True,
    timeout: float = 5.0,
) -> list[str]:
    """Check every publisher rule; returns the rules that did not apply, raises AssertionError on a violation."""
    return await _run_all(
        PublisherVerification(
            make_publisher, max_elements=max_elements, make_failed_publisher=make_failed_publisher,
            completes=completes, timeout=timeout,
        )
    )


async def verify_subscriber(
    make_subscriber: Callable[[], Subscriber[Any]], *, requests_on_subscribe: bool = True, timeout: float = 5.0
) -> list[str]:
    """Check every subscriber rule; returns the rules that did not apply, raises AssertionError on a violation."""
    return await _run_all(
        SubscriberVerification(make_subscriber, requests_on_subscribe=requests_on_subscribe, timeout=timeout)
    )


async def verify_processor(
    make_processor: Callable[[], Processor[Any, Any]], *, recovers: bool = False, timeout: float = 5.0
) -> list[str]:
    """Check the processor rules (4.1 through every publisher and subscriber rule, 4.2); raises AssertionError."""
    return await _run_all(ProcessorVerification(make_processor, recovers=recovers, timeout=timeout))
