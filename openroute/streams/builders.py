"""Reactive Streams Operators builders: immutable stage graphs for publishers, processors, subscribers, runners."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Generator, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, Self, TypeVar

from . import runner
from . import stages as st
from .protocol import Processor, Publisher, Subscriber, Subscription, cancel_if_any
from .subscribers import ChainedCompletionSubscriber, CompletionSubscriber

T = TypeVar("T")
R = TypeVar("R")
U = TypeVar("U")
A = TypeVar("A")

_MISSING: Any = object()


def require_value(value: object, name: str) -> None:
    """A ``None`` argument is refused with :class:`TypeError` naming it."""
    if value is None:
        raise TypeError(f"{name} must not be None")


_SUBSCRIBER_METHODS = ("on_subscribe", "on_next", "on_error", "on_complete")


def check_subscriber_methods(value: object, what: str) -> None:
    """TypeError unless ``value`` has the four subscriber methods (``what`` names the caller)."""
    missing = [name for name in _SUBSCRIBER_METHODS if not callable(getattr(value, name, None))]
    if missing:
        raise TypeError(f"{what} needs a Subscriber, got {type(value).__name__} (missing {', '.join(missing)})")


def check_processor_methods(value: object, what: str) -> None:
    """TypeError unless ``value`` has the subscriber methods and ``subscribe``."""
    check_subscriber_methods(value, what)
    if not callable(getattr(value, "subscribe", None)):
        raise TypeError(f"{what} needs a Processor, got {type(value).__name__} (missing subscribe)")


def _count(n: int, name: str) -> int:
    if isinstance(n, bool) or not isinstance(n, int):
        raise TypeError(f"{name}(n) needs an int, got {type(n).__name__}")
    if n < 0:
        raise ValueError(f"{name}(n) needs n >= 0, got {n}")
    return n


class _Graph:
    """A builder's immutable stage graph."""

    __slots__ = ("_stages",)

    def __init__(self, stages: tuple[st.Stage, ...]) -> None:
        self._stages = stages

    @property
    def stages(self) -> tuple[st.Stage, ...]:
        """The stage graph, in order."""
        return self._stages

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(type(s).__name__ for s in self._stages)})"


