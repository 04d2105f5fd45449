"""An accepted message that finds room in its node's queue is claimed in its accept's own transaction: stored
PROCESSING for the node with both transition rows, and queued claimed. Funnel messages, a full queue and duplicates
keep the path of a separate claim."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import sqlalchemy as sa
from openroute.persistence import MessageState, MessageStore, StoredMessage

from openroute import Route
from tests.lifecycle.conftest import START, EngineFactory, inbound

S = MessageState
WAIT = 20.0


def _route(*steps: Any, **extra: Any) -> Route:
    return Route("orders", "create", list(steps), **extra)


@contextmanager
def _statements(store: MessageStore) -> Iterator[list[str]]:
    """The SQL texts ``store`` runs meanwhile (the writer's hot path tells the cursor listeners too)."""
    seen: list[str] = []

    def heard(_conn: Any, _cursor: Any, statement: str, *_rest: Any) -> None:
        seen.append(" ".join(statement.split()))

    sa.event.listen(store.engine, "before_cursor_execute", heard)
    try:
        yield seen
    finally:
        sa.event.remove(store.engine, "before_cursor_execute", heard)


def _history(store: MessageStore, message_id: int) -> list[tuple[Any, ...]]:
    return [(row["from_state"], row["to_state"], row["at"], row["node_id"], row["attempt"], row["cause"])
            for row in store.transitions.of(message_id)]


async def test_the_accept_stores_its_message_claimed_and_the_worker_runs_it_without_a_claim_of_its_own(
    store: MessageStore, make_engine: EngineFactory
) -> None:
    running, release = asyncio.Event(), asyncio.Event()
    seen: list[StoredMessage] = []

    async def step(exchange: Any) -> None:
        seen.append(exchange.message)
        running.set()
        await release.wait()

    engine = make_engine(_route(step))
    heard: list[tuple[S | None, S, int]] = []
    engine.on_transition(lambda previous, message: heard.append((previous, message.state, message.version)))
    await engine.start()
    with _statements(store) as statements:
        result = await engine.accept(inbound())
        await running.wait()
    # the sender is told NEW, the state its message entered the store in; the store has it claimed for the node
    assert result.state is S.NEW and not result.duplicate
    row = store.get(result.message_id)
    assert row is not None
    assert (row.state, row.version, row.node_id, row.start_process_ts, row.last_update_ts) == (
        S.PROCESSING, 1, "node-1", START, START)
    assert _history(store, row.id) == [(None, S.NEW, START, "node-1", 1, "engine"),
                                       (S.NEW, S.PROCESSING, START, "node-1", 1, "engine")]
    assert not [sql for sql in statements if sql.startswith("UPDATE message")]  # no claim statement of its own
    assert seen[0].state is S.PROCESSING and seen[0].version == 1
    release.set()
    await engine.wait_idle(WAIT)
    done = store.get(result.message_id)
    assert done is not None and (done.state, done.version) == (S.OK, 2)
    assert [to for _from, to, *_rest in _history(store, done.id)] == [S.NEW, S.PROCESSING, S.OK]
    # the listeners hear NEW, then PROCESSING, as when the claim came after the accept
    assert heard == [(None, S.NEW, 0), (S.NEW, S.PROCESSING, 1), (S.PROCESSING, S.OK, 2)]
    assert (engine.stats.accepted, engine.stats.claimed, engine.stats.claimed_at_accept) == (1, 1, 1)


async def test_a_funnel_message_is_stored_new_and_claimed_as_before(
    store: MessageStore, make_engine: EngineFactory
) -> None:
    engine = make_engine(_route(lambda exchange: None))
    await engine.start()
    with _statements(store) as statements:
        result = await engine.accept(inbound(funnel_value="customer-7"))
        await engine.wait_idle(WAIT)
    assert [to for _from, to, *_rest in _history(store, result.message_id)] == [S.NEW, S.PROCESSING, S.OK]
    # its claim is an UPDATE of its own, after the funnel's turn
    assert any(sql.startswith("UPDATE message SET state = ") and "start_process_ts = " in sql for sql in statements)
    assert (engine.stats.claimed, engine.stats.claimed_at_accept) == (1, 0)


async def test_an_accept_that_finds_the_queue_full_stores_new_for_the_feeder(
    store: MessageStore, make_engine: EngineFactory
) -> None:
    running, release = asyncio.Event(), asyncio.Event()

    async def step(exchange: Any) -> None:
        running.set()
        await release.wait()

    engine = make_engine(_route(step), concurrency=1, queue_size=1)  # room for two messages
    await engine.start()
    await engine.accept(inbound("c-1"))
    await running.wait()
    queued = await engine.accept(inbound("c-2"))  # waits for the worker, claimed
    full = await engine.accept(inbound("c-3"))
    states = {m.correlation_id: (m.state, m.node_id, m.version) for m in store.find()}
    assert states == {"c-1": (S.PROCESSING, "node-1", 1), "c-2": (S.PROCESSING, "node-1", 1), "c-3": (S.NEW, None, 0)}
    assert _history(store, full.message_id) == [(None, S.NEW, START, "node-1", 1, "engine")]
    release.set()
    await engine.wait_idle(WAIT)
    assert {m.correlation_id: m.state for m in store.find()} == {"c-1": S.OK, "c-2": S.OK, "c-3": S.OK}
    assert engine.stats.claimed_at_accept == 2 and engine.stats.claimed == 3
    assert [to for _from, to, *_rest in _history(store, queued.message_id)] == [S.NEW, S.PROCESSING, S.OK]


async def test_a_duplicate_is_not_claimed_and_gives_its_room_back(
    store: MessageStore, make_engine: EngineFactory
) -> None:
    engine = make_engine(_route(lambda exchange: None), concurrency=1, queue_size=1)  # room for two messages
    await engine.start()
    first = await engine.accept(inbound("c-1"))
    await engine.wait_idle(WAIT)
    for _ in range(2):
        again = await engine.accept(inbound("c-1", payload="different"))
        assert again.duplicate and again.message_id == first.message_id and again.state is S.OK
    row = store.get(first.message_id)
    assert row is not None and (row.state, row.version) == (S.OK, 2)
    # the duplicates' reserved room is free again: the next message is claimed at its accept too
    await engine.accept(inbound("c-2"))
    await engine.wait_idle(WAIT)
    assert engine.stats.claimed_at_accept == 2 and engine.stats.duplicates == 2
    assert {m.correlation_id: m.state for m in store.find()} == {"c-1": S.OK, "c-2": S.OK}


async def test_a_message_whose_accept_was_cancelled_during_its_insert_is_still_processed(
    store: MessageStore, make_engine: EngineFactory
) -> None:
    engine = make_engine(_route(lambda exchange: None))
    finished = asyncio.Event()

    async def final(_message: StoredMessage) -> None:
        finished.set()

    engine.on_final_state(final)
    await engine.start()
    accepting = asyncio.ensure_future(engine.accept(inbound()))
    await asyncio.sleep(0)  # the accept queued its insert, claimed for this node
    accepting.cancel()
    await asyncio.wait({accepting})
    assert accepting.cancelled()
    # its insert committed all the same: the message is not left PROCESSING for the lease, it runs here
    await asyncio.wait_for(finished.wait(), WAIT)
    await engine.wait_idle(WAIT)
    (row,) = store.find()
    assert (row.state, row.version, row.node_id) == (S.OK, 2, "node-1")
    assert [to for _from, to, *_rest in _history(store, row.id)] == [S.NEW, S.PROCESSING, S.OK]
    assert engine.stats.claimed_at_accept == 1 and engine.queued == 0
