"""The stage graph: small immutable records that builders collect and the runner turns into protocol objects.

A builder's ``.stages`` is a tuple of these. Sources come first in a publisher graph, a terminal stage last
in a subscriber graph. Nested graphs (``Concat``) hold the stage tuples of their parts.
"""

from __future__ import annotations

from collections.abc import AsyncIterable, Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any

from .protocol import Processor, Publisher, Subscriber


class Stage:
    """Base of every stage record."""


# --- sources ------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Of(Stage):
    """Emits the given elements."""

    items: tuple[Any, ...]


@dataclass(frozen=True, slots=True)
class FromIterable(Stage):
    """Emits the elements of an iterable (iterated once per subscription)."""

    iterable: Iterable[Any]


@dataclass(frozen=True, slots=True)
class FromAsyncIterable(Stage):
    """Emits the elements of an async iterable, pulled by a task on the running loop as demand allows."""

    iterable: AsyncIterable[Any]


@dataclass(frozen=True, slots=True)
class FromPublisher(Stage):
    """Emits what a Reactive Streams publisher emits."""

    publisher: Publisher[Any]


@dataclass(frozen=True, slots=True)
class Empty(Stage):
    """Completes at once."""


@dataclass(frozen=True, slots=True)
class Failed(Stage):
    """Fails at once with ``error`` (the same object)."""

    error: BaseException


@dataclass(frozen=True, slots=True)
class Generate(Stage):
    """Emits ``supplier()`` for ever."""

    supplier: Callable[[], Any]


@dataclass(frozen=True, slots=True)
class Iterate(Stage):
    """Emits ``seed``, ``fn(seed)``, ``fn(fn(seed))`` ... for ever."""

    seed: Any
    fn: Callable[[Any], Any]


@dataclass(frozen=True, slots=True)
class FromAwaitable(Stage):
    """Emits the result of awaiting an asyncio future or awaitable (the spec's ``fromCompletionStage``).

    A result of ``None`` completes the stream empty when ``nullable``, else fails it with TypeError.
    """

    awaitable: Awaitable[Any]
    nullable: bool


@dataclass(frozen=True, slots=True)
class Concat(Stage):
    """Emits the first graph, then subscribes to the second."""

    first: tuple[Stage, ...]
    second: tuple[Stage, ...]


SOURCE_STAGES = (
    Of, FromIterable, FromAsyncIterable, FromAwaitable, FromPublisher, Empty, Failed, Generate, Iterate, Concat,
)

# --- processing stages --------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Map(Stage):
    """Emits ``fn(item)``."""

    fn: Callable[[Any], Any]


@dataclass(frozen=True, slots=True)
class Filter(Stage):
    """Emits the items for which ``predicate(item)`` is true."""

    predicate: Callable[[Any], bool]


@dataclass(frozen=True, slots=True)
class FlatMap(Stage):
    """Emits everything of the publisher ``fn(item)``, one inner publisher at a time, in order."""

    fn: Callable[[Any], Any]


@dataclass(frozen=True, slots=True)
class FlatMapAsync(Stage):
    """Emits the result of awaiting ``fn(item)``, one at a time, in order."""

    fn: Callable[[Any], Any]


@dataclass(frozen=True, slots=True)
class FlatMapIterable(Stage):
    """Emits the elements of the iterable ``fn(item)``."""

    fn: Callable[[Any], Iterable[Any]]


@dataclass(frozen=True, slots=True)
class Limit(Stage):
    """Emits at most ``n`` items, then completes and cancels upstream."""

    n: int


@dataclass(frozen=True, slots=True)
class Skip(Stage):
    """Drops the first ``n`` items."""

    n: int


@dataclass(frozen=True, slots=True)
class TakeWhile(Stage):
    """Emits items while ``predicate`` holds, then completes and cancels upstream."""

    predicate: Callable[[Any], bool]


@dataclass(frozen=True, slots=True)
class DropWhile(Stage):
    """Drops items while ``predicate`` holds, then emits everything."""

    predicate: Callable[[Any], bool]


@dataclass(frozen=True, slots=True)
class Distinct(Stage):
    """Drops items equal to one already emitted (items must be hashable)."""


@dataclass(frozen=True, slots=True)
class Peek(Stage):
    """Calls ``fn(item)`` and emits the item unchanged."""

    fn: Callable[[Any], Any]


@dataclass(frozen=True, slots=True)
class OnError(Stage):
    """Calls ``fn(error)`` before passing the error on."""

    fn: Callable[[BaseException], Any]


@dataclass(frozen=True, slots=True)
class OnErrorResume(Stage):
    """On error, emits ``fn(error)`` and completes."""

    fn: Callable[[BaseException], Any]


@dataclass(frozen=True, slots=True)
class OnErrorResumeWith(Stage):
    """On error, continues with the publisher (or builder) ``fn(error)``."""

    fn: Callable[[BaseException], Any]


@dataclass(frozen=True, slots=True)
class OnComplete(Stage):
    """Calls ``fn()`` before passing completion on."""

    fn: Callable[[], Any]


@dataclass(frozen=True, slots=True)
class OnTerminate(Stage):
    """Calls ``fn()`` on completion, on error and on cancellation."""

    fn: Callable[[], Any]


@dataclass(frozen=True, slots=True)
class ProcessorStage(Stage):
    """A ready-made Reactive Streams processor (used by one subscription only)."""

    processor: Processor[Any, Any]


@dataclass(frozen=True, slots=True)
class Coupled(Stage):
    """A processor made of a subscriber graph (takes the input) and a publisher graph (gives the output),
    whose cancellation and termination are coupled both ways (the spec's ``coupled``)."""

    subscriber: tuple[Stage, ...]
    publisher: tuple[Stage, ...]


# --- terminal stages ----------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Collect(Stage):
    """Folds items into ``initial_factory()`` with ``accumulator(container, item)``; the result is the container,
    or ``finisher(container)`` when a finisher is given (the spec's ``Collector``)."""

    initial_factory: Callable[[], Any]
    accumulator: Callable[[Any, Any], Any]
    finisher: Callable[[Any], Any] | None = None


@dataclass(frozen=True, slots=True)
class ToList(Stage):
    """Result: the list of all items."""


@dataclass(frozen=True, slots=True)
class Reduce(Stage):
    """Result: ``fn`` folded over the items (from ``identity`` when given, else from the first item or None)."""

    fn: Callable[[Any, Any], Any]
    identity: Any
    has_identity: bool


@dataclass(frozen=True, slots=True)
class FindFirst(Stage):
    """Result: the first item, or None for an empty stream; cancels upstream after the first item."""


@dataclass(frozen=True, slots=True)
class ForEach(Stage):
    """Calls ``fn(item)`` for every item; result None."""

    fn: Callable[[Any], Any]


@dataclass(frozen=True, slots=True)
class Ignore(Stage):
    """Consumes everything; result None."""


@dataclass(frozen=True, slots=True)
class Cancel(Stage):
    """Cancels the stream as soon as it starts; result None."""


@dataclass(frozen=True, slots=True)
class SubscriberStage(Stage):
    """A ready-made subscriber; result None when it completes, its error when it fails,
    :class:`StreamCancelledError` when it cancels."""

    subscriber: Subscriber[Any]


TERMINAL_STAGES = (Collect, ToList, Reduce, FindFirst, ForEach, Ignore, Cancel, SubscriberStage)