class _StageMethods(_Graph, Generic[T]):
    """Processing stages shared by publisher and processor builders; each returns a new builder."""

    __slots__ = ()

    def _with(self, stage: st.Stage) -> Self:
        return type(self)((*self._stages, stage))

    def _add(self, kind: Callable[[Any], st.Stage], fn: Any, name: str = "fn") -> Self:
        """A new builder ending in the stage ``kind(fn)``; TypeError when ``fn`` is None."""
        require_value(fn, name)
        return self._with(kind(fn))

    def map(self, fn: Callable[[T], U]) -> Any:
        """Emit ``fn(item)``; a ``None`` result fails the stream with TypeError."""
        return self._add(st.Map, fn)

    def filter(self, predicate: Callable[[T], bool]) -> Self:
        """Emit only the items for which ``predicate`` is true."""
        return self._add(st.Filter, predicate, "predicate")

    def flat_map(self, fn: Callable[[T], Any]) -> Any:
        """Emit the items of the publisher or builder ``fn(item)``; inner streams run one at a time, in order."""
        return self._add(st.FlatMap, fn)

    def flat_map_async(self, fn: Callable[[T], Awaitable[U]]) -> Any:
        """Emit the result of awaiting ``fn(item)``, one item at a time, in order."""
        return self._add(st.FlatMapAsync, fn)

    def flat_map_iterable(self, fn: Callable[[T], Iterable[U]]) -> Any:
        """Emit the elements of the iterable ``fn(item)``."""
        return self._add(st.FlatMapIterable, fn)

    def limit(self, n: int) -> Self:
        """Emit at most ``n`` items, then complete and cancel upstream; ``n < 0`` raises ValueError."""
        return self._with(st.Limit(_count(n, "limit")))

    def skip(self, n: int) -> Self:
        """Drop the first ``n`` items; ``n < 0`` raises ValueError."""
        return self._with(st.Skip(_count(n, "skip")))

    def take_while(self, predicate: Callable[[T], bool]) -> Self:
        """Emit while ``predicate`` holds; the first item failing it completes the stream."""
        return self._add(st.TakeWhile, predicate, "predicate")

    def drop_while(self, predicate: Callable[[T], bool]) -> Self:
        """Drop items while ``predicate`` holds, then emit everything."""
        return self._add(st.DropWhile, predicate, "predicate")

    def distinct(self) -> Self:
        """Drop items equal to one seen before (items must be hashable, else the stream fails with TypeError)."""
        return self._with(st.Distinct())

    def peek(self, fn: Callable[[T], Any]) -> Self:
        """Call ``fn(item)`` and emit the item unchanged."""
        return self._add(st.Peek, fn)

    def on_error(self, fn: Callable[[BaseException], Any]) -> Self:
        """Call ``fn(error)`` when the stream fails, then pass the error on."""
        return self._add(st.OnError, fn)

    def on_error_resume(self, fn: Callable[[BaseException], T]) -> Self:
        """On failure emit ``fn(error)`` and complete."""
        return self._add(st.OnErrorResume, fn)

    def on_error_resume_with(self, fn: Callable[[BaseException], Any]) -> Self:
        """On failure continue with the publisher or builder ``fn(error)``."""
        return self._add(st.OnErrorResumeWith, fn)

    def on_complete(self, fn: Callable[[], Any]) -> Self:
        """Call ``fn()`` when the stream completes normally."""
        return self._add(st.OnComplete, fn)

    def on_terminate(self, fn: Callable[[], Any]) -> Self:
        """Call ``fn()`` when the stream completes, fails or is cancelled."""
        return self._add(st.OnTerminate, fn)

    def via(self, processor: ProcessorBuilder[Any, Any] | Processor[Any, Any]) -> Any:
        """Pass the items through a processor builder (its stages are inlined) or a processor."""
        require_value(processor, "processor")
        if isinstance(processor, ProcessorBuilder):
            return type(self)(self._stages + processor.stages)
        check_processor_methods(processor, "via()")
        return self._with(st.ProcessorStage(processor))


class _TerminalMethods(_StageMethods[T]):
    """The terminal stages of publisher and processor builders: each ends the graph; the concrete builder decides
    what that makes (a completion runner or a subscriber builder)."""

    __slots__ = ()

    def _terminal(self, stage: st.Stage) -> Any:
        raise NotImplementedError

    def to(self, subscriber: SubscriberBuilder[Any, Any] | Subscriber[Any]) -> Any:
        """End in a subscriber builder (stages inlined) or a subscriber."""
        require_value(subscriber, "subscriber")
        if isinstance(subscriber, SubscriberBuilder):
            return self._terminal_graph(subscriber.stages)
        check_subscriber_methods(subscriber, "to()")
        return self._terminal(st.SubscriberStage(subscriber))

    def _terminal_graph(self, stages: tuple[st.Stage, ...]) -> Any:
        raise NotImplementedError

    def collect(self, initial_factory: Callable[[], R] | Collector[Any, Any, Any],
                accumulator: Callable[[R, Any], Any] | None = None) -> Any:
        """Result: ``initial_factory()`` after ``accumulator(container, item)`` for every item; or, given one
        :class:`Collector`, its ``finisher`` applied to the container it filled."""
        require_value(initial_factory, "initial_factory")
        if isinstance(initial_factory, Collector):
            if accumulator is not None:
                raise TypeError("collect(): give a Collector or a factory and an accumulator, not both")
            collector = initial_factory
            return self._terminal(st.Collect(collector.supplier, collector.accumulator, collector.finisher))
        require_value(accumulator, "accumulator")
        return self._terminal(st.Collect(initial_factory, accumulator))  # type: ignore[arg-type]

    def to_list(self) -> Any:
        """Result: the list of all items."""
        return self._terminal(st.ToList())

    def reduce(self, fn: Callable[[Any, Any], Any], identity: Any = _MISSING) -> Any:
        """Result: the items folded with ``fn``, starting from ``identity`` if given (else None when empty).

        ``identity=None`` is allowed, as the spec's ``reduce(identity, accumulator)`` allows a null identity:
        the first call is ``fn(None, first_item)`` and an empty stream gives None.
        """
        require_value(fn, "fn")
        has_identity = identity is not _MISSING
        return self._terminal(st.Reduce(fn, identity if has_identity else None, has_identity))

    def find_first(self) -> Any:
        """Result: the first item, or None for an empty stream."""
        return self._terminal(st.FindFirst())

    def for_each(self, fn: Callable[[Any], Any]) -> Any:
        """Call ``fn(item)`` for every item; result None."""
        require_value(fn, "fn")
        return self._terminal(st.ForEach(fn))

    def ignore(self) -> Any:
        """Consume every item; result None."""
        return self._terminal(st.Ignore())

    def cancel(self) -> Any:
        """Cancel the stream as soon as it starts; result None."""
        return self._terminal(st.Cancel())


