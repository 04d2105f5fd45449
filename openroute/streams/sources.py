"""Source publishers: iterables, async iterables, empty, failed, concat."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

from . import stages as st
from .fusion import DROP, FILTER, MAP, Stop, none_element_error, plan
from .protocol import (
    NOOP_SUBSCRIPTION,
    UNBOUNDED,
    Publisher,
    StreamCancelledError,
    Subscriber,
    Subscription,
    add_demand,
)


def bad_request_error(n: int) -> ValueError:
    """The error a subscriber gets for ``request(n)`` with ``n <= 0`` (rule 3.9)."""
    return ValueError(f"request(n) needs n > 0, got {n} (Reactive Streams rule 3.9)")


def check_subscriber(subscriber: object) -> None:
    """Rule 1.9: a ``None`` subscriber is refused with :class:`TypeError`."""
    if subscriber is None:
        raise TypeError("subscriber must not be None (Reactive Streams rule 1.9)")


class IterablePublisher(Publisher[Any]):
    """Emits what ``iterator_factory()`` yields, one fresh iterator per subscription.

    ``fused`` synchronous stages (map, filter...) run inside the drain loop: no processor hop, and a dropped
    item simply lets the loop pull the next one instead of cycling ``request(1)`` through a processor.
    """

    __slots__ = ("_factory", "_fused")

    def __init__(self, iterator_factory: Callable[[], Iterator[Any]], fused: tuple[st.Stage, ...] = ()) -> None:
        self._factory = iterator_factory
        self._fused = fused

    def subscribe(self, subscriber: Subscriber[Any]) -> None:
        check_subscriber(subscriber)
        try:
            iterator = self._factory()
        except Exception as error:
            subscriber.on_subscribe(NOOP_SUBSCRIPTION)
            subscriber.on_error(error)
            return
        subscriber.on_subscribe(_IteratorSubscription(iterator, subscriber, plan(self._fused) if self._fused else ()))


class _IteratorSubscription(Subscription):
    """Drains a synchronous iterator under demand, through a fused ``plan`` of synchronous stages (may be empty).

    ``request`` re-entered from ``on_next`` only adds demand; the outermost call keeps emitting, so the stack
    stays flat however the subscriber requests (rule 3.3).
    """

    __slots__ = ("_demand", "_emitting", "_error", "_iterator", "_plan", "_subscriber")

    def __init__(
        self, iterator: Iterator[Any], subscriber: Subscriber[Any], fused_plan: tuple[tuple[int, Any], ...] = ()
    ) -> None:
        self._iterator: Iterator[Any] | None = iterator
        self._subscriber: Subscriber[Any] | None = subscriber
        self._plan = fused_plan
        self._demand = 0
        self._emitting = False
        self._error: BaseException | None = None

    def request(self, n: int) -> None:
        subscriber = self._subscriber
        if subscriber is None:
            return
        if n <= 0:
            self._stop()
            if self._emitting:
                # Delivered by the emitting frame once the current on_next returns (rule 1.3).
                self._error = bad_request_error(n)
            else:
                subscriber.on_error(bad_request_error(n))
            return
        demand = self._demand + n
        self._demand = UNBOUNDED if demand >= UNBOUNDED else demand
        if self._emitting:
            return
        self._emitting = True
        try:
            self._drain(subscriber)
        finally:
            self._emitting = False

    # C901 over 12: the iterable publisher's hot loop, kept in one frame on purpose (benchmarks)
    def _drain(self, subscriber: Subscriber[Any]) -> None:  # noqa: C901
        iterator = self._iterator
        assert iterator is not None  # noqa: S101  narrows an Optional for mypy: set before this point
        on_next = subscriber.on_next
        fused_plan = self._plan
        while True:
            demand = self._demand
            if demand == 0:
                return
            emitted = 0
            while emitted != demand:
                try:
                    item = next(iterator)
                except StopIteration:
                    self._stop()
                    subscriber.on_complete()
                    return
                except Exception as error:
                    self._stop()
                    subscriber.on_error(error)
                    return
                try:
                    if item is None:
                        raise none_element_error("source iterable")
                    if fused_plan:
                        item = _apply(fused_plan, item)
                except Stop:
                    self._stop()
                    subscriber.on_complete()
                    return
                except Exception as error:
                    self._stop()
                    subscriber.on_error(error)
                    return
                if item is DROP:
                    continue
                on_next(item)
                if self._subscriber is None:
                    pending = self._error
                    if pending is not None:
                        self._error = None
                        subscriber.on_error(pending)
                    return
                emitted += 1
            if demand != UNBOUNDED:
                self._demand -= emitted

    def _stop(self) -> None:
        self._subscriber = None
        iterator = self._iterator
        self._iterator = None
        # Closing runs a generator's finally blocks now; a generator cannot be closed from inside its own body.
        close = getattr(iterator, "close", None)
        if close is not None and not getattr(iterator, "gi_running", False):
            close()

    def cancel(self) -> None:
        if self._subscriber is not None:
            self._stop()


def _apply(fused_plan: tuple[tuple[int, Any], ...], item: Any) -> Any:
    """``item`` through the fused stages: the result, DROP when filtered out; raises Stop to complete."""
    for kind, fn in fused_plan:
        if kind == MAP:
            item = fn(item)
            if item is None:
                raise none_element_error("map returned None")
        elif kind == FILTER:
            if not fn(item):
                return DROP
        else:
            item = fn(item)
            if item is DROP:
                return DROP
    return item


# Strong references to the aclose() tasks of never-started async iterators, so they are not collected mid-run.
_closing: set[asyncio.Task[Any]] = set()


class AsyncIterablePublisher(Publisher[Any]):
    """Emits the elements of an async iterable; a task on the running loop pulls them while there is demand."""

    __slots__ = ("_iterable",)

    def __init__(self, iterable: AsyncIterable[Any]) -> None:
        self._iterable = iterable

    def subscribe(self, subscriber: Subscriber[Any]) -> None:
        check_subscriber(subscriber)
        try:
            iterator = aiter(self._iterable)
        except Exception as error:
            subscriber.on_subscribe(NOOP_SUBSCRIPTION)
            subscriber.on_error(error)
            return
        subscriber.on_subscribe(_AsyncIteratorSubscription(iterator, subscriber))


class _AsyncIteratorSubscription(Subscription):
    __slots__ = ("_demand", "_iterator", "_pumping", "_subscriber", "_task", "_wakeup")

    def __init__(self, iterator: AsyncIterator[Any], subscriber: Subscriber[Any]) -> None:
        self._iterator = iterator
        self._pumping = False
        self._subscriber: Subscriber[Any] | None = subscriber
        self._demand = 0
        self._task: asyncio.Task[None] | None = None
        self._wakeup: asyncio.Future[None] | None = None

    def request(self, n: int) -> None:
        subscriber = self._subscriber
        if subscriber is None:
            return
        if n <= 0:
            self._terminate_later(subscriber, bad_request_error(n))
            return
        self._demand = add_demand(self._demand, n)
        if self._task is None:
            try:
                self._task = asyncio.get_running_loop().create_task(self._pump())
            except RuntimeError as error:
                self._subscriber = None
                subscriber.on_error(error)
                return
        wakeup = self._wakeup
        if wakeup is not None and not wakeup.done():
            wakeup.set_result(None)

    def cancel(self) -> None:
        if self._subscriber is None:
            return
        self._subscriber = None
        self._close()

    def _terminate_later(self, subscriber: Subscriber[Any], error: BaseException) -> None:
        # request() may run inside on_next; the error goes out on a later loop turn to keep signals serial.
        self._subscriber = None
        self._close()
        try:
            asyncio.get_running_loop().call_soon(subscriber.on_error, error)
        except RuntimeError:
            subscriber.on_error(error)

    def _close(self) -> None:
        task = self._task
        if task is not None and self._pumping:
            if task is not asyncio.current_task():
                task.cancel()
            # else: the pump sees _subscriber is None after on_next returns and closes the iterator itself.
        else:
            if task is not None:
                task.cancel()  # cancelled before its first step: its finally block will not run, close here
            aclose = getattr(self._iterator, "aclose", None)
            if aclose is not None:
                try:
                    loop = asyncio.get_running_loop()
                except RuntimeError:
                    return
                task = loop.create_task(aclose())
                _closing.add(task)
                task.add_done_callback(_closing.discard)

    # C901 over 12: the async-iterable publisher's loop, one frame (cancellation and close paths together)
    async def _pump(self) -> None:  # noqa: C901
        self._pumping = True
        iterator = self._iterator
        try:
            while True:
                while self._demand == 0:
                    if self._subscriber is None:
                        return
                    self._wakeup = asyncio.get_running_loop().create_future()
                    await self._wakeup
                    self._wakeup = None
                if self._subscriber is None:
                    return
                try:
                    item = await anext(iterator)
                except StopAsyncIteration:
                    subscriber = self._subscriber
                    self._subscriber = None
                    if subscriber is not None:
                        subscriber.on_complete()
                    return
                except asyncio.CancelledError:
                    raise
                except Exception as error:
                    subscriber = self._subscriber
                    self._subscriber = None
                    if subscriber is not None:
                        subscriber.on_error(error)
                    return
                subscriber = self._subscriber
                if subscriber is None:
                    return
                if item is None:
                    self._subscriber = None
                    subscriber.on_error(none_element_error("source async iterable"))
                    return
                if self._demand != UNBOUNDED:
                    self._demand -= 1
                try:
                    subscriber.on_next(item)
                except Exception as error:
                    # Rule 2.13 forbids on_next to raise; treat the subscription as cancelled and report the bug.
                    self._subscriber = None
                    asyncio.get_running_loop().call_exception_handler(
                        {"message": "a subscriber's on_next raised; subscription cancelled", "exception": error}
                    )
                    return
        except asyncio.CancelledError:
            pass
        finally:
            self._task = None
            aclose = getattr(iterator, "aclose", None)
            if aclose is not None:
                try:
                    await aclose()
                except Exception:  # noqa: S110  closing an abandoned iterator: its error has no one to go to
                    pass


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


class EmptyPublisher(Publisher[Any]):
    """Completes every subscriber right after ``on_subscribe``."""

    __slots__ = ()

    def subscribe(self, subscriber: Subscriber[Any]) -> None:
        check_subscriber(subscriber)
        subscription = _TerminalSubscription()
        subscriber.on_subscribe(subscription)
        if not subscription.cancelled:
            subscription.cancelled = True
            subscriber.on_complete()


class FailedPublisher(Publisher[Any]):
    """Fails every subscriber with the same error object right after ``on_subscribe``."""

    __slots__ = ("_error",)

    def __init__(self, error: BaseException) -> None:
        self._error = error

    def subscribe(self, subscriber: Subscriber[Any]) -> None:
        check_subscriber(subscriber)
        subscription = _TerminalSubscription()
        subscriber.on_subscribe(subscription)
        if not subscription.cancelled:
            subscription.cancelled = True
            subscriber.on_error(self._error)


class _TerminalSubscription(Subscription):
    __slots__ = ("cancelled",)

    def __init__(self) -> None:
        self.cancelled = False

    def request(self, n: int) -> None:
        pass  # the terminal signal follows on_subscribe without needing demand (rules 1.9, 2.9, 2.10)

    def cancel(self) -> None:
        self.cancelled = True


class _CancelOnSubscribe(Subscriber[Any]):
    """Subscribes to a source only to cancel it, so a source that never ran still releases its resources."""

    __slots__ = ()

    def on_subscribe(self, subscription: Subscription) -> None:
        subscription.cancel()

    def on_next(self, item: Any) -> None:
        pass

    def on_error(self, error: BaseException) -> None:
        pass

    def on_complete(self) -> None:
        pass


CANCEL_ON_SUBSCRIBE: Subscriber[Any] = _CancelOnSubscribe()


class InnerSubscriber(Subscriber[Any]):
    """Forwards an inner publisher's signals to its owner, tagged with itself so stale inners can be told apart."""

    __slots__ = ("_owner",)

    def __init__(self, owner: Any) -> None:
        self._owner = owner

    def on_subscribe(self, subscription: Subscription) -> None:
        self._owner._inner_subscribe(self, subscription)

    def on_next(self, item: Any) -> None:
        if item is None:
            raise TypeError("on_next(None) (Reactive Streams rule 2.13)")
        self._owner._inner_next(self, item)

    def on_error(self, error: BaseException) -> None:
        if error is None:
            raise TypeError("on_error(None) (Reactive Streams rule 2.13)")
        self._owner._inner_error(self, error)

    def on_complete(self) -> None:
        self._owner._inner_complete(self)


class ConcatPublisher(Publisher[Any]):
    """Emits everything of ``first``, then everything of ``second``."""

    __slots__ = ("_first", "_second")

    def __init__(self, first: Publisher[Any], second: Publisher[Any]) -> None:
        self._first = first
        self._second = second

    def subscribe(self, subscriber: Subscriber[Any]) -> None:
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
        current = self._current
        self._current = None
        if current is not None:
            current.cancel()
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
