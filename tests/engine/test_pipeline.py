"""The commit pipeline of one node (openroute/engine/pipeline.py) on a real store, without an engine around it: what
follows a commit and in which order, and a write another writer beat."""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from openroute.persistence import MessageState, MessageStore, StoredMessage

from openroute.definitions.clock import ManualClock
from openroute.definitions.message import InboundMessage
from openroute.definitions.route import RouteRegistry
from openroute.engine.funnel import FunnelQueue
from openroute.engine.outcome import Decision
from openroute.engine.pipeline import CommitPipeline
from openroute.engine.queue import ProcessingQueue
from openroute.engine.settings import EngineSettings

START = datetime(2024, 3, 1, 12, 0, tzinfo=UTC)
OK = Decision(MessageState.OK, {"next_attempt_at": None})


def _pipeline(store: MessageStore, events: list[tuple[Any, ...]]) -> CommitPipeline:
    """A pipeline whose transaction hook, listener and final-state hook note what they hear, in order."""
    clock = ManualClock(START)

    def in_transaction(messages: Sequence[StoredMessage], connection: sa.Connection) -> None:
        events.extend(("in the transaction", message.state) for message in messages)

    def listener(previous: MessageState | None, message: StoredMessage) -> None:
        events.append(("listener", previous, message.state))

    async def final(message: StoredMessage) -> None:
        events.append(("final-state hook", message.state))

    return CommitPipeline(store, clock, EngineSettings(node_id="n1"), ProcessingQueue(1, 1),
                          FunnelQueue(store, RouteRegistry([]), clock, "n1"), [final], [in_transaction], [listener])


async def _claimed(pipeline: CommitPipeline, key: str) -> StoredMessage:
    new = InboundMessage("orders", "create", "{}", "application/json", key, "crm").to_new_message(START)
    accepted, _ = await pipeline.insert(new)
    claimed = await pipeline.claim(accepted)
    assert claimed is not None and claimed.state is MessageState.PROCESSING
    return claimed


async def _closed(pipeline: CommitPipeline) -> None:
    await asyncio.get_running_loop().run_in_executor(None, pipeline.close)


async def test_a_final_change_runs_its_transaction_hook_then_the_listeners_then_the_final_state_hooks(
    store: MessageStore
) -> None:
    events: list[tuple[Any, ...]] = []
    pipeline = _pipeline(store, events)
    try:
        claimed = await _claimed(pipeline, "c-1")
        assert events == [], "the insert and the claim are the engine's to tell"
        done = await pipeline.apply(claimed, OK, START)
    finally:
        await _closed(pipeline)
    assert done is not None and done.state is MessageState.OK
    assert events == [("in the transaction", MessageState.OK), ("listener", MessageState.PROCESSING, MessageState.OK),
                      ("final-state hook", MessageState.OK)]
    assert pipeline.stats.outcomes[MessageState.OK] == 1


async def test_a_write_another_writer_beat_is_counted_and_nobody_hears_of_it(store: MessageStore) -> None:
    events: list[tuple[Any, ...]] = []
    pipeline = _pipeline(store, events)
    try:
        claimed = await _claimed(pipeline, "c-1")
        assert await pipeline.apply(claimed, OK, START) is not None
        events.clear()
        lost = await pipeline.apply(claimed, Decision(MessageState.FAILED, {"next_attempt_at": None}), START)
    finally:
        await _closed(pipeline)
    assert lost is None and events == []
    assert pipeline.stats.stale_writes == 1 and pipeline.stats.outcomes[MessageState.FAILED] == 0
    stored = store.get(claimed.id)
    assert stored is not None and stored.state is MessageState.OK


async def test_the_outcomes_of_one_transaction_reach_its_transaction_hook_together_in_order(
    store: MessageStore
) -> None:
    """A group commit's final messages reach a transaction hook in one call (a confirmation row each in one
    statement), in the order they were made final; a message that stays open is not among them."""
    heard: list[list[int]] = []

    def together(messages: Sequence[StoredMessage], connection: sa.Connection) -> None:
        heard.append([message.id for message in messages])

    pipeline = _pipeline(store, [])
    pipeline.writes.final_state_tx_hooks.append(together)
    try:
        first, second, third = [await _claimed(pipeline, f"c-{n}") for n in range(3)]
        with store.begin() as connection:
            results = pipeline.writes.finish_many(connection, [
                (second, MessageState.OK, START, {}),
                (first, MessageState.PARTLY_FAILED, START, {"next_attempt_at": START}),
                (third, MessageState.FAILED, START, {}),
            ])
    finally:
        await _closed(pipeline)
    assert [result.state for result in results] == [MessageState.OK, MessageState.PARTLY_FAILED, MessageState.FAILED]
    assert heard == [[second.id, third.id]]