@dataclass(frozen=True, slots=True)
class Collector(Generic[T, A, R]):
    """What ``collect`` needs, as the spec's ``java.util.stream.Collector``: a fresh container from
    ``supplier()``, ``accumulator(container, item)`` for every item, the result ``finisher(container)``."""

    supplier: Callable[[], A]
    accumulator: Callable[[A, T], Any]
    finisher: Callable[[A], R] | None = None

    def __post_init__(self) -> None:
        for name in ("supplier", "accumulator"):
            if not callable(getattr(self, name)):
                raise TypeError(f"Collector: {name} must be callable, got {getattr(self, name)!r}")
        if self.finisher is not None and not callable(self.finisher):
            raise TypeError(f"Collector: finisher must be callable or None, got {self.finisher!r}")


class PublisherBuilder(_TerminalMethods[T]):
    """A publisher graph: a source stage followed by processing stages."""

    __slots__ = ()

    if TYPE_CHECKING:  # precise types for the element-changing stages and the terminals (same implementation)

        def map(self, fn: Callable[[T], U]) -> PublisherBuilder[U]:
            """Emit ``fn(item)``; a ``None`` result fails the stream with TypeError."""

        def flat_map(self, fn: Callable[[T], PublisherBuilder[U] | Publisher[U]]) -> PublisherBuilder[U]:
            """Emit the items of the publisher or builder ``fn(item)``; inner streams run one at a time, in order."""

        def flat_map_async(self, fn: Callable[[T], Awaitable[U]]) -> PublisherBuilder[U]:
            """Emit the result of awaiting ``fn(item)``, one item at a time, in order."""

        def flat_map_iterable(self, fn: Callable[[T], Iterable[U]]) -> PublisherBuilder[U]:
            """Emit the elements of the iterable ``fn(item)``."""

        def via(self, processor: ProcessorBuilder[T, U] | Processor[T, U]) -> PublisherBuilder[U]:
            """Pass the items through a processor builder (its stages are inlined) or a processor."""

        def to(self, subscriber: SubscriberBuilder[T, U] | Subscriber[T]) -> CompletionRunner[Any]:
            """A runner of this graph ending in ``subscriber`` (a subscriber builder's stages are inlined)."""

        def collect(
            self,
            initial_factory: Callable[[], A] | Collector[T, Any, A],
            accumulator: Callable[[A, T], Any] | None = ...,
        ) -> CompletionRunner[A]:
            """A runner whose result is the container filled by ``accumulator`` (or by the Collector, through its
            finisher)."""

        def to_list(self) -> CompletionRunner[list[T]]:
            """A runner whose result is the list of all items."""

        def reduce(self, fn: Callable[[T, T], T], identity: T = ...) -> CompletionRunner[T | None]:
            """A runner whose result is the items folded with ``fn`` (from ``identity`` if given; None when empty)."""

        def find_first(self) -> CompletionRunner[T | None]:
            """A runner whose result is the first item, or None for an empty stream."""

        def for_each(self, fn: Callable[[T], Any]) -> CompletionRunner[None]:
            """A runner that calls ``fn(item)`` for every item; result None."""

        def ignore(self) -> CompletionRunner[None]:
            """A runner that consumes every item; result None."""

        def cancel(self) -> CompletionRunner[None]:
            """A runner that cancels the stream as soon as it starts; result None."""

    def _terminal(self, stage: st.Stage) -> CompletionRunner[Any]:
        return CompletionRunner(self._stages, (stage,))

    def _terminal_graph(self, stages: tuple[st.Stage, ...]) -> CompletionRunner[Any]:
        return CompletionRunner(self._stages, stages)

    def build(self) -> Publisher[T]:
        """A cold publisher: each subscriber gets its own run of the graph."""
        return runner.build_publisher(self._stages)

    def __aiter__(self) -> AsyncIterator[T]:
        """Iterate the items with ``async for`` (demand in batches of 16; leaving the loop cancels)."""
        return _iterate(self.build())


