"""Processors for the operator stages.

Every processor here accepts its downstream subscriber and its upstream subscription in either order: demand
and cancellation that arrive before the upstream are held and replayed, a terminal signal that arrives before
the downstream is held and delivered right after its ``on_subscribe``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from typing import Any

from . import stages as st
from .fusion import DROP, FILTER, MAP, Stop, none_element_error, plan
from .protocol import NOOP_SUBSCRIPTION, UNBOUNDED, Processor, Publisher, Subscriber, Subscription, add_demand
from .sources import InnerSubscriber, bad_request_error, check_subscriber


class _Cancelled(Subscription):
    """Stands in for the upstream after cancellation, so late requests are no-ops (rule 3.6)."""

    def request(self, n: int) -> None:
        pass

    def cancel(self) -> None:
        pass


_CANCELLED = _Cancelled()


def _rule_2_13(value: object, signal: str) -> None:
    if value is None:
        raise TypeError(f"{signal}(None) (Reactive Streams rule 2.13)")


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
            if held[0] is None:
                subscriber.on_complete()
            else:
                subscriber.on_error(held[0])

    def request(self, n: int) -> None:
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
        if self._cancelled:
            return
        self._cancelled = True
        self._downstream = None
        upstream = self._upstream
        self._upstream = _CANCELLED
        if upstream is not None:
            upstream.cancel()
        self._on_cancel()

    # --- subscriber side ----------------------------------------------------------------------------------
    def on_subscribe(self, subscription: Subscription) -> None:
        _rule_2_13(subscription, "on_subscribe")
        if self._upstream is not None or self._terminated:
            subscription.cancel()  # rule 2.5: one active subscription at a time
            return
        self._upstream = subscription
        if self._cancelled:
            self._upstream = _CANCELLED
            subscription.cancel()
            return
        self._on_upstream(subscription)
        if self._bad_request is not None:
            subscription.request(self._bad_request)
        elif self._requested:
            requested = self._requested
            self._requested = 0
            self._on_request(requested)

    def on_next(self, item: Any) -> None:
        _rule_2_13(item, "on_next")
        downstream = self._downstream
        if downstream is not None:
            downstream.on_next(item)

    def on_error(self, error: BaseException) -> None:
        _rule_2_13(error, "on_error")
        self._upstream = _CANCELLED
        self._emit_error(error)

    def on_complete(self) -> None:
        self._upstream = _CANCELLED
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
        upstream = self._upstream
        self._upstream = _CANCELLED
        if upstream is not None:
            upstream.cancel()
        self._emit_error(error)

    def _finish(self) -> None:
        """End early: cancel upstream and complete downstream."""
        upstream = self._upstream
        self._upstream = _CANCELLED
        if upstream is not None:
            upstream.cancel()
        self._emit_complete()

    def _emit_error(self, error: BaseException) -> None:
        if self._terminated or self._cancelled:
            return
        self._terminated = True
        downstream = self._downstream
        if downstream is None:
            self._held = (error,)
            return
        self._downstream = None
        downstream.on_error(error)

    def _emit_complete(self) -> None:
        if self._terminated or self._cancelled:
            return
        self._terminated = True
        downstream = self._downstream
        if downstream is None:
            self._held = (None,)
            return
        self._downstream = None
        downstream.on_complete()


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
        if item is None:
            raise TypeError("on_next(None) (Reactive Streams rule 2.13)")
        downstream = self._downstream
        if downstream is None:
            return
        try:
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
        _rule_2_13(item, "on_next")
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
        _rule_2_13(error, "on_error")
        self._upstream = _CANCELLED
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
        self._upstream = _CANCELLED
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


class _Emitter(BaseProcessor):
    """Base for processors that emit items of their own: tracks downstream demand and drains serially."""

    def __init__(self) -> None:
        super().__init__()
        self._demand = 0
        self._emitting = False
        self._pushing = False
        self._pending_error: BaseException | None = None

    def request(self, n: int) -> None:
        if self._cancelled or self._terminated:
            return
        if n <= 0:
            self._pending_error = bad_request_error(n)
            if not self._pushing:  # else delivered once the downstream's on_next has returned (rule 1.3)
                self._drain()
            return
        self._demand = add_demand(self._demand, n)
        if self._upstream is not None:
            self._on_request(n)

    def _on_upstream_ready(self) -> None:
        pass

    def on_subscribe(self, subscription: Subscription) -> None:
        _rule_2_13(subscription, "on_subscribe")
        if self._upstream is not None or self._terminated:
            subscription.cancel()
            return
        self._upstream = subscription
        if self._cancelled:
            self._upstream = _CANCELLED
            subscription.cancel()
            return
        self._on_upstream(subscription)
        if self._demand:
            self._on_request(self._demand)

    def _on_request(self, n: int) -> None:
        self._drain()

    def _drain(self) -> None:
        if self._emitting:
            return
        self._emitting = True
        try:
            while True:
                if self._pending_error is not None:
                    error = self._pending_error
                    self._pending_error = None
                    self._fail(error)
                    return
                if not self._step() and self._pending_error is None:
                    return
        finally:
            self._emitting = False

    def _step(self) -> bool:
        """Emit what can be emitted now; return True to run again (state changed re-entrantly)."""
        return False

    def _push(self, item: Any) -> None:
        downstream = self._downstream
        if downstream is None:
            return
        if self._demand != UNBOUNDED:
            self._demand -= 1
        self._pushing = True
        try:
            downstream.on_next(item)
        finally:
            self._pushing = False
        if self._pending_error is not None:
            self._drain()


class OnErrorResumeProcessor(_Emitter):
    """Passes items on; on error emits ``fn(error)`` (once there is demand) and completes."""

    def __init__(self, fn: Callable[[BaseException], Any]) -> None:
        super().__init__()
        self._fn = fn
        self._fallback: Any = None

    def _on_request(self, n: int) -> None:
        if self._fallback is not None:
            self._drain()
        else:
            self._upstream.request(n)  # type: ignore[union-attr]

    def on_next(self, item: Any) -> None:
        _rule_2_13(item, "on_next")
        self._push(item)

    def on_error(self, error: BaseException) -> None:
        _rule_2_13(error, "on_error")
        self._upstream = _CANCELLED
        if self._terminated or self._cancelled:
            return
        try:
            fallback = self._fn(error)
        except Exception as resume_error:
            self._emit_error(resume_error)
            return
        if fallback is None:
            self._emit_error(none_element_error("on_error_resume returned None"))
            return
        self._fallback = fallback
        self._drain()

    def _step(self) -> bool:
        if self._fallback is not None and self._demand > 0 and self._downstream is not None:
            fallback = self._fallback
            self._fallback = None
            self._push(fallback)
            self._emit_complete()
        return False


class _InnerPublisherProcessor(_Emitter):
    """Emits what an inner publisher emits, one inner publisher at a time (flat_map, on_error_resume_with).

    Subclasses decide what an inner error or completion means (``_inner_error`` / ``_inner_complete``).
    """

    def __init__(self, fn: Callable[[Any], Any], to_publisher: Callable[[Any], Publisher[Any]]) -> None:
        super().__init__()
        self._fn = fn
        self._to_publisher = to_publisher
        self._inner: InnerSubscriber | None = None
        self._inner_subscription: Subscription | None = None

    def _switch_to(self, value: Any) -> None:
        """Subscribe to the publisher (or builder) ``value``; its items go downstream."""
        publisher = self._to_publisher(value)
        self._inner = InnerSubscriber(self)
        publisher.subscribe(self._inner)

    def _inner_subscribe(self, inner: InnerSubscriber, subscription: Subscription) -> None:
        if (inner is not self._inner or self._inner_subscription is not None or self._cancelled
                or self._downstream is None):
            subscription.cancel()
            return
        self._inner_subscription = subscription
        if self._demand:
            subscription.request(self._demand)

    def _inner_next(self, inner: InnerSubscriber, item: Any) -> None:
        if inner is self._inner:
            self._push(item)

    def _inner_error(self, inner: InnerSubscriber, error: BaseException) -> None:
        raise NotImplementedError

    def _inner_complete(self, inner: InnerSubscriber) -> None:
        raise NotImplementedError

    def _cancel_inner(self) -> None:
        subscription = self._inner_subscription
        self._inner = None
        self._inner_subscription = None
        if subscription is not None:
            subscription.cancel()

    def _on_cancel(self) -> None:
        self._cancel_inner()


class OnErrorResumeWithProcessor(_InnerPublisherProcessor):
    """Passes items on; on error continues with the publisher ``fn(error)``."""

    def _on_request(self, n: int) -> None:
        if self._inner is not None:
            if self._inner_subscription is not None:
                self._inner_subscription.request(n)
        else:
            self._upstream.request(n)  # type: ignore[union-attr]

    def on_next(self, item: Any) -> None:
        _rule_2_13(item, "on_next")
        self._push(item)

    def on_error(self, error: BaseException) -> None:
        _rule_2_13(error, "on_error")
        self._upstream = _CANCELLED
        if self._terminated or self._cancelled or self._inner is not None:
            return
        try:
            self._switch_to(self._fn(error))
        except Exception as resume_error:
            self._emit_error(resume_error)

    def _inner_error(self, inner: InnerSubscriber, error: BaseException) -> None:
        if inner is self._inner:
            self._emit_error(error)

    def _inner_complete(self, inner: InnerSubscriber) -> None:
        if inner is self._inner:
            self._emit_complete()


class FlatMapProcessor(_InnerPublisherProcessor):
    """Maps each item to a publisher and emits its items; one inner publisher at a time, in upstream order."""

    def __init__(self, fn: Callable[[Any], Any], to_publisher: Callable[[Any], Publisher[Any]]) -> None:
        super().__init__(fn, to_publisher)
        self._waiting = False  # one upstream item requested, not yet arrived
        self._upstream_done = False

    def _on_request(self, n: int) -> None:
        if self._inner is not None:
            if self._inner_subscription is not None:
                self._inner_subscription.request(n)
        else:
            self._pull()

    def _pull(self) -> None:
        if self._waiting or self._inner is not None or self._demand == 0 or self._downstream is None:
            return
        if self._upstream_done:
            self._emit_complete()
            return
        self._waiting = True
        self._upstream.request(1)  # type: ignore[union-attr]

    def on_next(self, item: Any) -> None:
        _rule_2_13(item, "on_next")
        if self._downstream is None:
            return
        self._waiting = False
        try:
            result = self._fn(item)
            if result is None:
                raise none_element_error("flat_map returned None")
            self._switch_to(result)
        except Exception as error:
            self._fail(error)

    def on_error(self, error: BaseException) -> None:
        _rule_2_13(error, "on_error")
        self._upstream = _CANCELLED
        self._cancel_inner()
        self._emit_error(error)

    def on_complete(self) -> None:
        self._upstream = _CANCELLED
        self._upstream_done = True
        if self._inner is None:
            self._emit_complete()

    def _inner_error(self, inner: InnerSubscriber, error: BaseException) -> None:
        if inner is self._inner:
            self._inner = None
            self._inner_subscription = None
            self._fail(error)

    def _inner_complete(self, inner: InnerSubscriber) -> None:
        if inner is not self._inner:
            return
        self._inner = None
        self._inner_subscription = None
        if self._upstream_done:
            self._emit_complete()
        else:
            self._pull()

    def _fail(self, error: BaseException) -> None:
        self._cancel_inner()
        super()._fail(error)


class FlatMapIterableProcessor(_Emitter):
    """Maps each item to an iterable and emits its elements."""

    def __init__(self, fn: Callable[[Any], Any]) -> None:
        super().__init__()
        self._fn = fn
        self._iterator: Iterator[Any] | None = None
        self._waiting = False
        self._upstream_done = False

    def on_next(self, item: Any) -> None:
        _rule_2_13(item, "on_next")
        if self._downstream is None:
            return
        self._waiting = False
        try:
            self._iterator = iter(self._fn(item))
        except Exception as error:
            self._fail(error)
            return
        self._drain()

    def on_complete(self) -> None:
        self._upstream = _CANCELLED
        self._upstream_done = True
        self._drain()

    def _step(self) -> bool:
        while self._downstream is not None:
            iterator = self._iterator
            if iterator is None:
                if self._upstream_done:
                    self._emit_complete()
                    return False
                if self._waiting or self._demand == 0:
                    return False
                self._waiting = True
                self._upstream.request(1)  # type: ignore[union-attr]
                continue
            if self._demand == 0:
                return False
            try:
                item = next(iterator)
            except StopIteration:
                self._iterator = None
                continue
            except Exception as error:
                self._fail(error)
                return False
            if item is None:
                self._fail(none_element_error("flat_map_iterable element"))
                return False
            self._push(item)
        return False

    def _on_cancel(self) -> None:
        iterator = self._iterator
        self._iterator = None
        close = getattr(iterator, "close", None)
        if close is not None and not getattr(iterator, "gi_running", False):
            close()  # runs the finally blocks of a generator that will not be iterated to its end

    def _fail(self, error: BaseException) -> None:
        self._on_cancel()
        super()._fail(error)
