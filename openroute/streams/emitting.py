"""Processors that emit elements of their own, serially and within the downstream's demand: a recovery value
(``on_error_resume``), an inner publisher's elements (``on_error_resume_with``, ``flat_map``), an iterable's
elements (``flat_map_iterable``).

Like every processor (``processors.py``), they accept their downstream and their upstream in either order.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from .concat import InnerSubscriber
from .fusion import none_element_error
from .processors import CANCELLED_UPSTREAM, BaseProcessor
from .protocol import UNBOUNDED, Publisher, Subscription, add_demand, cancel_if_any, refuse_none
from .sources import bad_request_error


class _Emitter(BaseProcessor):
    """Base for processors that emit items of their own: tracks downstream demand and drains serially."""

    def __init__(self) -> None:
        super().__init__()
        self._demand = 0
        self._emitting = False
        self._pushing = False
        self._pending_error: BaseException | None = None
        self._waiting = False  # an item was asked for with request(1) and has not arrived

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
        if self._take_upstream(subscription) and self._demand:
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

    def on_next(self, item: Any) -> None:
        refuse_none(item, "on_next")
        self._push(item)

    def _upstream_failed(self, error: BaseException) -> bool:
        """Take the upstream's ``on_error``: it is over; True while this processor may still recover from it."""
        refuse_none(error, "on_error")
        self._upstream = CANCELLED_UPSTREAM
        return not (self._terminated or self._cancelled)

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

    def on_error(self, error: BaseException) -> None:
        """Emit ``fn(error)`` once there is demand, then complete; a failing ``fn`` fails the stream with its own error
        instead (TypeError for a ``None`` result)."""
        if not self._upstream_failed(error):
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
        subscription, self._inner_subscription = self._inner_subscription, None
        self._inner = None
        cancel_if_any(subscription)

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

    def on_error(self, error: BaseException) -> None:
        """Continue with the publisher or builder ``fn(error)``: its items go downstream within the remaining demand and
        its end ends the stream; a failing ``fn`` fails the stream with its own error."""
        if not self._upstream_failed(error) or self._inner is not None:
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
        """Subscribe to the publisher ``fn(item)`` and emit its items; the next upstream item is requested once it
        completes. A failing ``fn``, or a ``None`` result, cancels upstream and fails the stream."""
        if item is None:  # inline, not refuse_none: once per item
            raise TypeError("on_next(None) (Reactive Streams rule 2.13)")
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
        """Cancel the current inner publisher and fail the stream with ``error``."""
        refuse_none(error, "on_error")
        self._upstream = CANCELLED_UPSTREAM
        self._cancel_inner()
        self._emit_error(error)

    def on_complete(self) -> None:
        """Upstream is done: complete once the current inner publisher, if any, has completed."""
        self._upstream = CANCELLED_UPSTREAM
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
        self._upstream_done = False

    def on_next(self, item: Any) -> None:
        """Emit the elements of ``fn(item)`` within the demand; the next upstream item is requested once they are all
        out. A failing ``fn`` cancels upstream and fails the stream."""
        # the arrival checks of FlatMapProcessor.on_next written out again on purpose: a shared _arrived() (tried
        # twice) adds a call per item, +380 instructions (+3%) per flat_map_iterable item under callgrind
        if item is None:  # inline, not refuse_none: once per item
            raise TypeError("on_next(None) (Reactive Streams rule 2.13)")
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
        """Upstream is done: complete once the elements of the current iterable are all emitted."""
        self._upstream = CANCELLED_UPSTREAM
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
