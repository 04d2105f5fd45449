"""Two engine nodes on one database never run two messages of one funnel value at the same time."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

from openroute.persistence import MessageState, MessageStore

from openroute import Exchange, Route, RouteRegistry
from openroute.definitions.clock import ManualClock
from openroute.definitions.message import InboundMessage
from openroute.engine import Engine, EngineSettings


async def test_two_nodes_keep_one_funnel_value_single_file(postgres_url: str) -> None:
    store = MessageStore(postgres_url)
    store.create_schema()
    clock = ManualClock(datetime(2030, 1, 1, tzinfo=UTC))
    running: dict[str, int] = {"a": 0, "b": 0}
    peak: dict[str, int] = {"a": 0, "b": 0}
    done = 0

    async def step(exchange: Exchange) -> None:
        nonlocal done
        funnel = exchange.message.funnel_value or ""
        running[funnel] += 1
        peak[funnel] = max(peak[funnel], running[funnel])
        for _ in range(3):
            await asyncio.sleep(0)  # give the other node's workers a chance to interleave
        running[funnel] -= 1
        done += 1

    routes = RouteRegistry([Route("crm", "update", [step])])
    settings = dict(repoll_interval=None, postpone_interval=timedelta(seconds=1), concurrency=8)
    nodes = [Engine(store, routes, EngineSettings(node_id=f"n{i}", **settings), clock=clock) for i in (1, 2)]
    try:
        for node in nodes:
            await node.start()
        sends = [
            nodes[i % 2].accept(InboundMessage(service="crm", operation="update", payload="{}",
                                               content_type="application/json", correlation_id=f"m-{i}",
                                               source_system="crm", funnel_value="ab"[i % 4 // 2]))
            for i in range(40)
        ]
        await asyncio.gather(*sends)
        async with asyncio.timeout(60):
            while store.count_by_state() != {MessageState.OK: 40}:
                for node in nodes:
                    await node.wait_idle(20)
                clock.advance(timedelta(seconds=2))
                for node in nodes:
                    await node.repoll_once()
        assert peak == {"a": 1, "b": 1}
        assert done == 40
    finally:
        for node in nodes:
            await node.stop()
        store.dispose()
