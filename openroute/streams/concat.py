"""Concatenation of two publishers, and the inner subscriber that publishers made of other publishers use."""

from __future__ import annotations

from typing import Any

from .protocol import UNBOUNDED, Publisher, Subscriber, Subscription, add_demand, cancel_if_any, refuse_none
from .sources import CANCEL_ON_SUBSCRIBE, bad_request_error, check_subscriber


class InnerSubscriber(Subscriber[Any]):
    """Forwards an inner publisher's signals to its owner, tagged with itself so stale inners can be told apart."""

    __slots__ = ("_owner",)

    def __init__(self, owner: Any) -> None:
        self._owner = owner

    def on_subscribe(self, subscription: Subscription) -> None:
        """Hand the inner publisher's subscription to the owner, which cancels it when this inner is stale."""
        self._owner._inner_subscribe(self, subscription)

    def on_next(self, item: Any) -> None:
        """Pass ``item`` to the owner; ``None`` raises TypeError (rule 2.13)."""
        if item is None:  # inline, not refuse_none: once per item
            raise TypeError("on_next(None) (Reactive Streams rule 2.13)")
        self._owner._inner_next(self, item)

    def on_error(self, error: BaseException) -> None:
        """Pass the inner publisher's failure to the owner."""
        refuse_none(error, "on_error")
        self._owner._inner_error(self, error)

    def on_complete(self) -> None:
        """Tell the owner that the inner publisher completed."""
        self._owner._inner_complete(self)


class ConcatPublisher(Publisher[Any]):
    """Emits everything of ``first``, then everything of ``second``."""

    __slots__ = ("_first", "_second")

    def __init__(self, first: Publisher[Any], second: Publisher[Any]) -> None:
        self._first = first
        self._second = second

    def subscribe(self, subscriber: Subscriber[Any]) -> None:
        """Emit everything of ``first``, then everything of ``second``, to ``subscriber`` (``None`` raises TypeError,
        rule 1.9).

        ``second`` is subscribed to only once ``first`` completes; when the stream fails or is cancelled before that, it
        is subscribed to and cancelled at once, so it releases its resources.
        """
        check_subscriber(subscriber)
        _ConcatSubscription(self._first, self._second, subscriber).start()


class _ConcatSubscription(Subscription):
    __slots__ = ("_current", "_demand", "_downstream", "_first", "_inner", "_second")

    def __init__(self, first: Publisher[Any], second: Publisher[Any], downstream: Subscriber[Any]) -> None:
        self._first = first
        self._second: Publisher[Any] | None = second
        self._downstream: Subscriber[Any] | None = downstream
        self._demand = 0
        self._inner: InnerSubscriber | None = None
        self._current: Subscription | None = None

    def start(self) -> None:
        downstream = self._downstream
        assert downstream is not None  # noqa: S101  narrows an Optional for mypy: set before this point
        downstream.on_subscribe(self)
        if self._downstream is None:
            return
        self._inner = InnerSubscriber(self)
        self._first.subscribe(self._inner)

    def request(self, n: int) -> None:
        downstream = self._downstream
        if downstream is None:
            return
        current = self._current
        if n <= 0:
            if current is not None:
                current.request(n)  # the current source signals on_error(ValueError) in its own serial order
                return
            self.cancel()
            downstream.on_error(bad_request_error(n))
            return
        self._demand = add_demand(self._demand, n)
        if current is not None:
            current.request(n)

    def cancel(self) -> None:
        if self._downstream is None:
            return
        self._downstream = None
        self._inner = None
        current, self._current = self._current, None
        cancel_if_any(current)
        self._release_second()

    def _release_second(self) -> None:
        second = self._second
        self._second = None
        if second is not None:
            second.subscribe(CANCEL_ON_SUBSCRIBE)

    def _inner_subscribe(self, inner: InnerSubscriber, subscription: Subscription) -> None:
        if inner is not self._inner or self._current is not None:
            subscription.cancel()
            return
        self._current = subscription
        if self._demand:
            subscription.request(self._demand)

    def _inner_next(self, inner: InnerSubscriber, item: Any) -> None:
        downstream = self._downstream
        if inner is not self._inner or downstream is None:
            return
        if self._demand != UNBOUNDED:
            self._demand -= 1
        downstream.on_next(item)

    def _inner_error(self, inner: InnerSubscriber, error: BaseException) -> None:
        downstream = self._downstream
        if inner is not self._inner or downstream is None:
            return
        self._downstream = None
        self._current = None
        self._release_second()
        downstream.on_error(error)

    def _inner_complete(self, inner: InnerSubscriber) -> None:
        downstream = self._downstream
        if inner is not self._inner or downstream is None:
            return
        self._current = None
        second = self._second
        if second is None:
            self._downstream = None
            downstream.on_complete()
            return
        self._second = None
        self._inner = InnerSubscriber(self)
        second.subscribe(self._inner)