class ProcessorBuilder(_TerminalMethods[R], Generic[T, R]):
    """A processor graph: processing stages only (empty means identity); takes T in, gives R out."""

    __slots__ = ()

    if TYPE_CHECKING:  # precise types for the element-changing stages and the terminals (same implementation)

        def map(self, fn: Callable[[R], U]) -> ProcessorBuilder[T, U]:
            """Emit ``fn(item)``; a ``None`` result fails the stream with TypeError."""

        def flat_map(self, fn: Callable[[R], PublisherBuilder[U] | Publisher[U]]) -> ProcessorBuilder[T, U]:
            """Emit the items of the publisher or builder ``fn(item)``; inner streams run one at a time, in order."""

        def flat_map_async(self, fn: Callable[[R], Awaitable[U]]) -> ProcessorBuilder[T, U]:
            """Emit the result of awaiting ``fn(item)``, one item at a time, in order."""

        def flat_map_iterable(self, fn: Callable[[R], Iterable[U]]) -> ProcessorBuilder[T, U]:
            """Emit the elements of the iterable ``fn(item)``."""

        def via(self, processor: ProcessorBuilder[R, U] | Processor[R, U]) -> ProcessorBuilder[T, U]:
            """Pass the items through a processor builder (its stages are inlined) or a processor."""

        def to(self, subscriber: SubscriberBuilder[R, U] | Subscriber[R]) -> SubscriberBuilder[T, Any]:
            """A subscriber builder ending in ``subscriber`` (a subscriber builder's stages are inlined)."""

        def collect(
            self,
            initial_factory: Callable[[], A] | Collector[R, Any, A],
            accumulator: Callable[[A, R], Any] | None = ...,
        ) -> SubscriberBuilder[T, A]:
            """A subscriber builder whose result is the container filled by ``accumulator`` (or by the Collector,
            through its finisher)."""

        def to_list(self) -> SubscriberBuilder[T, list[R]]:
            """A subscriber builder whose result is the list of all items."""

        def reduce(self, fn: Callable[[R, R], R], identity: R = ...) -> SubscriberBuilder[T, R | None]:
            """A subscriber builder whose result is the items folded with ``fn`` (from ``identity`` if given; None when
            empty)."""

        def find_first(self) -> SubscriberBuilder[T, R | None]:
            """A subscriber builder whose result is the first item, or None for an empty stream."""

        def for_each(self, fn: Callable[[R], Any]) -> SubscriberBuilder[T, None]:
            """A subscriber builder that calls ``fn(item)`` for every item; result None."""

        def ignore(self) -> SubscriberBuilder[T, None]:
            """A subscriber builder that consumes every item; result None."""

        def cancel(self) -> SubscriberBuilder[T, None]:
            """A subscriber builder that cancels the stream as soon as it starts; result None."""

    def _terminal(self, stage: st.Stage) -> SubscriberBuilder[T, Any]:
        return SubscriberBuilder((*self._stages, stage))

    def _terminal_graph(self, stages: tuple[st.Stage, ...]) -> SubscriberBuilder[T, Any]:
        return SubscriberBuilder(self._stages + stages)

    def build(self) -> Processor[T, R]:
        """A processor running the graph (single use: one upstream, one downstream)."""
        return runner.build_processor(self._stages)


