"""The entry points of the operator builders (the spec's ``ReactiveStreams.of``, ``fromIterable``, ...): each
returns a new publisher, processor or subscriber builder."""

from __future__ import annotations

from collections.abc import AsyncIterable, Awaitable, Callable, Iterable
from typing import Any, TypeVar

from . import stages as st
from .builders import (
    ProcessorBuilder,
    PublisherBuilder,
    SubscriberBuilder,
    check_processor_methods,
    check_subscriber_methods,
    require_value,
)
from .protocol import Processor, Publisher, Subscriber

T = TypeVar("T")
R = TypeVar("R")


def of(*items: T) -> PublisherBuilder[T]:
    """A publisher of the given items; a ``None`` item raises TypeError here."""
    if any(item is None for item in items):
        raise TypeError("of(): None is not a valid stream element")
    return PublisherBuilder((st.Of(items),))


def from_iterable(iterable: Iterable[T]) -> PublisherBuilder[T]:
    """A publisher of the iterable's elements (``iter()`` once per subscription; a None element fails the stream)."""
    require_value(iterable, "iterable")
    return PublisherBuilder((st.FromIterable(iterable),))


def from_async_iterable(iterable: AsyncIterable[T]) -> PublisherBuilder[T]:
    """A publisher of an async iterable's elements, pulled on the running loop as demand allows (our extension)."""
    require_value(iterable, "iterable")
    if not hasattr(iterable, "__aiter__"):
        raise TypeError(f"from_async_iterable needs an async iterable, got {type(iterable).__name__}")
    return PublisherBuilder((st.FromAsyncIterable(iterable),))


def of_nullable(item: T | None) -> PublisherBuilder[T]:
    """A publisher of ``item``, or an empty one when ``item`` is None (the spec's ``ofNullable``)."""
    return empty() if item is None else of(item)


def _check_awaitable(value: object, name: str) -> None:
    require_value(value, name)
    if not hasattr(value, "__await__"):
        raise TypeError(f"{name}() needs an asyncio future or an awaitable, got {type(value).__name__}")


def from_completion_stage(awaitable: Awaitable[T]) -> PublisherBuilder[T]:
    """A publisher of the result of ``awaitable`` (an asyncio future, task or coroutine), awaited on demand.

    A result of None fails the stream with TypeError; a failure fails it with the same exception; a cancelled
    future fails it with StreamCancelledError. A coroutine can be awaited once: later subscribers get its
    RuntimeError (a future serves every subscriber).
    """
    _check_awaitable(awaitable, "from_completion_stage")
    return PublisherBuilder((st.FromAwaitable(awaitable, False),))


def from_completion_stage_nullable(awaitable: Awaitable[T | None]) -> PublisherBuilder[T]:
    """Like :func:`from_completion_stage`, but a result of None gives an empty stream."""
    _check_awaitable(awaitable, "from_completion_stage_nullable")
    return PublisherBuilder((st.FromAwaitable(awaitable, True),))


def coupled(
    subscriber: SubscriberBuilder[T, Any] | Subscriber[T], publisher: PublisherBuilder[R] | Publisher[R]
) -> ProcessorBuilder[T, R]:
    """A processor whose input goes to ``subscriber`` and whose output comes from ``publisher``.

    Termination and cancellation are coupled both ways: when the upstream ends or the subscriber cancels, the
    publisher is cancelled and the downstream ends the same way; when the publisher ends or the downstream
    cancels, the upstream is cancelled and the subscriber ends the same way. The builder is reusable (each
    build makes fresh stages; a ready-made Subscriber or Publisher given here is used by one build only).
    """
    require_value(subscriber, "subscriber")
    require_value(publisher, "publisher")
    subscriber_stages = (subscriber.stages if isinstance(subscriber, SubscriberBuilder)
                         else from_subscriber(subscriber).stages)
    return ProcessorBuilder((st.Coupled(subscriber_stages, from_publisher(publisher).stages),))


def from_publisher(publisher: Publisher[T] | PublisherBuilder[T]) -> PublisherBuilder[T]:
    """A builder around a Reactive Streams publisher (or a copy of a publisher builder)."""
    require_value(publisher, "publisher")
    if isinstance(publisher, PublisherBuilder):
        return PublisherBuilder(publisher.stages)
    if not callable(getattr(publisher, "subscribe", None)):
        raise TypeError(f"from_publisher needs a Publisher, got {type(publisher).__name__}")
    return PublisherBuilder((st.FromPublisher(publisher),))


def empty() -> PublisherBuilder[Any]:
    """A publisher that completes at once."""
    return PublisherBuilder((st.Empty(),))


def failed(error: BaseException) -> PublisherBuilder[Any]:
    """A publisher that fails at once with ``error`` (the same object)."""
    require_value(error, "error")
    if not isinstance(error, BaseException):
        raise TypeError(f"failed() needs an exception, got {type(error).__name__}")
    return PublisherBuilder((st.Failed(error),))


def generate(supplier: Callable[[], T]) -> PublisherBuilder[T]:
    """An infinite publisher of ``supplier()`` values (bound it with ``limit`` or ``take_while``)."""
    require_value(supplier, "supplier")
    return PublisherBuilder((st.Generate(supplier),))


def iterate(seed: T, fn: Callable[[T], T]) -> PublisherBuilder[T]:
    """An infinite publisher of ``seed``, ``fn(seed)``, ``fn(fn(seed))`` ..."""
    require_value(seed, "seed")
    require_value(fn, "fn")
    return PublisherBuilder((st.Iterate(seed, fn),))


def concat(
    first: PublisherBuilder[T] | Publisher[T], second: PublisherBuilder[T] | Publisher[T]
) -> PublisherBuilder[T]:
    """Everything of ``first``, then everything of ``second`` (which is subscribed only then, or cancelled)."""
    require_value(first, "first")
    require_value(second, "second")
    return PublisherBuilder((st.Concat(from_publisher(first).stages, from_publisher(second).stages),))


def builder() -> ProcessorBuilder[Any, Any]:
    """An identity processor builder to add stages to."""
    return ProcessorBuilder(())


def from_processor(processor: Processor[T, R]) -> ProcessorBuilder[T, R]:
    """A processor builder around a Reactive Streams processor."""
    require_value(processor, "processor")
    check_processor_methods(processor, "from_processor()")
    return ProcessorBuilder((st.ProcessorStage(processor),))


def from_subscriber(subscriber: Subscriber[T]) -> SubscriberBuilder[T, None]:
    """A subscriber builder around a Reactive Streams subscriber; its completion is None, its error, or
    :class:`StreamCancelledError` if it cancels."""
    require_value(subscriber, "subscriber")
    check_subscriber_methods(subscriber, "from_subscriber()")
    return SubscriberBuilder((st.SubscriberStage(subscriber),))
