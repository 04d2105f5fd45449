"""Terminal subscribers: they consume a stream and resolve a completion future with its result."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from functools import partial
from typing import Any, Generic, TypeVar

from .protocol import (
    UNBOUNDED,
    StreamCancelledError,
    Subscriber,
    Subscription,
    cancel_if_any,
    first_subscription,
    refuse_none,
)
from .sources import check_subscriber

R = TypeVar("R")

_UNSET: Any = object()


class CompletionSubscriber(Subscriber[Any], Generic[R]):
    """A subscriber whose result (or failure) arrives in :attr:`completion`.

    The future is created on the running loop when the subscriber is built, or lazily on first access of
    :attr:`completion` when it was built outside a loop. Cancelling the future cancels the subscription.
    """

    def __init__(self) -> None:
        self._future: asyncio.Future[R] | None = None
        self._outcome: Any = _UNSET  # result or ("error", exc) held until a future exists
        self._subscription: Subscription | None = None
        self._finished = False
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return
        self._make_future()

    @property
    def completion(self) -> asyncio.Future[R]:
        """Resolves with the stream's result, or fails with its error (the same object)."""
        if self._future is None:
            self._make_future()
        assert self._future is not None  # noqa: S101  narrows an Optional for mypy: set before this point
        return self._future

    def _make_future(self) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            loop = asyncio.get_event_loop_policy().get_event_loop()
        future: asyncio.Future[R] = loop.create_future()
        self._future = future
        outcome = self._outcome
        if outcome is not _UNSET:
            self._outcome = _UNSET
            self._settle(outcome)
        future.add_done_callback(self._future_done)

    def _future_done(self, future: asyncio.Future[R]) -> None:
        if future.cancelled() and not self._finished:
            self._finished = True
            self._cancel_upstream()

    def _settle(self, outcome: Any) -> None:
        future = self._future
        if future is None:
            self._outcome = outcome
            return
        if future.done():
            return
        if isinstance(outcome, _Failure):
            error = outcome.error
            if isinstance(error, StopIteration | StopAsyncIteration):
                # A future cannot carry these (they would end the awaiting coroutine); PEP 479 wraps them too.
                wrapped = RuntimeError(f"the stream failed with {type(error).__name__}")
                wrapped.__cause__ = error
                error = wrapped
            future.set_exception(error)
        else:
            future.set_result(outcome)

    def _resolve(self, value: Any) -> None:
        if self._finished:
            return
        self._finished = True
        self._subscription = None
        self._settle(value)

    def _reject(self, error: BaseException) -> None:
        self._resolve(_Failure(error))

    def _cancel_upstream(self) -> None:
        subscription, self._subscription = self._subscription, None
        cancel_if_any(subscription)

    def _accept(self, subscription: Subscription) -> bool:
        """Rules 2.5 / 2.13 for on_subscribe; returns False when the subscription was refused."""
        if not first_subscription(self._subscription, subscription):
            return False
        if self._finished:
            subscription.cancel()
            return False
        self._subscription = subscription
        return True

    # Terminal subscribers that need nothing special inherit these.
    def on_subscribe(self, subscription: Subscription) -> None:
        """Accept the first subscription (rules 2.5, 2.13) and request everything (unbounded demand, rule 3.17)."""
        if self._accept(subscription):
            subscription.request(UNBOUNDED)

    def on_next(self, item: Any) -> None:
        """Consume ``item`` and drop it; ``None`` raises TypeError (rule 2.13)."""
        if item is None:  # inline, not refuse_none: once per item
            raise TypeError("on_next(None) (Reactive Streams rule 2.13)")

    def on_error(self, error: BaseException) -> None:
        """Fail :attr:`completion` with ``error``."""
        refuse_none(error, "on_error")
        self._reject(error)

    def on_complete(self) -> None:
        """Resolve :attr:`completion` with None."""
        self._resolve(None)


class _Failure:
    __slots__ = ("error",)

    def __init__(self, error: BaseException) -> None:
        self.error = error


class IgnoreSubscriber(CompletionSubscriber[None]):
    """Consumes everything; resolves with None."""


