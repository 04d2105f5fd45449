"""The publisher-side rules (1.x and the subscription rules 3.x) of the verification kit."""

from __future__ import annotations

import asyncio
import gc
import inspect
import weakref
from collections.abc import Awaitable, Callable
from dataclasses import KW_ONLY, dataclass
from typing import Any

from ..protocol import UNBOUNDED, Publisher, Subscription
from .probes import ProbeSubscriber, RuleNotApplicable, has_subscription, has_terminated, violation


@dataclass(eq=False)
class PublisherVerification:
    """The publisher-side rules (1.x and the subscription rules 3.x) for publishers from ``make_publisher``.

    ``max_elements`` is the largest stream the factory can make (None: any size). ``make_failed_publisher``,
    when given, makes a publisher that fails after ``on_subscribe`` (rule 1.4). ``make_publisher`` may return
    an awaitable of the publisher (for sources set up with I/O). ``completes=False``: an endless source that
    emits ``n`` elements and then nothing (the rules watching for ``on_complete`` are not applicable).
    """

    make_publisher: Callable[[int], Publisher[Any] | Awaitable[Publisher[Any]]]
    _: KW_ONLY
    max_elements: int | None = None
    make_failed_publisher: Callable[[], Publisher[Any]] | None = None
    completes: bool = True
    timeout: float = 5.0
    quiet_timeout: float = 0.05

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

    async def _subscribed_probe(self, n: int) -> ProbeSubscriber:
        """A probe subscribed to a publisher of ``n`` elements, once its ``on_subscribe`` came (rule 1.9)."""
        probe = ProbeSubscriber()
        await self._subscribe(n, probe)
        await probe.wait_until(lambda: probe.subscription is not None, self.timeout, "1.9", "on_subscribe")
        return probe

    async def _ended_probe(self, n: int, probe: ProbeSubscriber, rule: str, awaited: str) -> ProbeSubscriber:
        """``probe`` subscribed to a publisher of ``n`` elements, once the stream has ended (``awaited`` names the
        terminal signal a violation of ``rule`` reports as missing)."""
        await self._subscribe(n, probe)
        await probe.wait_until(lambda: probe.terminated, self.timeout, rule, awaited)
        return probe

    async def _quiet_after_request(self, probe: ProbeSubscriber, n: int, rule: str, violated: str) -> None:
        """After the terminal signal, ``request(n)`` makes the publisher signal nothing more (else ``violated``)."""
        before = probe.signals
        probe.request(n)
        if not await probe.quiet(self.quiet_timeout, since=before):
            raise violation(rule, f"{violated} ({probe.describe()})")
        probe.check()

    async def _finish(self, probe: ProbeSubscriber) -> None:
        probe.check()
        if probe.subscription is not None and not probe.terminated:
            probe.cancel()

    async def rule_1_1_on_next_not_more_than_requested(self) -> None:
        """1.1: the number of on_next signals never exceeds the total requested."""
        n = self._size(10, at_least=4, rule="1.1")
        probe = await self._subscribed_probe(n)
        probe.request(3)
        await probe.wait_until(lambda: len(probe.items) >= 3 or probe.terminated, self.timeout, "1.1", "3 elements")
        if not await probe.quiet(self.quiet_timeout) or len(probe.items) > 3:
            raise violation("1.1", f"requested 3, got {probe.describe()}")
        probe.request(1)
        await probe.wait_until(lambda: len(probe.items) >= 4, self.timeout, "1.1", "a 4th element")
        if not await probe.quiet(self.quiet_timeout) or len(probe.items) > 4:
            raise violation("1.1", f"requested 4, got {probe.describe()}")
        await self._finish(probe)

    async def rule_1_2_may_signal_fewer_than_requested_then_complete(self) -> None:
        """1.2: a publisher with fewer elements than requested emits them and terminates."""
        n = self._size(3, at_least=0, rule="1.2", completes=True)
        probe = await self._ended_probe(n, ProbeSubscriber(request_on_subscribe=n + 10), "1.2", "on_complete")
        if probe.error is not None or len(probe.items) != n:
            raise violation("1.2", f"expected {n} elements then on_complete, got {probe.describe()}")
        await self._finish(probe)

    async def rule_1_3_signals_are_serial(self) -> None:
        """1.3: signals never overlap, even when the subscriber requests from inside on_next."""
        n = self._size(50, at_least=0, rule="1.3", completes=True)
        probe = await self._ended_probe(
            n, ProbeSubscriber(request_on_subscribe=1, request_in_on_next=1), "1.3", "on_complete")
        if probe.max_depth > 1:
            raise violation("1.3", "a signal started while another was running")
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
            raise violation("1.4", f"expected on_error, got {probe.describe()}")
        probe.check()

    async def rule_1_5_completes_after_the_last_element(self) -> None:
        """1.5: a finite stream signals on_complete after its last element (the TCK asks for one more to see it)."""
        n = self._size(5, at_least=0, rule="1.5", completes=True)
        probe = await self._ended_probe(n, ProbeSubscriber(request_on_subscribe=n + 1), "1.5", "on_complete")
        if not probe.completed or len(probe.items) != n:
            raise violation("1.5", f"expected {n} elements then on_complete, got {probe.describe()}")
        await self._finish(probe)

    async def rule_1_5_empty_stream_completes(self) -> None:
        """1.5 / 2.9: an empty stream signals on_complete (the TCK asks for one element to see it)."""
        probe = await self._ended_probe(
            self._size(0, at_least=0, rule="1.5", completes=True), ProbeSubscriber(request_on_subscribe=1), "1.5",
            "on_complete")
        if not probe.completed or probe.items:
            raise violation("1.5", f"expected on_complete only, got {probe.describe()}")
        await self._finish(probe)

    async def rule_1_6_terminal_signal_ends_the_subscription(self) -> None:
        """1.6 / 1.7: after on_complete the subscription is over; further requests signal nothing."""
        n = self._size(2, at_least=0, rule="1.6", completes=True)
        probe = await self._ended_probe(n, ProbeSubscriber(request_on_subscribe=n + 1), "1.6", "on_complete")
        await self._quiet_after_request(probe, 5, "1.6", "signal after the terminal signal")

    async def rule_1_7_no_signals_after_on_error(self) -> None:
        """1.7: nothing follows on_error, whatever the subscriber requests afterwards."""
        if self.make_failed_publisher is None:
            raise RuleNotApplicable("rule 1.7 (after on_error) does not apply: this publisher cannot fail after "
                                    "on_subscribe (no make_failed_publisher; the spec TCK skips it the same way)")
        probe = ProbeSubscriber(request_on_subscribe=10)
        self.make_failed_publisher().subscribe(probe)
        await probe.wait_until(lambda: probe.terminated, self.timeout, "1.7", "on_error")
        await self._quiet_after_request(probe, 10, "1.7", "signal after on_error")

    async def rule_1_9_on_subscribe_comes_first(self) -> None:
        """1.9: on_subscribe is the first signal, exactly once."""
        n = self._size(3, at_least=0, rule="1.9", completes=True)
        probe = await self._ended_probe(n, ProbeSubscriber(request_on_subscribe=n + 1), "1.9", "the stream to end")
        if probe.on_subscribe_calls != 1:
            raise violation("1.9", f"on_subscribe called {probe.on_subscribe_calls} times")
        await self._finish(probe)

    async def rule_1_9_subscribe_none_raises_type_error(self) -> None:
        """1.9: subscribe(None) raises TypeError (Java: NullPointerException)."""
        publisher = await self._make(self._size(1, at_least=0, rule="1.9"))
        try:
            publisher.subscribe(None)  # type: ignore[arg-type]
        except TypeError:
            return
        raise violation("1.9", "subscribe(None) did not raise TypeError")

    async def rule_1_11_each_subscriber_gets_on_subscribe(self) -> None:
        """1.11: with two subscribers, each gets on_subscribe and a well-formed stream (unicast: an error)."""
        n = self._size(3, at_least=0, rule="1.11", completes=True)
        publisher = await self._make(n)
        first, second = ProbeSubscriber(request_on_subscribe=n + 1), ProbeSubscriber(request_on_subscribe=n + 1)
        publisher.subscribe(first)
        publisher.subscribe(second)
        for probe in (first, second):
            await probe.wait_until(has_terminated(probe), self.timeout, "1.11", "the stream to end")
            if probe.on_subscribe_calls != 1:
                raise violation("1.11", "a subscriber did not get exactly one on_subscribe")
            probe.check()

    async def rule_3_2_request_from_on_next_is_allowed(self) -> None:
        """3.2: request may be called synchronously from on_next."""
        n = self._size(10, rule="3.2", completes=True)
        probe = await self._ended_probe(
            n, ProbeSubscriber(request_on_subscribe=1, request_in_on_next=1), "3.2", "on_complete")
        if not probe.completed or len(probe.items) != n:
            raise violation("3.2", f"expected {n} elements then on_complete, got {probe.describe()}")
        await self._finish(probe)

    async def rule_3_3_recursion_between_request_and_on_next_is_bounded(self) -> None:
        """3.3: requesting one element at a time from on_next does not nest on_next calls."""
        n = self._size(2000, rule="3.3", completes=True)
        probe = ProbeSubscriber(request_on_subscribe=1, request_in_on_next=1)
        try:
            await self._subscribe(n, probe)
        except RecursionError as error:
            raise violation("3.3", "the stack overflowed") from error
        await probe.wait_until(lambda: probe.terminated or probe.max_depth > 1, self.timeout, "3.3", "on_complete")
        if probe.max_depth > 1:
            raise violation("3.3", f"on_next nested {probe.max_depth} deep")
        if not probe.completed:
            raise violation("3.3", f"expected completion, got {probe.describe()}")
        await self._finish(probe)

    async def rule_3_6_request_after_cancel_is_a_no_op(self) -> None:
        """3.6: after cancel, request signals nothing."""
        n = self._size(10, at_least=0, rule="3.6")
        probe = await self._subscribed_probe(n)
        before = probe.signals
        probe.cancel()
        probe.request(5)
        if not await probe.quiet(self.quiet_timeout, since=before) or probe.items:
            raise violation("3.6", f"signals after cancel ({probe.describe()})")
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
            raise violation("3.7", f"signals after cancel ({probe.describe()})")
        probe.check()

    async def rule_3_8_demand_accumulates_while_not_cancelled(self) -> None:
        """3.8: separate requests add up; the publisher delivers their sum."""
        n = self._size(10, at_least=6, rule="3.8")
        probe = await self._subscribed_probe(n)
        probe.request(2)
        probe.request(3)
        await probe.wait_until(lambda: len(probe.items) >= 5, self.timeout, "3.8", "5 elements for 2 + 3 requested")
        if not await probe.quiet(self.quiet_timeout) or len(probe.items) != 5:
            raise violation("3.8", f"requested 2 + 3, got {probe.describe()}")
        await self._finish(probe)

    async def rule_3_9_non_positive_request_signals_value_error(self) -> None:
        """3.9: request(0) and request(-1) make the publisher signal on_error(ValueError)."""
        n = self._size(10, rule="3.9")
        for bad in (0, -1):
            probe = ProbeSubscriber()
            await self._subscribe(n, probe)
            await probe.wait_until(has_subscription(probe), self.timeout, "1.9", "on_subscribe")
            probe.request(bad)
            await probe.wait_until(has_terminated(probe), self.timeout, "3.9", f"on_error after request({bad})")
            if not isinstance(probe.error, ValueError):
                raise violation("3.9", f"request({bad}) gave {probe.describe()} instead of on_error(ValueError)")
            probe.check()

    async def rule_3_9_non_positive_request_from_on_next(self) -> None:
        """3.9 with 1.3: request(0) from inside on_next still gives a serial on_error(ValueError)."""
        n = self._size(10, at_least=2, rule="3.9")
        probe = await self._ended_probe(
            n, ProbeSubscriber(request_on_subscribe=1, request_in_on_next=0), "3.9", "on_error after request(0)")
        if not isinstance(probe.error, ValueError):
            raise violation("3.9", f"request(0) in on_next gave {probe.describe()}")
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
            raise violation("3.12", f"the stream went on after cancel ({probe.describe()})")
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
                    raise violation("3.13", "the subscriber is still referenced after cancel")
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
        probe = await self._ended_probe(n, ProbeSubscriber(request_on_subscribe=n + 1), "3.16", "the stream to end")
        calls: tuple[Callable[[], None], ...] = (
            lambda: probe.request(1), probe.cancel, lambda: probe.request(UNBOUNDED), probe.cancel)
        for call in calls:
            try:
                call()
            except Exception as error:
                raise violation("3.15/3.16", f"request/cancel raised {error!r}") from error
        probe.check()

    async def rule_3_17_demand_is_capped_at_unbounded(self) -> None:
        """3.17: demand summing past 2**63-1 is treated as unbounded, not as an error."""
        n = self._size(20, at_least=0, rule="3.17", completes=True)
        probe = await self._subscribed_probe(n)
        probe.request(UNBOUNDED - 1)
        probe.request(UNBOUNDED)
        probe.request(UNBOUNDED)
        await probe.wait_until(lambda: probe.terminated, self.timeout, "3.17", "on_complete")
        if not probe.completed or len(probe.items) != n:
            raise violation("3.17", f"expected {n} elements then on_complete, got {probe.describe()}")
        probe.check()