def _in_background(pipeline: CommitPipeline, claimed: StoredMessage, decision: Decision) -> asyncio.Future[int]:
    """``apply_in_background``'s end as a future: the message id, once its follow-up is over (its room in the queue
    freed)."""
    over: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    pipeline.queue.written = over.set_result  # type: ignore[method-assign]
    pipeline.apply_in_background(claimed, decision, START)
    return over


async def test_an_outcome_written_in_the_background_is_followed_as_an_awaited_one(store: MessageStore) -> None:
    """``apply_in_background`` (a worker's outcome: no task of its own) runs the same follow-up in the same order,
    and tells its end only once the final-state hooks are over."""
    events: list[tuple[Any, ...]] = []
    pipeline = _pipeline(store, events)
    try:
        claimed = await _claimed(pipeline, "c-1")
        ended = await _in_background(pipeline, claimed, OK)
    finally:
        await _closed(pipeline)
    assert ended == claimed.id
    assert events == [("in the transaction", MessageState.OK), ("listener", MessageState.PROCESSING, MessageState.OK),
                      ("final-state hook", MessageState.OK)]
    assert pipeline.stats.outcomes[MessageState.OK] == 1
    stored = store.get(claimed.id)
    assert stored is not None and stored.state is MessageState.OK and stored.version == claimed.version + 1


async def test_a_final_state_hook_that_waits_holds_the_background_outcome_until_it_is_done(
    store: MessageStore
) -> None:
    """A hook that suspends (a confirmation sent at once) goes on in a task, in the context the outcome was written
    from; the hooks after it run after it, and the outcome's future waits for them."""
    events: list[tuple[Any, ...]] = []
    pipeline = _pipeline(store, events)
    released = asyncio.Event()
    entered = asyncio.Event()
    caller: contextvars.ContextVar[str] = contextvars.ContextVar("caller", default="none")

    async def waiting(message: StoredMessage) -> None:
        events.append(("waiting hook starts", caller.get()))
        entered.set()
        await released.wait()
        events.append(("waiting hook ends", caller.get()))

    async def last(message: StoredMessage) -> None:
        events.append(("last hook", message.state))

    pipeline.final_state_hooks[:] = [waiting, last]
    try:
        claimed = await _claimed(pipeline, "c-1")
        caller.set("worker")
        done = _in_background(pipeline, claimed, OK)
        await entered.wait()
        assert not done.done(), "the outcome's end waits for its hooks"
        released.set()
        ended = await done
    finally:
        await _closed(pipeline)
    assert ended == claimed.id
    assert events[-3:] == [("waiting hook starts", "worker"), ("waiting hook ends", "worker"),
                           ("last hook", MessageState.OK)]


async def test_a_background_outcome_another_writer_beat_is_counted_and_nobody_hears_of_it(
    store: MessageStore
) -> None:
    events: list[tuple[Any, ...]] = []
    pipeline = _pipeline(store, events)
    try:
        claimed = await _claimed(pipeline, "c-1")
        assert await pipeline.apply(claimed, OK, START) is not None
        events.clear()
        lost = await _in_background(pipeline, claimed, Decision(MessageState.FAILED, {"next_attempt_at": None}))
    finally:
        await _closed(pipeline)
    assert lost == claimed.id and events == []
    assert pipeline.stats.stale_writes == 1 and pipeline.stats.outcomes[MessageState.FAILED] == 0


async def test_final_state_hooks_run_at_once_until_one_waits_and_the_rest_follow_in_order(store: MessageStore) -> None:
    heard: list[str] = []
    pipeline = _pipeline(store, [])
    release = asyncio.get_running_loop().create_future()

    async def first(message: StoredMessage) -> None:
        heard.append("first")

    async def failing(message: StoredMessage) -> None:
        raise RuntimeError("a hook's bug")

    async def waiting(message: StoredMessage) -> None:
        heard.append("waiting starts")
        await release
        heard.append("waiting ends")

    def a_future(message: StoredMessage) -> asyncio.Future[None]:  # a hook may return any awaitable
        heard.append("future")
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        done.set_result(None)
        return done

    async def last(message: StoredMessage) -> None:
        heard.append("last")

    try:
        message = await _claimed(pipeline, "m-1")
        pipeline.final_state_hooks[:] = [first, failing, last]
        assert pipeline.final_hooks_eagerly(message) is None, "no hook waited: nothing left to await"
        assert heard == ["first", "last"], "a failing hook is logged, the others run"
        heard.clear()
        pipeline.final_state_hooks[:] = [first, waiting, a_future, last]
        rest = pipeline.final_hooks_eagerly(message)
        assert rest is not None and heard == ["first", "waiting starts"]
        task = asyncio.ensure_future(rest)
        await asyncio.sleep(0)
        assert heard == ["first", "waiting starts"], "the rest waits for the hook that waits"
        release.set_result(None)
        await task
        assert heard == ["first", "waiting starts", "waiting ends", "future", "last"]
    finally:
        await _closed(pipeline)