class SubscriberBuilder(_Graph, Generic[T, R]):
    """A subscriber graph: processing stages then one terminal stage."""

    __slots__ = ()

    def build(self) -> CompletionSubscriber[R]:
        """A subscriber whose ``completion`` future carries the result."""
        return runner.build_subscriber(self._stages)


class CompletionRunner(Generic[R]):
    """A closed graph (publisher graph + subscriber graph); ``run()`` starts it and returns the result future."""

    __slots__ = ("_publisher_stages", "_subscriber_stages")

    def __init__(self, publisher_stages: tuple[st.Stage, ...], subscriber_stages: tuple[st.Stage, ...]) -> None:
        self._publisher_stages = publisher_stages
        self._subscriber_stages = subscriber_stages

    @property
    def stages(self) -> tuple[st.Stage, ...]:
        """The whole closed graph, in order (source first, terminal last)."""
        return self._publisher_stages + self._subscriber_stages

    def __repr__(self) -> str:
        return f"CompletionRunner({', '.join(type(s).__name__ for s in self.stages)})"

    def run(self) -> asyncio.Future[R]:
        """Start the stream now on the running loop; the future gets the result or the stream's error.

        Each call is a new run. Cancelling the future cancels the stream.
        """
        loop = asyncio.get_running_loop()
        try:
            publisher = runner.build_publisher(self._publisher_stages)
            subscriber = runner.build_subscriber(self._subscriber_stages)
        except Exception as error:
            failed: asyncio.Future[R] = loop.create_future()
            failed.set_exception(error)
            return failed
        completion = subscriber.completion
        target = subscriber.head if isinstance(subscriber, ChainedCompletionSubscriber) else subscriber
        try:
            publisher.subscribe(target)
        except Exception as error:
            # A user publisher that throws instead of signalling on_error still fails only the future.
            subscriber._reject(error)
        return completion

    def __await__(self) -> Generator[Any, None, R]:
        return self.run().__await__()


class _IteratingSubscriber(Subscriber[Any]):
    """Buffers up to ``batch`` items for ``async for``; refills when half drained."""

    def __init__(self, batch: int = 16) -> None:
        self._batch = batch
        self._buffer: deque[Any] = deque()
        self._subscription: Subscription | None = None
        self._done = False
        self._error: BaseException | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._consumed = 0

    def on_subscribe(self, subscription: Subscription) -> None:
        if self._subscription is not None:
            subscription.cancel()
            return
        self._subscription = subscription
        subscription.request(self._batch)

    def on_next(self, item: Any) -> None:
        if item is None:  # inline, not refuse_none: once per item
            raise TypeError("on_next(None) (Reactive Streams rule 2.13)")
        self._buffer.append(item)
        self._wake()

    def on_error(self, error: BaseException) -> None:
        self._error = error  # raised by the iteration once the buffered items are taken
        self.on_complete()

    def on_complete(self) -> None:
        self._done = True
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def next(self) -> Any:
        while not self._buffer:
            if self._done:
                if self._error is not None:
                    raise self._error
                raise StopAsyncIteration
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        item = self._buffer.popleft()
        self._consumed += 1
        if self._consumed * 2 >= self._batch and self._subscription is not None and not self._done:
            consumed, self._consumed = self._consumed, 0
            self._subscription.request(consumed)
        return item

    def cancel(self) -> None:
        subscription, self._subscription = self._subscription, None
        self._done = True
        cancel_if_any(subscription)


async def _iterate(publisher: Publisher[Any]) -> AsyncIterator[Any]:
    subscriber = _IteratingSubscriber()
    publisher.subscribe(subscriber)
    try:
        while True:
            try:
                item = await subscriber.next()
            except StopAsyncIteration:
                return
            yield item
    finally:
        subscriber.cancel()