class ToListSubscriber(CompletionSubscriber[list[Any]]):
    """Resolves with the list of all items."""

    def __init__(self) -> None:
        super().__init__()
        self._items: list[Any] = []

    def on_next(self, item: Any) -> None:
        """Add ``item`` to the list; ``None`` raises TypeError (rule 2.13)."""
        if item is None:  # inline, not refuse_none: once per item
            raise TypeError("on_next(None) (Reactive Streams rule 2.13)")
        self._items.append(item)

    def on_complete(self) -> None:
        """Resolve :attr:`completion` with the list of all items."""
        items = self._items
        self._items = []
        self._resolve(items)


class _EachItemSubscriber(CompletionSubscriber[R]):
    """Calls ``self._each(item)`` for every item; a failing call cancels the stream and fails the completion."""

    _each: Callable[[Any], Any]

    def on_next(self, item: Any) -> None:
        if item is None:  # inline, not refuse_none: once per item
            raise TypeError("on_next(None) (Reactive Streams rule 2.13)")
        if self._finished:
            return
        try:
            self._each(item)
        except Exception as error:
            self._cancel_upstream()
            self._reject(error)


class CollectSubscriber(_EachItemSubscriber[Any]):
    """Resolves with ``initial_factory()`` after ``accumulator(container, item)`` for every item (then passed
    through ``finisher`` when given)."""

    def __init__(self, initial_factory: Callable[[], Any], accumulator: Callable[[Any, Any], Any],
                 finisher: Callable[[Any], Any] | None = None) -> None:
        super().__init__()
        self._accumulator = accumulator
        self._finisher = finisher
        self._container: Any = None
        self._each = partial(accumulator, None)  # replaced by the container's once it is made
        self._factory: Callable[[], Any] | None = initial_factory

    def on_subscribe(self, subscription: Subscription) -> None:
        """Accept the first subscription (rules 2.5, 2.13), make the container and request everything; a failing
        ``initial_factory`` cancels the stream and fails the completion."""
        if not self._accept(subscription):
            return
        try:
            assert self._factory is not None  # noqa: S101  narrows an Optional for mypy: set before this point
            self._container = self._factory()
        except Exception as error:
            self._cancel_upstream()
            self._reject(error)
            return
        self._each = partial(self._accumulator, self._container)  # a C-level call per item: no extra frame
        subscription.request(UNBOUNDED)

    def on_complete(self) -> None:
        """Resolve with the container, or with ``finisher(container)`` when given (a failing finisher fails the
        completion)."""
        if self._finished:
            return
        container, self._container = self._container, None
        if self._finisher is None:
            self._resolve(container)
            return
        try:
            result = self._finisher(container)
        except Exception as error:
            self._reject(error)
            return
        self._resolve(result)


class ReduceSubscriber(CompletionSubscriber[Any]):
    """Folds the items with ``fn``; without identity the first item starts the fold (None for no items)."""

    def __init__(self, fn: Callable[[Any, Any], Any], identity: Any, has_identity: bool) -> None:
        super().__init__()
        self._fn = fn
        self._value = identity if has_identity else _UNSET

    def on_next(self, item: Any) -> None:
        """Fold ``item`` into the value (without an identity the first item is the value); a failing ``fn`` cancels the
        stream and fails the completion."""
        if item is None:  # inline, not refuse_none: once per item
            raise TypeError("on_next(None) (Reactive Streams rule 2.13)")
        if self._finished:
            return
        if self._value is _UNSET:
            self._value = item
            return
        try:
            self._value = self._fn(self._value, item)
        except Exception as error:
            self._cancel_upstream()
            self._reject(error)

    def on_complete(self) -> None:
        """Resolve with the folded value (None when there was no item and no identity)."""
        self._resolve(None if self._value is _UNSET else self._value)


class FindFirstSubscriber(CompletionSubscriber[Any]):
    """Resolves with the first item (then cancels), or None when the stream is empty."""

    def on_subscribe(self, subscription: Subscription) -> None:
        """Accept the first subscription (rules 2.5, 2.13) and request one item."""
        if self._accept(subscription):
            subscription.request(1)

    def on_next(self, item: Any) -> None:
        """Resolve with ``item`` and cancel the stream: only the first item counts."""
        if item is None:  # inline, not refuse_none: once per item
            raise TypeError("on_next(None) (Reactive Streams rule 2.13)")
        if self._finished:
            return
        self._cancel_upstream()
        self._resolve(item)


