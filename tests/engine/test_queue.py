"""The processing queue of one node (openroute/engine/queue.py): its bound, the ids it holds until they are done, the
room listener, idleness and the operator's node state, without an engine around it."""

from __future__ import annotations

import asyncio
import contextvars
from types import SimpleNamespace
from typing import Any

import pytest
from openroute.persistence import MessageState, NodeState

from openroute.engine.queue import ProcessingQueue


def _message(message_id: int) -> Any:
    return SimpleNamespace(id=message_id)  # the queue reads nothing of a message but its id


async def _started(concurrency: int, queue_size: int) -> tuple[ProcessingQueue, list[int], list[int]]:
    """A started queue whose workers note each message they take; and what its room listener heard (the room then)."""
    queue = ProcessingQueue(concurrency, queue_size)
    consumed: list[int] = []
    freed: list[int] = []

    async def consume(message: Any) -> None:
        consumed.append(message.id)

    queue.when_room_frees(lambda: freed.append(queue.room))
    await queue.start(consume)
    return queue, consumed, freed


async def _until(check: Any) -> None:
    async with asyncio.timeout(5):
        while not check():
            await asyncio.sleep(0.01)


async def test_a_message_holds_its_permit_until_it_is_done_not_until_its_worker_returns() -> None:
    queue, consumed, freed = await _started(concurrency=1, queue_size=1)
    try:
        assert queue.emit(_message(1)) and queue.emit(_message(2))
        assert not queue.emit(_message(3)), "queue_size + concurrency messages at most"
        await _until(lambda: consumed == [1, 2])
        assert (queue.ids, queue.room) == ({1, 2}, 0), "the outcomes are not committed yet"
        with pytest.raises(TimeoutError):
            await queue.wait_idle(0.05)
        queue.done_with(1)
        assert (queue.ids, queue.room, freed) == ({2}, 1, [1])
        queue.done_with(1)  # done twice (a refusal after the outcome, say): the permit is given back once
        assert (queue.room, freed) == (1, [1])
        queue.done_with(2)
        await queue.wait_idle(1)
    finally:
        await queue.stop(1)


async def test_a_message_claimed_for_the_node_passes_the_bound_and_a_queued_copy_takes_its_snapshot() -> None:
    queue, consumed, _freed = await _started(concurrency=1, queue_size=0)
    try:
        assert queue.emit(_message(1)) and queue.room == 0
        assert queue.emit_claimed(MessageState.NEW, _message(2)), "its claim counted it: the bound does not refuse it"
        claimed_again = _message(1)
        assert queue.emit_claimed(MessageState.POSTPONED, claimed_again), "queued already: not queued twice"
        await _until(lambda: sorted(consumed) == [1, 2])
        assert queue.claimed[1] == (MessageState.POSTPONED, claimed_again)
        assert queue.ids == {1, 2}
    finally:
        await queue.stop(1)


async def test_a_node_an_operator_stopped_queues_nothing_and_a_closed_queue_frees_room_silently() -> None:
    queue, _consumed, freed = await _started(concurrency=1, queue_size=1)
    try:
        queue.node_state = NodeState.STOPPED
        assert not queue.emit(_message(1)) and not queue.emit_claimed(MessageState.NEW, _message(2))
        assert not queue.claimed and not queue.ids
        queue.node_state = NodeState.HANDLES_EXISTING_MESSAGES  # draining: stored messages are still processed
        assert queue.emit(_message(3))
        queue.close()
        assert not queue.emit(_message(4))
        queue.done_with(3)
        assert freed == [], "no feed while the node stops"
        await queue.wait_idle(1)
    finally:
        await queue.stop(1)


_seen_by: contextvars.ContextVar[str] = contextvars.ContextVar("seen_by", default="nobody")


async def test_a_worker_runs_each_message_in_a_context_of_its_own() -> None:
    """One long-lived worker takes both messages: what the first one's attempt set in a context variable is gone for
    the second, and what the code that queued them had set reaches neither; the worker is the current task, so a
    step's ``asyncio.timeout`` works."""
    queue = ProcessingQueue(1, 4)
    seen: list[tuple[int, str, asyncio.Task[Any] | None]] = []

    async def consume(message: Any) -> None:
        async with asyncio.timeout(5):  # needs a current task
            seen.append((message.id, _seen_by.get(), asyncio.current_task()))
            _seen_by.set(f"message {message.id}")
            await asyncio.sleep(0)  # suspended once: the rest of the message runs in its context too
            assert _seen_by.get() == f"message {message.id}"

    await queue.start(consume)
    try:
        token = _seen_by.set("the accept")
        assert queue.emit(_message(1)) and queue.emit(_message(2))
        _seen_by.reset(token)
        await _until(lambda: len(seen) == 2)
        assert [(number, value) for number, value, _task in seen] == [(1, "nobody"), (2, "nobody")]
        assert seen[0][2] is seen[1][2] is not None, "one long-lived worker took both"
        assert _seen_by.get() == "nobody"
    finally:
        await queue.stop(1)


