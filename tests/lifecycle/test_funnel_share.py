"""Each node's share of the funnel values (``FunnelShare``): when many funnels' oldest messages are due at once (a
breaker closed), every node's feed takes those of its share first, so the funnels' queues run on every node instead
of on the node whose feed came first. The other shares' messages are taken once they are a grace overdue."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest
import sqlalchemy as sa
from openroute.persistence import FunnelShare, MessageState, MessageStore, NewMessage, NodeState

from openroute.definitions.clock import ManualClock
from openroute.definitions.route import Route, RouteRegistry
from openroute.engine import Engine, EngineSettings
from tests.lifecycle.conftest import START

S = MessageState
GRACE = timedelta(seconds=1)


def _due(store: MessageStore, correlation_id: str, funnel_value: str | None) -> int:
    """A message POSTPONED and due at START (as a release leaves a funnel's oldest)."""
    stored = store.insert_message(NewMessage(
        service="orders", operation="create", payload="{}", content_type="application/json",
        correlation_id=correlation_id, source_system="CRM", receive_ts=START, funnel_value=funnel_value)).message
    assert store.transitions.apply((stored.id, 0, S.NEW, S.POSTPONED, START, {"next_attempt_at": START}))
    return stored.id


def _buckets(store: MessageStore, values: list[str], count: int) -> dict[str, int]:
    """Which share each value falls in, as PostgreSQL computes it."""
    with store.engine.connect() as connection:
        return {value: connection.execute(sa.text("SELECT (hashtext(:v) & 2147483647) % :n"),
                                          {"v": value, "n": count}).scalar_one() for value in values}


def test_a_share_takes_its_funnel_values_every_message_without_one_and_the_others_once_overdue(
    store: MessageStore,
) -> None:
    values = [f"customer-{i}" for i in range(30)]
    funnel_ids = {value: _due(store, f"m-{value}", value) for value in values}
    plain = [_due(store, f"plain-{i}", None) for i in range(3)]

    def taken(share: FunnelShare | None, now: object = START) -> set[int]:
        return {message.id for message in store.ready(now, None, 100, share=share)}  # type: ignore[arg-type]

    shares = [FunnelShare(index, 2, GRACE) for index in range(2)]
    if store.dialect != "postgresql":  # SQLite has no hashtext: every node takes every value
        assert taken(shares[0]) == taken(shares[1]) == {*funnel_ids.values(), *plain}
        return
    buckets = _buckets(store, values, 2)
    assert set(buckets.values()) == {0, 1}
    for index, share in enumerate(shares):
        assert taken(share) == {funnel_ids[v] for v in values if buckets[v] == index} | set(plain)
    assert taken(FunnelShare(0, 1, GRACE)) == taken(None) == {*funnel_ids.values(), *plain}
    overdue = START + GRACE  # nobody took the other share in time: any node takes it
    assert taken(shares[0], overdue) == {*funnel_ids.values(), *plain}


def test_a_share_index_outside_the_count_is_refused() -> None:
    with pytest.raises(ValueError, match="index"):
        FunnelShare(2, 2, GRACE)


def test_the_working_nodes_are_those_that_beat_lately_and_pick_up_work(store: MessageStore) -> None:
    nodes = store.nodes
    for node_id in ("node-c", "node-a", "node-b", "node-old", "node-stopped", "node-off"):
        nodes.register(node_id, START)
    nodes.heartbeat("node-old", START - timedelta(minutes=5))
    nodes.register("node-old", START - timedelta(minutes=5))
    nodes.stopped("node-stopped", START)
    nodes.set_state("node-off", NodeState.STOPPED)
    assert nodes.working(START - timedelta(minutes=1)) == ["node-a", "node-b", "node-c"]


class Hold:
    """A step that records which messages ran and holds them all until opened."""

    def __init__(self) -> None:
        self.ran: list[str] = []
        self.opened = asyncio.Event()

    async def step(self, exchange: object) -> None:
        self.ran.append(exchange.message.funnel_value)  # type: ignore[attr-defined]
        await self.opened.wait()


@pytest.mark.parametrize("database_url", ["postgres"], indirect=True)
async def test_two_nodes_feeding_at_once_each_take_the_funnels_of_their_share(database_url: str) -> None:
    setup = MessageStore(database_url)
    setup.create_schema()
    values = [f"customer-{i}" for i in range(24)]
    clock = ManualClock(START)  # frozen: the other share's messages never become overdue here
    holds = [Hold(), Hold()]
    stores = [MessageStore(database_url) for _ in range(2)]
    nodes = [Engine(s, RouteRegistry([Route("orders", "create", [hold.step])]),
                    EngineSettings(node_id=f"node-{i}", repoll_interval=None), clock=clock)
             for i, (s, hold) in enumerate(zip(stores, holds, strict=True))]
    try:
        for node in nodes:
            await node.start()
        for node in nodes:  # the second node registered after the first took its share at start
            await node._repoll.heartbeat()
        for value in values:  # due at once, as a breaker's close leaves every funnel's oldest
            _due(setup, f"m-{value}", value)
        await asyncio.gather(*(node.repoll_once() for node in nodes))
        await asyncio.wait_for(_until(lambda: len(holds[0].ran) + len(holds[1].ran) == len(values)), timeout=15)

        buckets = _buckets(setup, values, 2)
        for index, hold in enumerate(holds):
            assert sorted(hold.ran) == sorted(v for v in values if buckets[v] == index), f"node-{index}"
    finally:
        for hold in holds:
            hold.opened.set()
        for node in nodes:
            await node.stop()
        for store in (*stores, setup):
            store.dispose()


async def _until(done: object) -> None:
    while not done():  # type: ignore[operator]
        await asyncio.sleep(0.01)
