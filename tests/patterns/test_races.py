"""Races of two transactions at once on PostgreSQL, made deterministic: the second one must wait for the lock.

Each test holds the first transaction open, starts the second on a thread, waits (bounded) until that one
blocks on a row lock or finishes, and only then commits the first.
"""

from __future__ import annotations

import time
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import UTC, datetime

import sqlalchemy as sa
from openroute.persistence import MessageState, MessageStore

from openroute import Route, RouteRegistry
from openroute.engine import Engine, EngineSettings, states
from tests.patterns.messages import insert_message, set_state

NOW = datetime(2030, 1, 1, tzinfo=UTC)


def _insert(store: MessageStore, key: str, operation: str = "update", **extra: object) -> int:
    extra.setdefault("funnel_value", "F")
    return insert_message(store, key, operation=operation, at=NOW, **extra)


def _waiting_on_a_lock(store: MessageStore) -> bool:
    query = sa.text("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                    "AND wait_event_type = 'Lock'")
    with store.engine.connect() as connection:
        return bool(connection.execute(query).scalar())


def _wait_until_blocked_or_done(store: MessageStore, future: Future[object]) -> None:
    deadline = time.monotonic() + 10
    while not future.done() and not _waiting_on_a_lock(store):
        assert time.monotonic() < deadline, "the second transaction neither finished nor waited on a lock"
        time.sleep(0.01)


def test_a_holder_taken_again_waits_for_a_concurrent_takeover(postgres_store: MessageStore) -> None:
    store = postgres_store
    holder, taker = _insert(store, "H"), _insert(store, "A")
    set_state(store, holder, MessageState.PROCESSING)
    assert store.funnels.acquire("F", holder, NOW) is None
    set_state(store, holder, MessageState.PARTLY_FAILED)  # its attempt ended: the funnel may be taken over
    set_state(store, taker, MessageState.PROCESSING)
    with ThreadPoolExecutor(1) as pool, store.engine.connect() as taking:
        with taking.begin():
            assert store.funnels.acquire("F", taker, NOW, taking) is None  # taken over, not committed yet
            set_state(store, holder, MessageState.PROCESSING)  # meanwhile another node claims the old holder
            again = pool.submit(store.funnels.acquire, "F", holder, NOW)
            _wait_until_blocked_or_done(store, again)
            assert not again.done(), "the old holder ran on while another message was taking its funnel over"
        assert again.result(timeout=10) == taker  # after the takeover committed: held by the taker


def test_two_children_finishing_at_once_end_the_parent_exactly_once(postgres_store: MessageStore) -> None:
    store = postgres_store
    routes = RouteRegistry([
        Route("crm", "order", [lambda exchange: None], child_routes=(("crm", "line"),)),
        Route("crm", "line", [lambda exchange: None]),
    ])
    engine = Engine(store, routes, EngineSettings(node_id="n1", repoll_interval=None))
    tx_hook_calls: list[tuple[int, MessageState]] = []
    engine.on_final_state_in_transaction(lambda message, connection: tx_hook_calls.append((message.id, message.state)))
    parent = _insert(store, "P", "order", funnel_value=None)
    children = [_insert(store, f"P:{n}", "line", funnel_value=None, parent_id=parent) for n in (1, 2)]
    set_state(store, parent, MessageState.WAITING_FOR_CHILDREN)
    for child in children:
        set_state(store, child, MessageState.PROCESSING)

    def finish(child: int, connection: sa.Connection) -> object:
        snapshot = store.get(child, connection)
        assert snapshot is not None
        states.transition(store, snapshot, MessageState.OK, NOW, {"next_attempt_at": None}, connection)
        return engine._pipeline.writes.complete_parent(parent, NOW, connection)

    def finish_second() -> object:
        with store.begin() as connection:
            return finish(children[1], connection)

    try:
        with ThreadPoolExecutor(1) as pool, store.engine.connect() as first:
            with first.begin():
                assert finish(children[0], first) is None  # the other child is still running, as this one sees it
                second = pool.submit(finish_second)
                _wait_until_blocked_or_done(store, second)
                assert not second.done(), "the second child decided the parent without waiting for the first"
            completed = second.result(timeout=10)
        assert getattr(completed, "state", None) is MessageState.OK
        final = store.get(parent)
        assert final is not None and final.state is MessageState.OK
        assert tx_hook_calls == [(parent, MessageState.OK)]
    finally:
        engine._reads.close()
