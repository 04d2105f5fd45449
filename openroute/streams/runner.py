"""The stream runner: turns a stage graph into Reactive Streams protocol objects (the spec's "engine").

Consecutive synchronous 1:1 stages are fused into one processor. A built publisher is cold: every
``subscribe`` assembles fresh stage objects, so each subscriber gets its own run.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from . import awaited, fusion
from . import emitting as em
from . import processors as pr
from . import sources as so
from . import stages as st
from . import subscribers as sb
from .concat import ConcatPublisher
from .coupled import CoupledProcessor
from .protocol import Processor, Publisher, Subscriber, Subscription


def build_source(stage: st.Stage, fused: tuple[st.Stage, ...] = ()) -> Publisher[Any]:
    """The publisher of a source stage; iterator sources can run ``fused`` synchronous stages in their loop."""
    if isinstance(stage, st.Of):
        items = stage.items
        return so.IterablePublisher(lambda: iter(items), fused)
    if isinstance(stage, st.FromIterable):
        iterable = stage.iterable
        return so.IterablePublisher(lambda: iter(iterable), fused)
    if isinstance(stage, st.FromAsyncIterable):
        return so.AsyncIterablePublisher(stage.iterable)
    if isinstance(stage, st.FromPublisher):
        return stage.publisher
    if isinstance(stage, st.Empty):
        return so.EmptyPublisher()
    if isinstance(stage, st.Failed):
        return so.FailedPublisher(stage.error)
    if isinstance(stage, st.Generate):
        supplier = stage.supplier
        return so.IterablePublisher(lambda: _generate(supplier), fused)
    if isinstance(stage, st.Iterate):
        seed, fn = stage.seed, stage.fn
        return so.IterablePublisher(lambda: _iterate(seed, fn), fused)
    if isinstance(stage, st.FromAwaitable):
        return awaited.FuturePublisher(stage.awaitable, stage.nullable)
    if isinstance(stage, st.Concat):
        return ConcatPublisher(build_publisher(stage.first), build_publisher(stage.second))
    raise TypeError(f"not a source stage: {stage!r}")


def _generate(supplier: Callable[[], Any]) -> Iterator[Any]:
    while True:
        yield supplier()


def _iterate(seed: Any, fn: Callable[[Any], Any]) -> Iterator[Any]:
    value = seed
    while True:
        yield value
        value = fn(value)


def to_publisher(value: Any) -> Publisher[Any]:
    """A publisher from a builder (built) or a publisher (as is) returned by a user function."""
    stages = getattr(value, "stages", None)
    if stages is not None and hasattr(value, "build"):
        return build_publisher(stages)
    if callable(getattr(value, "subscribe", None)):
        publisher: Publisher[Any] = value
        return publisher
    raise TypeError(f"expected a PublisherBuilder or a Publisher, got {type(value).__name__}")


def _processor_factories(stages: Sequence[st.Stage]) -> list[Callable[[], Processor[Any, Any]]]:
    """One factory per processor, fusing runs of synchronous stages."""
    factories: list[Callable[[], Processor[Any, Any]]] = []
    for fusable, group in itertools.groupby(stages, key=lambda stage: isinstance(stage, fusion.FUSABLE)):
        run = tuple(group)
        if fusable:
            factories.append(lambda run=run: pr.FusedProcessor(run))  # type: ignore[misc]
        else:
            factories.extend(_processor_factory(stage) for stage in run)
    return factories


def _processor_factory(stage: st.Stage) -> Callable[[], Processor[Any, Any]]:
    if isinstance(stage, st.Limit):
        return lambda: pr.LimitProcessor(stage.n)
    if isinstance(stage, st.OnComplete | st.OnError | st.OnTerminate):
        return lambda: pr.HookProcessor(stage)
    if isinstance(stage, st.FlatMap):
        return lambda: em.FlatMapProcessor(stage.fn, to_publisher)
    if isinstance(stage, st.FlatMapAsync):
        # flat_map over a one-value publisher per awaitable (the spec's flatMapCompletionStage): one code path
        fn = stage.fn
        return lambda: em.FlatMapProcessor(
            fn, lambda awaitable: so.AsyncIterablePublisher(awaited.AwaitedValue(awaitable, False, "flat_map_async"))
        )
    if isinstance(stage, st.FlatMapIterable):
        return lambda: em.FlatMapIterableProcessor(stage.fn)
    if isinstance(stage, st.OnErrorResume):
        return lambda: em.OnErrorResumeProcessor(stage.fn)
    if isinstance(stage, st.OnErrorResumeWith):
        return lambda: em.OnErrorResumeWithProcessor(stage.fn, to_publisher)
    if isinstance(stage, st.ProcessorStage):
        return lambda: stage.processor
    if isinstance(stage, st.Coupled):
        return lambda: CoupledProcessor(build_subscriber(stage.subscriber), build_publisher(stage.publisher))
    raise TypeError(f"not a processing stage: {stage!r}")


class AssembledPublisher(Publisher[Any]):
    """A source followed by processors, assembled afresh for every subscriber."""

    def __init__(self, source: Publisher[Any], factories: list[Callable[[], Processor[Any, Any]]]) -> None:
        self._source = source
        self._factories = factories

    def subscribe(self, subscriber: Subscriber[Any]) -> None:
        """Assemble fresh processors for ``subscriber`` and subscribe them, wired from the end, to the source (``None``
        raises TypeError, rule 1.9); a processor that cannot be made fails ``subscriber`` instead."""
        so.check_subscriber(subscriber)
        try:
            chain = [factory() for factory in self._factories]
        except Exception as error:
            so.FailedPublisher(error).subscribe(subscriber)
            return
        # Wire from the end, so demand is in place when the source starts emitting.
        downstream: Subscriber[Any] = subscriber
        for processor in reversed(chain):
            processor.subscribe(downstream)
            downstream = processor
        self._source.subscribe(downstream)


def build_publisher(stages: Sequence[st.Stage]) -> Publisher[Any]:
    """A cold publisher for a publisher graph (a source stage, then processing stages)."""
    if not stages or not isinstance(stages[0], st.SOURCE_STAGES):
        raise TypeError("a publisher graph starts with a source stage")
    fused = _leading_fusable(stages[1:]) if isinstance(stages[0], _ITERATOR_SOURCES) else ()
    source = build_source(stages[0], fused)
    rest = stages[1 + len(fused) :]
    if not rest:
        return source
    return AssembledPublisher(source, _processor_factories(rest))


_ITERATOR_SOURCES = (st.Of, st.FromIterable, st.Generate, st.Iterate)


def _leading_fusable(stages: Sequence[st.Stage]) -> tuple[st.Stage, ...]:
    return tuple(itertools.takewhile(lambda stage: isinstance(stage, fusion.FUSABLE), stages))


class CompositeProcessor(Processor[Any, Any]):
    """Several processors seen as one; the inner links are made when the upstream subscription arrives."""

    def __init__(self, chain: list[Processor[Any, Any]]) -> None:
        self._chain = chain
        self._wired = False
        first, last = chain[0], chain[-1]
        self.on_next = first.on_next  # type: ignore[method-assign]
        self.on_error = first.on_error  # type: ignore[method-assign]
        self.on_complete = first.on_complete  # type: ignore[method-assign]
        self.subscribe = last.subscribe  # type: ignore[method-assign]

    def _wire(self) -> None:
        if not self._wired:
            self._wired = True
            for upstream, downstream in reversed(list(itertools.pairwise(self._chain))):
                upstream.subscribe(downstream)

    def on_subscribe(self, subscription: Subscription) -> None:
        """Link the inner processors, then hand ``subscription`` to the first one."""
        self._wire()
        self._chain[0].on_subscribe(subscription)

    def on_next(self, item: Any) -> None:  # replaced per instance in __init__
        """Pass ``item`` to the first processor."""
        self._chain[0].on_next(item)

    def on_error(self, error: BaseException) -> None:  # replaced per instance in __init__
        """Pass ``error`` to the first processor."""
        self._chain[0].on_error(error)

    def on_complete(self) -> None:  # replaced per instance in __init__
        """Pass the completion to the first processor."""
        self._chain[0].on_complete()

    def subscribe(self, subscriber: Subscriber[Any]) -> None:  # replaced per instance in __init__
        """Subscribe ``subscriber`` to the last processor."""
        self._chain[-1].subscribe(subscriber)


def build_processor(stages: Sequence[st.Stage]) -> Processor[Any, Any]:
    """One processor for a processor graph (processing stages only)."""
    factories = _processor_factories(stages)
    if not factories:
        return pr.FusedProcessor()
    chain = [factory() for factory in factories]
    if len(chain) == 1:
        return chain[0]
    return CompositeProcessor(chain)


def build_terminal(stage: st.Stage) -> sb.CompletionSubscriber[Any]:
    """The completion subscriber of a terminal stage."""
    if isinstance(stage, st.ToList):
        return sb.ToListSubscriber()
    if isinstance(stage, st.Collect):
        return sb.CollectSubscriber(stage.initial_factory, stage.accumulator, stage.finisher)
    if isinstance(stage, st.Reduce):
        return sb.ReduceSubscriber(stage.fn, stage.identity, stage.has_identity)
    if isinstance(stage, st.FindFirst):
        return sb.FindFirstSubscriber()
    if isinstance(stage, st.ForEach):
        return sb.ForEachSubscriber(stage.fn)
    if isinstance(stage, st.Ignore):
        return sb.IgnoreSubscriber()
    if isinstance(stage, st.Cancel):
        return sb.CancelSubscriber()
    if isinstance(stage, st.SubscriberStage):
        return sb.WrappingSubscriber(stage.subscriber)
    raise TypeError(f"not a terminal stage: {stage!r}")


def build_subscriber(stages: Sequence[st.Stage]) -> sb.CompletionSubscriber[Any]:
    """A completion subscriber for a subscriber graph (processing stages, then a terminal stage)."""
    if not stages or not isinstance(stages[-1], st.TERMINAL_STAGES):
        raise TypeError("a subscriber graph ends with a terminal stage")
    terminal = build_terminal(stages[-1])
    factories = _processor_factories(stages[:-1])
    if not factories:
        return terminal
    chain = [factory() for factory in factories]
    downstream: Subscriber[Any] = terminal
    for processor in reversed(chain):
        processor.subscribe(downstream)
        downstream = processor
    return sb.ChainedCompletionSubscriber(downstream, terminal)
