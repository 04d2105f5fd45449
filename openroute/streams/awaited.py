"""One-value sources from an awaitable: ``from_completion_stage`` and the inner publishers of ``flat_map_async``."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable
from typing import Any

from .fusion import none_element_error
from .protocol import Publisher, StreamCancelledError, Subscriber, Subscription
from .sources import AsyncIterablePublisher, bad_request_error, check_subscriber


class AwaitedValue:
    """An async iterable of one value: the result of awaiting ``awaitable`` (a future can be awaited by every
    subscriber; a coroutine only by the first, later ones get its RuntimeError)."""

    __slots__ = ("_awaitable", "_nullable", "_what")

    def __init__(self, awaitable: Awaitable[Any], nullable: bool, what: str = "from_completion_stage") -> None:
        self._awaitable = awaitable
        self._nullable = nullable
        self._what = what

    def __aiter__(self) -> AsyncIterator[Any]:
        return _AwaitedIterator(self)

    async def value(self) -> Any:
        """The awaited result; None only when nullable. Raises what the awaitable raises, TypeError for a
        non-nullable None, StreamCancelledError when the future itself was cancelled."""
        awaitable = self._awaitable
        if isinstance(awaitable, asyncio.Future) and awaitable.done() and awaitable.cancelled():
            raise StreamCancelledError(f"{self._what}: the future was cancelled")
        try:
            value = await awaitable
        except asyncio.CancelledError:
            task = asyncio.current_task()
            cancelled_here = task is not None and task.cancelling() > 0  # our task cancelled, not the future
            if not cancelled_here and isinstance(awaitable, asyncio.Future) and awaitable.cancelled():
                raise StreamCancelledError(f"{self._what}: the future was cancelled") from None
            raise
        if value is None and not self._nullable:
            raise none_element_error(f"{self._what}: the awaitable's result was None")
        return value

    def discard(self) -> None:
        """Close a coroutine that will never be awaited (its subscriber cancelled first)."""
        close = getattr(self._awaitable, "close", None)
        if close is not None and not isinstance(self._awaitable, asyncio.Future):
            close()


class FuturePublisher(Publisher[Any]):
    """The spec's ``fromCompletionStage`` over an asyncio future (or task): its failure is signalled as soon as it
    is known, right after ``on_subscribe`` or later, with or without demand (rules 1.4, 1.9); its value waits for
    demand; an empty result (None when ``nullable``) completes at once. Any other awaitable is awaited on the
    first demand (:class:`AwaitedValue`): a coroutine has not started, so it cannot have failed yet."""

    __slots__ = ("_awaitable", "_nullable", "_what")

    def __init__(self, awaitable: Awaitable[Any], nullable: bool, what: str = "from_completion_stage") -> None:
        self._awaitable = awaitable
        self._nullable = nullable
        self._what = what

    def subscribe(self, subscriber: Subscriber[Any]) -> None:
        """Give ``subscriber`` the future's outcome as the class describes (another awaitable through
        :class:`AwaitedValue`); ``None`` raises TypeError (rule 1.9)."""
        check_subscriber(subscriber)
        future = self._awaitable
        if not isinstance(future, asyncio.Future):
            AsyncIterablePublisher(AwaitedValue(future, self._nullable, self._what)).subscribe(subscriber)
            return
        subscription = _FutureSubscription(future, self._nullable, self._what, subscriber)
        subscriber.on_subscribe(subscription)
        if future.done():
            subscription.settle()
        else:
            future.add_done_callback(subscription.settle)


class _FutureSubscription(Subscription):
    __slots__ = ("_delivering", "_future", "_nullable", "_requested", "_subscriber", "_what")

    def __init__(self, future: asyncio.Future[Any], nullable: bool, what: str, subscriber: Subscriber[Any]) -> None:
        self._future = future
        self._nullable = nullable
        self._what = what
        self._subscriber: Subscriber[Any] | None = subscriber
        self._requested = False
        self._delivering = False

    def request(self, n: int) -> None:
        subscriber = self._subscriber
        if subscriber is None:
            return
        if n <= 0:
            self._subscriber = None
            try:  # may run inside on_subscribe: the error goes out on a later loop turn (rule 1.3)
                asyncio.get_running_loop().call_soon(subscriber.on_error, bad_request_error(n))
            except RuntimeError:
                subscriber.on_error(bad_request_error(n))
            return
        self._requested = True
        self.settle()

    def cancel(self) -> None:
        self._subscriber = None

    def settle(self, _: object = None) -> None:
        """Signal what the future's outcome allows now (called when it is done and on each request)."""
        subscriber, future = self._subscriber, self._future
        if subscriber is None or self._delivering or not future.done():
            return
        error: BaseException | None = None
        value: Any = None
        if future.cancelled():
            error = StreamCancelledError(f"{self._what}: the future was cancelled")
        elif future.exception() is not None:
            error = future.exception()
        else:
            value = future.result()
            if value is None and not self._nullable:
                error = none_element_error(f"{self._what}: the awaitable's result was None")
        if error is not None:
            self._subscriber = None
            subscriber.on_error(error)
        elif value is None:
            self._subscriber = None
            subscriber.on_complete()
        elif self._requested:
            self._delivering = True
            subscriber.on_next(value)
            if self._subscriber is subscriber:  # not cancelled (nor failed by a bad request) inside on_next
                self._subscriber = None
                subscriber.on_complete()


class _AwaitedIterator:
    __slots__ = ("_owner", "_started")

    def __init__(self, owner: AwaitedValue) -> None:
        self._owner = owner
        self._started = False

    def __aiter__(self) -> _AwaitedIterator:
        return self

    async def __anext__(self) -> Any:
        if self._started:
            raise StopAsyncIteration
        self._started = True
        value = await self._owner.value()
        if value is None:
            raise StopAsyncIteration
        return value

    async def aclose(self) -> None:
        if not self._started:
            self._started = True
            self._owner.discard()

