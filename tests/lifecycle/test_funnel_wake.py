"""Funnel wake-up: a message postponed behind its funnel's holder runs as soon as the holder ends, not after
``postpone_interval`` (an hour here, and no repoll runs): in-process on SQLite and PostgreSQL, and across two nodes
(two engines on their own connections) through PostgreSQL's LISTEN/NOTIFY."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from datetime import timedelta

import pytest
from openroute.persistence import MessageState, MessageStore

from openroute.engine import Engine, EngineSettings
from openroute.route import Route, RouteRegistry
from tests.lifecycle.conftest import inbound

HOUR = timedelta(hours=1)


def _settings(node_id: str, **values: object) -> EngineSettings:
    return EngineSettings(node_id=node_id, repoll_interval=None, postpone_interval=HOUR, **values)  # type: ignore[arg-type]


async def _wait_for(check: Callable[[], Awaitable[bool]], what: str, timeout: float = 15) -> None:
    deadline = time.monotonic() + timeout
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout} s")
        await asyncio.sleep(0.02)


def _state_is(store: MessageStore, message_id: int, state: MessageState) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        message = await asyncio.to_thread(store.get, message_id)
        return message is not None and message.state is state
    return check


def _gated_route(gate: asyncio.Event, ran: list[str]) -> Route:
    async def step(exchange: object) -> None:
        ran.append(exchange.message.correlation_id)  # type: ignore[attr-defined]
        if exchange.message.correlation_id == "first":  # type: ignore[attr-defined]
            await gate.wait()
    return Route("orders", "create", [step])


async def _second_held_behind_first(
    first_node: Engine, ran: list[str], second_node: Engine, second_store: MessageStore, funnel_value: str
) -> tuple[int, int]:
    """Accepts "first" on ``first_node`` and waits until its step runs (it appears in ``ran``), then "second" of the
    same funnel value on ``second_node`` and waits until it is POSTPONED; returns the two message ids."""
    first = await first_node.accept(inbound("first", funnel_value=funnel_value))
    await _wait_for(lambda: asyncio.sleep(0, result="first" in ran), f"first message running on {first_node.node_id}")
    second = await second_node.accept(inbound("second", funnel_value=funnel_value))
    await _wait_for(_state_is(second_store, second.message_id, MessageState.POSTPONED),
                    f"second held by the funnel on {second_node.node_id}")
    return first.message_id, second.message_id


async def test_next_funnel_message_runs_when_the_holder_ends(store: MessageStore) -> None:
    gate, ran = asyncio.Event(), []
    engine = Engine(store, RouteRegistry([_gated_route(gate, ran)]), _settings("solo"))
    await engine.start()
    try:
        first_id, second_id = await _second_held_behind_first(engine, ran, engine, store, "customer-7")
        assert (await asyncio.to_thread(store.get, second_id)).last_error_code == "FUNNEL"  # type: ignore[union-attr]

        gate.set()
        await _wait_for(_state_is(store, first_id, MessageState.OK), "first OK")
        await _wait_for(_state_is(store, second_id, MessageState.OK), "second woken and OK")
        assert ran == ["first", "second"]  # the funnel holds a message back before its steps
    finally:
        await engine.stop()


@pytest.mark.parametrize("database_url", ["postgres"], indirect=True)
async def test_funnel_release_wakes_a_message_held_on_another_node(database_url: str) -> None:
    setup = MessageStore(database_url)
    setup.create_schema()
    setup.dispose()
    gate, ran_a, ran_b = asyncio.Event(), [], []
    store_a, store_b = MessageStore(database_url), MessageStore(database_url)
    node_a = Engine(store_a, RouteRegistry([_gated_route(gate, ran_a)]), _settings("node-a"))
    node_b = Engine(store_b, RouteRegistry([_gated_route(gate, ran_b)]), _settings("node-b"))
    await node_a.start()
    await node_b.start()
    try:
        first_id, second_id = await _second_held_behind_first(node_a, ran_a, node_b, store_b, "customer-9")

        gate.set()
        await _wait_for(_state_is(store_b, second_id, MessageState.OK), "second woken on node B and OK")
        assert ran_a == ["first"] and ran_b == ["second"]
        history = await asyncio.to_thread(store_b.transitions.of, second_id)
        assert [row["node_id"] for row in history if row["to_state"] == MessageState.OK] == ["node-b"]
        assert first_id != second_id
    finally:
        await node_a.stop()
        await node_b.stop()
        store_a.dispose()
        store_b.dispose()


@pytest.mark.parametrize("database_url", ["postgres"], indirect=True)
async def test_funnel_drain_rate_behind_a_slow_remote(store: MessageStore) -> None:
    """Prints the drain rate of 20 messages of one funnel value behind a 50 ms remote (benchmarks/funnel_bench.py
    drains 50); no timing is asserted."""
    async def remote(exchange: object) -> None:
        await asyncio.sleep(0.05)

    count = 20
    engine = Engine(store, RouteRegistry([Route("orders", "create", [remote])]), _settings("drain"))
    await engine.start()
    try:
        started = time.perf_counter()
        accepted = [await engine.accept(inbound(f"m-{i}", funnel_value="one-object")) for i in range(count)]

        async def all_ok() -> bool:
            counts = await asyncio.to_thread(store.count_by_state)
            return counts.get(MessageState.OK, 0) == count
        await _wait_for(all_ok, f"{count} funnel messages OK", timeout=60)
        elapsed = time.perf_counter() - started
    finally:
        await engine.stop()
    assert len({a.message_id for a in accepted}) == count
    print(f"\nfunnel drain: {count} messages of one funnel value behind a 50 ms remote in {elapsed:.2f} s "
          f"= {count / elapsed:.1f} messages/s")