class ForEachSubscriber(_EachItemSubscriber[None]):
    """Calls ``fn(item)`` for every item; a failing call cancels the stream and fails the completion."""

    def __init__(self, fn: Callable[[Any], Any]) -> None:
        super().__init__()
        self._each = fn


class CancelSubscriber(CompletionSubscriber[None]):
    """Cancels as soon as it is subscribed; resolves with None."""

    def on_subscribe(self, subscription: Subscription) -> None:
        """Cancel ``subscription`` at once and resolve with None."""
        refuse_none(subscription, "on_subscribe")
        subscription.cancel()
        self._resolve(None)


class WrappingSubscriber(CompletionSubscriber[None]):
    """Wraps a user subscriber: resolves None on completion, fails with its error, or with
    :class:`StreamCancelledError` when the user subscriber cancels."""

    def __init__(self, subscriber: Subscriber[Any]) -> None:
        check_subscriber(subscriber)
        super().__init__()
        self._user = subscriber

    def on_subscribe(self, subscription: Subscription) -> None:
        """Accept the first subscription (rules 2.5, 2.13) and hand it on to the user subscriber, watched: its cancel
        fails the completion with :class:`StreamCancelledError`."""
        if not self._accept(subscription):
            return
        self._user.on_subscribe(_WatchedSubscription(self, subscription))

    def on_next(self, item: Any) -> None:
        """Pass ``item`` to the user subscriber; ``None`` raises TypeError (rule 2.13)."""
        if item is None:  # inline, not refuse_none: once per item
            raise TypeError("on_next(None) (Reactive Streams rule 2.13)")
        self._user.on_next(item)

    def on_error(self, error: BaseException) -> None:
        """Fail the completion with ``error``, then pass it to the user subscriber (once)."""
        refuse_none(error, "on_error")
        if self._finished:
            return
        self._reject(error)
        self._user.on_error(error)

    def on_complete(self) -> None:
        """Resolve the completion with None, then complete the user subscriber (once)."""
        if self._finished:
            return
        self._resolve(None)
        self._user.on_complete()

    def _user_cancelled(self) -> None:
        self._cancel_upstream()
        self._reject(StreamCancelledError("the subscriber cancelled the stream"))


class _WatchedSubscription(Subscription):
    __slots__ = ("_owner", "_subscription")

    def __init__(self, owner: WrappingSubscriber, subscription: Subscription) -> None:
        self._owner: WrappingSubscriber | None = owner
        self._subscription = subscription

    def request(self, n: int) -> None:
        self._subscription.request(n)

    def cancel(self) -> None:
        owner = self._owner
        if owner is not None:
            self._owner = None
            owner._user_cancelled()


class ChainedCompletionSubscriber(CompletionSubscriber[Any]):
    """Processing stages in front of a terminal subscriber, seen from outside as one subscriber."""

    def __init__(self, head: Subscriber[Any], terminal: CompletionSubscriber[Any]) -> None:
        # No super().__init__(): the completion is the terminal's.
        self.head = head
        self._terminal = terminal
        self.on_subscribe = head.on_subscribe  # type: ignore[method-assign]
        self.on_next = head.on_next  # type: ignore[method-assign]
        self.on_error = head.on_error  # type: ignore[method-assign]
        self.on_complete = head.on_complete  # type: ignore[method-assign]

    @property
    def completion(self) -> asyncio.Future[Any]:
        """The terminal subscriber's completion: the result of the whole subscriber graph."""
        return self._terminal.completion

    def on_subscribe(self, subscription: Subscription) -> None:  # replaced per instance in __init__
        """Hand ``subscription`` to the first stage."""
        self.head.on_subscribe(subscription)

    def on_next(self, item: Any) -> None:  # replaced per instance in __init__
        """Pass ``item`` to the first stage."""
        self.head.on_next(item)

    def on_error(self, error: BaseException) -> None:  # replaced per instance in __init__
        """Pass ``error`` to the first stage."""
        self.head.on_error(error)

    def on_complete(self) -> None:  # replaced per instance in __init__
        """Pass the completion to the first stage."""
        self.head.on_complete()
