"""The messaging layer's own publishers, processors and subscribers pass the Reactive Streams verification kit."""

from __future__ import annotations

from typing import Any

import pytest

from openroute.messaging import Emitter, Message, OnOverflow
from openroute.messaging._stages import ChannelTap, ConsumerSubscriber, ProcessorStage
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
    assert "rule_1_9_subscribe_none_raises_type_error" not in skipped


async def test_channel_tap_passes_processor_verification() -> None:
    await verify_processor(lambda: ChannelTap("tck"))


@pytest.mark.parametrize("concurrency", [1, 4])
async def test_processor_stage_passes_processor_verification(concurrency: int) -> None:
    await verify_processor(lambda: ProcessorStage("tck", lambda item: (item,), concurrency))


async def test_async_processor_stage_passes_processor_verification() -> None:
    async def handler(item: Any) -> tuple[Any, ...]:
        return (item,)

    await verify_processor(lambda: ProcessorStage("tck", handler, 2))


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
