"""Processors for the operator stages.

Every processor here accepts its downstream subscriber and its upstream subscription in either order: demand
and cancellation that arrive before the upstream are held and replayed, a terminal signal that arrives before
the downstream is held and delivered right after its ``on_subscribe``.
"""

from __future__ import annotations

import asyncio
from typing import Any

from . import stages as st
from .fusion import DROP, FILTER, MAP, Stop, none_element_error, plan
from .protocol import (
    NOOP_SUBSCRIPTION,
    UNBOUNDED,
    Processor,
    Subscriber,
    Subscription,
    add_demand,
    cancel_if_any,
    refuse_none,
    signal_end,
)
from .sources import check_subscriber


class _CancelledUpstream(Subscription):
    """Stands in for the upstream after cancellation, so late requests are no-ops (rule 3.6)."""

    def request(self, n: int) -> None:
        pass

    def cancel(self) -> None:
        pass


CANCELLED_UPSTREAM = _CancelledUpstream()


class BaseProcessor(Processor[Any, Any], Subscription):
    """One upstream, one downstream; the processor is itself the downstream's subscription."""

    def __init__(self) -> None:
        self._upstream: Subscription | None = None
        self._downstream: Subscriber[Any] | None = None
        self._subscribed = False
        self._requested = 0
        self._bad_request: int | None = None
        self._cancelled = False
        self._terminated = False
        self._held: tuple[BaseException | None] | None = None

    # --- publisher side -----------------------------------------------------------------------------------
    def subscribe(self, subscriber: Subscriber[Any]) -> None:
        """Accept the one downstream (a second one gets ``on_error``, rule 1.11; ``None`` raises TypeError, rule 1.9); a
        terminal signal held before it came follows its ``on_subscribe``."""
        check_subscriber(subscriber)
        if self._subscribed:
            subscriber.on_subscribe(NOOP_SUBSCRIPTION)
            subscriber.on_error(RuntimeError("this processor already has a subscriber (rule 1.11: unicast)"))
            return
        self._subscribed = True
        self._downstream = subscriber
        subscriber.on_subscribe(self)
        held = self._held
        if held is not None and self._downstream is not None:
            self._held = None
            self._downstream = None
            signal_end(subscriber, held[0])

    def request(self, n: int) -> None:
        """Pass positive demand upstream, held until the upstream arrives; ``n <= 0`` goes upstream too, which answers
        with ``on_error(ValueError)`` (rule 3.9). After a cancel or the end it does nothing (rule 3.6)."""
        if self._cancelled or self._terminated:
            return
        upstream = self._upstream
        if upstream is None:
            if n <= 0:
                self._bad_request = n
            else:
                self._requested = add_demand(self._requested, n)
            return
        if n <= 0:
            # The upstream answers with on_error(ValueError) in its own serial order; it reaches us as on_error.
            upstream.request(n)
            return
        self._on_request(n)

    def cancel(self) -> None:
        """Cancel the upstream and drop the downstream (rule 3.13); a second call does nothing (rule 3.7)."""
        if self._cancelled:
            return
        self._cancelled = True
        self._downstream = None
        self._cancel_upstream()
        self._on_cancel()

    # --- subscriber side ----------------------------------------------------------------------------------
    def on_subscribe(self, subscription: Subscription) -> None:
        """Take the upstream (a second one is cancelled, rule 2.5) and replay the demand, or the bad request, held
        meanwhile."""
        if not self._take_upstream(subscription):
            return
        if self._bad_request is not None:
            subscription.request(self._bad_request)
        elif self._requested:
            requested = self._requested
            self._requested = 0
            self._on_request(requested)

    def _take_upstream(self, subscription: Subscription) -> bool:
        """Take ``subscription`` as the upstream and tell ``_on_upstream``; False if it was cancelled instead."""
        refuse_none(subscription, "on_subscribe")
        if self._upstream is not None or self._terminated:
            subscription.cancel()  # rule 2.5: one active subscription at a time
            return False
        self._upstream = subscription
        if self._cancelled:
            self._upstream = CANCELLED_UPSTREAM
            subscription.cancel()
            return False
        self._on_upstream(subscription)
        return True

    def on_next(self, item: Any) -> None:
        """Pass ``item`` downstream unchanged; ``None`` raises TypeError (rule 2.13)."""
        refuse_none(item, "on_next")
        downstream = self._downstream
        if downstream is not None:
            downstream.on_next(item)

    def on_error(self, error: BaseException) -> None:
        """Pass ``error`` downstream, once, held until there is a downstream."""
        refuse_none(error, "on_error")
        self._upstream = CANCELLED_UPSTREAM
        self._emit_error(error)

    def on_complete(self) -> None:
        """Complete the downstream, once, held until there is a downstream."""
        self._upstream = CANCELLED_UPSTREAM
        self._emit_complete()

    # --- hooks and helpers for subclasses -----------------------------------------------------------------
    def _on_upstream(self, subscription: Subscription) -> None:
        """Called once when the upstream subscription arrives (before held demand is replayed)."""

    def _on_request(self, n: int) -> None:
        """Positive demand from downstream, upstream present."""
        upstream = self._upstream
        assert upstream is not None  # noqa: S101  narrows an Optional for mypy: set before this point
        upstream.request(n)

    def _on_cancel(self) -> None:
        """Release resources after the downstream cancelled."""

    def _fail(self, error: BaseException) -> None:
        """A user callback failed: cancel upstream and pass the same error object downstream."""
        self._cancel_upstream()
        self._emit_error(error)

    def _finish(self) -> None:
        """End early: cancel upstream and complete downstream."""
        self._cancel_upstream()
        self._emit_complete()

    def _cancel_upstream(self) -> None:
        """Cancel the upstream (if any) once; later signals from it find CANCELLED_UPSTREAM."""
        upstream, self._upstream = self._upstream, CANCELLED_UPSTREAM
        cancel_if_any(upstream)

    def _emit_error(self, error: BaseException) -> None:
        self._emit_end(error)

    def _emit_complete(self) -> None:
        self._emit_end(None)

    def _emit_end(self, error: BaseException | None) -> None:
        """The terminal signal, once: ``on_error(error)``, or ``on_complete`` for None; held until subscribed."""
        if self._terminated or self._cancelled:
            return
        self._terminated = True
        downstream = self._downstream
        if downstream is None:
            self._held = (error,)
            return
        self._downstream = None
        signal_end(downstream, error)


