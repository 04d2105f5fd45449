"""The messaging layer's own publishers, processors and subscribers pass the Reactive Streams verification kit."""

from __future__ import annotations

from typing import Any

import pytest

from openroute.messaging import Emitter, Message, OnOverflow
from openroute.messaging._stages import ChannelTap, ConsumerSubscriber, ProcessorStage
from openroute.streams.protocol import Publisher, Subscriber, Subscription
from openroute.streams.tck import verify_processor, verify_publisher, verify_subscriber


def _emitter_of(n: int, overflow: OnOverflow) -> Emitter[Any]:
    emitter: Emitter[Any] = Emitter("tck", overflow, buffer_size=max(n, 1))
    for i in range(n):
        emitter.send(i)
    emitter.complete()
    return emitter


def _failed_emitter() -> Emitter[Any]:
    emitter: Emitter[Any] = Emitter("tck", OnOverflow.BUFFER)
    emitter.error(RuntimeError("boom"))
    return emitter


@pytest.mark.parametrize("overflow", [OnOverflow.BUFFER, OnOverflow.UNBOUNDED_BUFFER])
async def test_emitter_passes_publisher_verification(overflow: OnOverflow) -> None:
    skipped = await verify_publisher(lambda n: _emitter_of(n, overflow), max_elements=1000,
                                     make_failed_publisher=_failed_emitter)
    assert skipped == []


class _SendOnDemand(Publisher[Any]):
    """An emitter whose n messages are sent as the subscriber requests them, then completed.

    The strategies that decide by the demand at send time (THROW_EXCEPTION, DROP, FAIL, LATEST) cannot be filled
    ahead; sending within the demand is how an application uses them without losing messages.
    """

    def __init__(self, n: int, overflow: OnOverflow) -> None:
        self.emitter: Emitter[Any] = Emitter("tck", overflow)
        self.remaining = list(range(1, n + 1))

    def subscribe(self, subscriber: Subscriber[Any]) -> None:
        if subscriber is None:
            raise TypeError("subscriber must not be None")
        self.emitter.subscribe(_Relay(subscriber, self))


class _Relay(Subscriber[Any], Subscription):
    def __init__(self, downstream: Subscriber[Any], owner: _SendOnDemand) -> None:
        self.downstream: Subscriber[Any] | None = downstream
        self.owner = owner
        self.upstream: Subscription | None = None

    def on_subscribe(self, subscription: Subscription) -> None:
        self.upstream = subscription
        assert self.downstream is not None
        self.downstream.on_subscribe(self)
        if not self.owner.remaining:
            self.owner.emitter.complete()

    def request(self, n: int) -> None:
        assert self.upstream is not None
        self.upstream.request(n)
        owner = self.owner
        if n > 0 and owner.remaining and not owner.emitter.is_cancelled():
            for item in owner.remaining[:n]:
                owner.emitter.send(item)
            del owner.remaining[:n]
            if not owner.remaining:
                owner.emitter.complete()

    def cancel(self) -> None:
        self.downstream = None
        if self.upstream is not None:
            self.upstream.cancel()

    def on_next(self, item: Any) -> None:
        if self.downstream is not None:
            self.downstream.on_next(item)

    def on_error(self, error: BaseException) -> None:
        if self.downstream is not None:
            self.downstream.on_error(error)

    def on_complete(self) -> None:
        if self.downstream is not None:
            self.downstream.on_complete()


@pytest.mark.parametrize("overflow", [OnOverflow.THROW_EXCEPTION, OnOverflow.DROP, OnOverflow.FAIL,
                                      OnOverflow.LATEST])
async def test_emitter_sending_within_demand_passes_publisher_verification(overflow: OnOverflow) -> None:
    skipped = await verify_publisher(lambda n: _SendOnDemand(n, overflow), max_elements=1000,
                                     make_failed_publisher=_failed_emitter)
    assert skipped == []


async def test_emitter_overflow_none_is_outside_the_reactive_streams_contract() -> None:
    """NONE sends whatever the demand: rule 1.1 fails by definition (documented in docs/spec-conformance.md)."""
    with pytest.raises(AssertionError, match=r"rule 1\.1"):
        await verify_publisher(lambda n: _emitter_of(n, OnOverflow.NONE), max_elements=1000)


async def test_memory_source_passes_publisher_verification() -> None:
    from openroute.messaging import InMemorySource

    def make(n: int) -> Publisher[Any]:
        source = InMemorySource("tck")
        for i in range(1, n + 1):
            source.send(i)
        source.complete()
        return source.publisher

    def make_failed() -> Publisher[Any]:
        source = InMemorySource("tck")
        source.fail(RuntimeError("boom"))
        return source.publisher

    assert await verify_publisher(make, make_failed_publisher=make_failed) == []


@pytest.mark.parametrize("payloads", [True, False])
async def test_post_ack_subscriber_passes_subscriber_verification(payloads: bool) -> None:
    from openroute import streams as rs
    from openroute.messaging._stages import PostAckSubscriber

    def unwrap(message: Any) -> Any:
        return message.payload if isinstance(message, Message) else message

    # as the application wires it (builder().to(PostAckSubscriber)); the probe's elements become Messages first
    assert await verify_subscriber(lambda: rs.builder().map(Message).to(
        PostAckSubscriber(rs.builder().ignore().build(), unwrap if payloads else None)).build()) == []


async def test_channel_tap_passes_processor_verification() -> None:
    await verify_processor(lambda: ChannelTap("tck"))


@pytest.mark.parametrize(("concurrency", "prefetch"), [(1, 0), (4, 0), (1, 16)])
async def test_processor_stage_passes_processor_verification(concurrency: int, prefetch: int) -> None:
    await verify_processor(lambda: ProcessorStage("tck", lambda item: (item,), concurrency, prefetch))


@pytest.mark.parametrize("prefetch", [0, 16])
async def test_async_processor_stage_passes_processor_verification(prefetch: int) -> None:
    async def handler(item: Any) -> tuple[Any, ...]:
        return (item,)

    await verify_processor(lambda: ProcessorStage("tck", handler, 2, prefetch))


async def test_consumer_subscriber_passes_subscriber_verification() -> None:
    await verify_subscriber(lambda: ConsumerSubscriber("tck", lambda item: None, 2))


async def test_emitter_messages_are_messages() -> None:
    emitter = _emitter_of(2, OnOverflow.BUFFER)
    from openroute import streams as rs

    items = await rs.from_publisher(emitter).to_list()
    assert [m.payload for m in items] == [0, 1] and all(isinstance(m, Message) for m in items)


async def test_memory_sink_passes_subscriber_verification() -> None:
    from openroute.messaging import InMemorySink

    sink_items: list[InMemorySink] = []

    def make() -> InMemorySink:
        sink = InMemorySink("tck", auto_ack=False)
        sink_items.append(sink)
        return sink

    await verify_subscriber(make)
    assert sink_items


async def test_watched_subscriber_passes_subscriber_verification() -> None:
    from openroute import streams as rs
    from openroute.messaging._stages import WatchedSubscriber

    assert await verify_subscriber(lambda: WatchedSubscriber(rs.builder().ignore().build())) == []


@pytest.mark.parametrize("prefetch", [0, 16])
async def test_consumer_subscriber_with_prefetch_passes_subscriber_verification(prefetch: int) -> None:
    assert await verify_subscriber(lambda: ConsumerSubscriber("tck", lambda item: None, 2, prefetch)) == []
