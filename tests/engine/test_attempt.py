"""An attempt is begun by a plain call (openroute/engine/attempt.py): one whose steps return at once and whose outcome
goes to the writer in the background ends in that call; one that waits, or whose outcome is awaited, hands back the
awaitable of the rest, with the same outcome."""

from __future__ import annotations

import asyncio
from typing import Any

from openroute.persistence import MessageState, MessageStore, StoredMessage

from openroute.definitions.message import InboundMessage
from openroute.definitions.route import Route, RouteRegistry
from openroute.engine import Engine, EngineSettings
from openroute.engine.attempt import IN_BACKGROUND


async def _waits(exchange: Any) -> None:
    await asyncio.sleep(0)


def _engine(store: MessageStore) -> Engine:
    routes = RouteRegistry([Route("s", "at-once", [lambda exchange: None]), Route("s", "waits", [_waits])])
    return Engine(store, routes, EngineSettings(node_id="n1", repoll_interval=None))


async def _claimed(engine: Engine, operation: str, key: str) -> StoredMessage:
    """A message of ``operation`` stored and claimed for the engine's node (the engine is not started: no worker
    takes it)."""
    accepted = await engine.accept(InboundMessage("s", operation, "{}", "application/json", key, "crm"))
    stored = engine.store.get(accepted.message_id)
    assert stored is not None
    claimed = await engine._pipeline.claim(stored)
    assert claimed is not None and claimed.state is MessageState.PROCESSING
    return claimed


async def _until_ok(store: MessageStore, message_id: int) -> None:
    async with asyncio.timeout(5):
        while (stored := store.get(message_id)) is None or stored.state is not MessageState.OK:
            await asyncio.sleep(0.01)


async def test_steps_that_return_at_once_end_the_attempt_in_the_call_its_outcome_in_the_background(
    store: MessageStore
) -> None:
    engine = _engine(store)
    try:
        claimed = await _claimed(engine, "at-once", "k-1")
        assert engine._attempts.begin(claimed, True) is IN_BACKGROUND
        await _until_ok(store, claimed.id)
    finally:
        await engine.stop()


async def test_a_step_that_waits_or_an_awaited_outcome_hands_back_the_rest(store: MessageStore) -> None:
    engine = _engine(store)
    try:
        waiting = await _claimed(engine, "waits", "k-1")
        rest = engine._attempts.begin(waiting, True)
        assert rest is not IN_BACKGROUND
        assert await rest is IN_BACKGROUND  # type: ignore[misc]
        await _until_ok(store, waiting.id)
        awaited = await _claimed(engine, "at-once", "k-2")
        rest = engine._attempts.begin(awaited, False)
        assert rest is not IN_BACKGROUND
        finished = await rest  # type: ignore[misc]
        assert isinstance(finished, StoredMessage) and finished.state is MessageState.OK
    finally:
        await engine.stop()