class FusedProcessor(BaseProcessor):
    """Consecutive synchronous 1:1 stages (map, filter, peek, take_while, drop_while, skip, distinct) in one stage.

    Demand passes straight through; an item a stage drops is replaced by ``request(1)`` upstream, unless the
    downstream asked for everything anyway.
    """

    def __init__(self, fused: tuple[st.Stage, ...] = ()) -> None:
        super().__init__()
        self._plan = plan(fused)
        self._unbounded = False

    def _on_request(self, n: int) -> None:
        if n >= UNBOUNDED:
            self._unbounded = True
        self._upstream.request(n)  # type: ignore[union-attr]

    def on_next(self, item: Any) -> None:
        """Run ``item`` through the fused stages and emit the result. A dropped item is requested again upstream (unless
        the demand is unbounded), a stage that stops (take_while) completes the stream, a failing callback cancels
        upstream and fails it."""
        if item is None:
            raise TypeError("on_next(None) (Reactive Streams rule 2.13)")
        downstream = self._downstream
        if downstream is None:
            return
        try:
            # the plan applied inline (as in the iterable source's drain loop): no call per item on the hot path
            for kind, fn in self._plan:
                if kind == MAP:
                    item = fn(item)
                    if item is None:
                        raise none_element_error("map returned None")
                elif kind == FILTER:
                    if not fn(item):
                        self._dropped()
                        return
                else:
                    item = fn(item)
                    if item is DROP:
                        self._dropped()
                        return
        except Stop:
            self._finish()
            return
        except Exception as error:
            self._fail(error)
            return
        downstream.on_next(item)

    def _dropped(self) -> None:
        if not self._unbounded:
            self._upstream.request(1)  # type: ignore[union-attr]


class LimitProcessor(BaseProcessor):
    """Emits at most ``n`` items and never requests more than that from upstream."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self._remaining = n  # items still to emit
        self._unrequested = n  # items we may still ask upstream for

    def _on_upstream(self, subscription: Subscription) -> None:
        if self._remaining == 0:
            self._finish()

    def _on_request(self, n: int) -> None:
        ask = min(n, self._unrequested)
        if ask > 0:
            self._unrequested -= ask
            self._upstream.request(ask)  # type: ignore[union-attr]

    def on_next(self, item: Any) -> None:
        """Emit ``item`` while the limit lasts; the ``n``-th item completes the stream and cancels upstream."""
        refuse_none(item, "on_next")
        downstream = self._downstream
        if downstream is None or self._remaining <= 0:
            return
        self._remaining -= 1
        downstream.on_next(item)
        if self._remaining == 0:
            self._finish()


class HookProcessor(BaseProcessor):
    """on_complete / on_error / on_terminate: call a user function on a terminal signal (and on cancel)."""

    def __init__(self, stage: st.OnComplete | st.OnError | st.OnTerminate) -> None:
        super().__init__()
        self._stage = stage

    def on_error(self, error: BaseException) -> None:
        """Call the ``on_error`` or ``on_terminate`` function, then pass ``error`` on (or the function's own error, when
        it raises)."""
        refuse_none(error, "on_error")
        self._upstream = CANCELLED_UPSTREAM
        if self._terminated or self._cancelled:
            return
        stage = self._stage
        try:
            if isinstance(stage, st.OnError):
                stage.fn(error)
            elif isinstance(stage, st.OnTerminate):
                stage.fn()
        except Exception as hook_error:
            error = hook_error
        self._emit_error(error)

    def on_complete(self) -> None:
        """Call the ``on_complete`` or ``on_terminate`` function, then complete (or fail with the function's error, when
        it raises)."""
        self._upstream = CANCELLED_UPSTREAM
        if self._terminated or self._cancelled:
            return
        stage = self._stage
        if isinstance(stage, st.OnComplete | st.OnTerminate):
            try:
                stage.fn()
            except Exception as hook_error:
                self._emit_error(hook_error)
                return
        self._emit_complete()

    def _on_cancel(self) -> None:
        if isinstance(self._stage, st.OnTerminate) and not self._terminated:
            self._terminated = True
            try:
                self._stage.fn()
            except Exception as error:
                _report(error, "on_terminate callback failed during cancellation")


def _report(error: BaseException, message: str) -> None:
    """An error with no downstream left to receive it goes to the loop's exception handler."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return
    loop.call_exception_handler({"message": message, "exception": error})