async def test_stop_lets_the_workers_finish_then_hands_them_the_waiting_messages() -> None:
    """stop(): the message in flight finishes within the timeout, then the waiting ones reach the consumer (the
    engine's skips them: they stay in the store) and the workers end."""
    queue = ProcessingQueue(1, 4)
    gate = asyncio.Event()
    consumed: list[int] = []

    async def consume(message: Any) -> None:
        if message.id == 1:
            await gate.wait()
        consumed.append(message.id)
        queue.done_with(message.id)

    await queue.start(consume)
    assert queue.emit(_message(1)) and queue.emit(_message(2)) and queue.emit(_message(3))
    await _until(lambda: queue.in_flight == 1)
    queue.close()
    assert not queue.emit(_message(4))
    stopping = asyncio.create_task(queue.stop(5))
    for _ in range(20):
        await asyncio.sleep(0)
    assert not stopping.done() and consumed == []
    gate.set()
    await asyncio.wait_for(stopping, 5)
    assert consumed == [1, 2, 3] and queue.in_flight == 0 and queue.queued == 0 and not queue.ids


async def test_stop_cancels_a_message_still_in_flight_after_the_timeout() -> None:
    queue = ProcessingQueue(2, 0)
    ended: list[str] = []

    async def consume(message: Any) -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            ended.append(f"{message.id} cancelled")
            raise

    await queue.start(consume)
    assert queue.emit(_message(1)) and queue.emit(_message(2))
    await _until(lambda: queue.in_flight == 2)
    await queue.stop(0.05)
    await _until(lambda: queue.in_flight == 0)
    assert sorted(ended) == ["1 cancelled", "2 cancelled"] and not queue.ids


async def test_while_a_message_waits_another_worker_takes_the_next_ones() -> None:
    """An idle worker is woken for a burst of messages and takes them one after the other; when one of them waits,
    another worker takes the rest, up to ``concurrency`` at a time."""
    queue = ProcessingQueue(2, 8)
    gate = asyncio.Event()
    started: list[int] = []
    finished: list[int] = []

    async def consume(message: Any) -> None:
        started.append(message.id)
        if message.id in (1, 2):
            await gate.wait()
        finished.append(message.id)
        queue.done_with(message.id)

    await queue.start(consume)
    try:
        for number in range(1, 6):
            assert queue.emit(_message(number))
        await _until(lambda: started == [1, 2])
        for _ in range(20):
            await asyncio.sleep(0)
        assert started == [1, 2] and queue.in_flight == 2 and queue.queued == 3, "two workers, both waiting"
        gate.set()
        await _until(lambda: sorted(finished) == [1, 2, 3, 4, 5])
        await queue.wait_idle(1)
    finally:
        await queue.stop(1)


async def test_a_burst_that_never_waits_gives_the_loop_a_turn_every_concurrency_messages() -> None:
    """A worker takes the waiting messages one after the other without the loop in between, but not more than
    ``concurrency`` of them (as many as a task per message ran in one loop iteration): what the loop had ready
    meanwhile (a request read, an accept) runs before the rest."""
    queue = ProcessingQueue(2, 8)
    order: list[Any] = []

    async def consume(message: Any) -> None:
        order.append(message.id)
        queue.done_with(message.id)

    await queue.start(consume)
    try:
        assert queue.emit(_message(0))
        await _until(lambda: order == [0])  # both workers started, and asleep
        for number in range(1, 7):
            assert queue.emit(_message(number))
        asyncio.get_running_loop().call_soon(order.append, "loop")
        await _until(lambda: len(order) == 8)
        assert order == [0, 1, 2, "loop", 3, 4, 5, 6], "one worker woken for the burst, a loop turn every 2"
    finally:
        await queue.stop(1)


async def test_a_consume_function_may_do_a_message_at_once_or_hand_back_the_coroutine_of_the_rest() -> None:
    queue = ProcessingQueue(1, 4)
    done: list[tuple[int, str]] = []
    current = contextvars.ContextVar("current", default=0)

    async def rest(message: Any) -> None:
        await asyncio.sleep(0)
        done.append((message.id, f"later, in context {current.get()}"))
        queue.done_with(message.id)

    def consume(message: Any) -> Any:
        current.set(message.id)  # each message in a copy of the queue's context, as a coroutine function's
        if message.id % 2:
            done.append((message.id, "at once"))
            queue.done_with(message.id)
            return None
        return rest(message)

    await queue.start(consume)
    try:
        for message_id in (1, 2, 3):
            assert queue.emit(_message(message_id))
        await queue.wait_idle(1)
        assert sorted(done) == [(1, "at once"), (2, "later, in context 2"), (3, "at once")]
        assert current.get() == 0, "nothing a message set reaches the queue's own context"
    finally:
        await queue.stop(1)
