"""Source publishers: iterables, async iterables, empty, failed (and the checks every publisher makes)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterable, AsyncIterator, Callable, Iterator
from typing import Any

from . import stages as st
from .fusion import DROP, FILTER, MAP, Stop, none_element_error, plan
from .protocol import (
    NOOP_SUBSCRIPTION,
    UNBOUNDED,
    Publisher,
    Subscriber,
    Subscription,
    add_demand,
    signal_end,
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
        """Give ``subscriber`` a fresh iterator, drained under its demand (``None`` raises TypeError, rule 1.9); a
        failing ``iterator_factory`` gives ``on_subscribe`` then ``on_error``."""
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
        map_kind, filter_kind, drop = MAP, FILTER, DROP  # locals: read once per item in the loop below
        while True:
            demand = self._demand
            if demand == 0:
                return
            emitted = 0
            # True while the subscriber's on_next runs: what it raises is its own, not the source's (it propagates)
            in_subscriber = False
            try:
                # a for loop over the iterator, not next() per item: the loop's own step is the cheapest pull
                for item in iterator:
                    if item is None:
                        raise none_element_error("source iterable")
                    # the fused plan applied inline: a call per item less than a helper (benchmarks)
                    for kind, fn in fused_plan:
                        if kind == map_kind:
                            item = fn(item)
                            if item is None:
                                raise none_element_error("map returned None")
                        elif kind == filter_kind:
                            if not fn(item):
                                item = drop
                                break
                        else:
                            item = fn(item)
                            if item is drop:
                                break
                    if item is drop:
                        continue
                    in_subscriber = True
                    on_next(item)
                    in_subscriber = False
                    if self._subscriber is None:
                        pending = self._error
                        if pending is not None:
                            self._error = None
                            subscriber.on_error(pending)
                        return
                    emitted += 1
                    if emitted == demand:
                        break
                else:
                    raise Stop  # a fresh one: re-raising one instance would grow its traceback each time
            except Stop:
                if in_subscriber:
                    raise
                self._stop()
                subscriber.on_complete()
                return
            except Exception as error:
                if in_subscriber:
                    raise
                self._stop()
                subscriber.on_error(error)
                return
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


# Strong references to the aclose() tasks of never-started async iterators, so they are not collected mid-run.
_closing: set[asyncio.Task[Any]] = set()


class AsyncIterablePublisher(Publisher[Any]):
    """Emits the elements of an async iterable; a task on the running loop pulls them while there is demand."""

    __slots__ = ("_iterable",)

    def __init__(self, iterable: AsyncIterable[Any]) -> None:
        self._iterable = iterable

    def subscribe(self, subscriber: Subscriber[Any]) -> None:
        """Give ``subscriber`` a fresh async iterator, pulled by a task on the running loop from the first request on
        (``None`` raises TypeError, rule 1.9); an iterable that cannot be iterated gives ``on_subscribe`` then
        ``on_error``."""
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



class _TerminalPublisher(Publisher[Any]):
    """Sends every subscriber its terminal signal right after ``on_subscribe``: ``on_error(error)``, or
    ``on_complete`` when ``error`` is None."""

    __slots__ = ("_error",)

    def __init__(self, error: BaseException | None) -> None:
        self._error = error

    def subscribe(self, subscriber: Subscriber[Any]) -> None:
        check_subscriber(subscriber)
        subscription = _TerminalSubscription()
        subscriber.on_subscribe(subscription)
        if not subscription.cancelled:
            subscription.cancelled = True
            signal_end(subscriber, self._error)


class EmptyPublisher(_TerminalPublisher):
    """Completes every subscriber right after ``on_subscribe``."""

    __slots__ = ()

    def __init__(self) -> None:
        super().__init__(None)


class FailedPublisher(_TerminalPublisher):
    """Fails every subscriber with the same error object right after ``on_subscribe``."""

    __slots__ = ()

    def __init__(self, error: BaseException) -> None:
        super().__init__(error)


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
