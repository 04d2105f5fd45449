"""The composition root: a :class:`~openroute.node.Node` built from a configuration serves a message to its final
state through its ASGI app, starts every part in order and stops them in the reverse one, also when a part fails to
start."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass

import httpx
import pytest
from openroute.persistence import MessageState, MessageStore

from openroute import route
from openroute.config import ServerConfig, load_config
from openroute.dsl import Application
from openroute.node import Node
from openroute.node_parts import NodePart

EVERY_PART = ("store", "wal-checkpoint", "outbox", "engine", "outbox-publisher", "confirmations", "retention",
              "alerts", "message-counts", "payload-index", "channels")


def application() -> Application:
    return Application(route("shop", "order").json().from_channel("orders").process(lambda exchange: None))


def config(url: str) -> ServerConfig:
    """A configuration asking for every optional part: retention, an alert rule, an outbox, a channel."""
    return load_config(None, {
        "database_url": url,
        "engine": {"node_id": "node-test"},
        "retention": {"keep": {"OK": "30d"}},
        "alerts": {"rules": {"failures": {"states": ["FAILED"], "window": "1h"}}},
        "throttling": {"CRM.order": "1000/60"},
        "openroute": {"messaging": {
            "incoming": {"orders": {"connector": "in-memory", "source-system": "CRM"}},
            "outgoing": {"events": {"connector": "in-memory", "outcome-events": "final"}},
        }},
    })


def url_of(store: MessageStore) -> str:
    return store.engine.url.render_as_string(hide_password=False)


async def final_state(node: Node, message_id: int, timeout: float = 20.0) -> MessageState:
    deadline = time.monotonic() + timeout
    while True:
        stored = node.store.get(message_id)
        state = stored.state if stored is not None else MessageState.NEW
        if state in (MessageState.OK, MessageState.FAILED) or time.monotonic() > deadline:
            return state
        await asyncio.sleep(0.02)


@dataclass
class Recorded:
    """A part of the node whose start and stop are written down (and whose start may be refused)."""

    part: NodePart
    calls: list[str]
    refuse: bool = False

    @property
    def name(self) -> str:
        return self.part.name

    async def start(self, stopping: asyncio.Event) -> None:
        self.calls.append(f"start {self.name}")
        if self.refuse:
            raise ConnectionRefusedError(f"{self.name}: refused")
        await self.part.start(stopping)

    async def stop(self) -> None:
        self.calls.append(f"stop {self.name}")
        await self.part.stop()


def recorded(node: Node, refused: str | None = None) -> list[str]:
    calls: list[str] = []
    node.parts = tuple(Recorded(part, calls, part.name == refused) for part in node.parts)
    return calls


async def test_a_node_from_the_configuration_serves_a_message_and_stops_every_part(store: MessageStore) -> None:
    node = Node.from_config(config(url_of(store)), application())
    assert node.store is not store  # the node opened its own, and disposes of it at stop
    assert node.app.state.node is node and node.app.state.engine is node.engine
    calls = recorded(node)
    async with node.running():
        assert node.started == EVERY_PART and node.engine.running
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=node.app), base_url="http://node") as client:
            answer = await client.post("/api/shop/order", content=json.dumps({"id": 1}),
                                       headers={"Content-Type": "application/json", "X-Source-System": "CRM"})
            assert answer.status_code == 202, answer.text
            message_id = int(answer.json()["messageId"])
            assert await final_state(node, message_id) == MessageState.OK
            assert (await client.get("/health")).status_code == 200
    assert calls == [f"start {name}" for name in EVERY_PART] + [f"stop {name}" for name in reversed(EVERY_PART)]
    assert node.started == () and not node.engine.running
    assert node.outbox is not None
    assert node.outbox.app.connector("in-memory").sink("events").payloads  # its outcome event was published


async def test_a_part_failing_to_start_stops_those_already_started_in_reverse(store: MessageStore) -> None:
    node = Node.from_config(config(url_of(store)), application(), store)
    assert "store" not in [part.name for part in node.parts]  # the caller's store stays the caller's
    calls = recorded(node, refused="alerts")
    with pytest.raises(ConnectionRefusedError, match="alerts: refused"):
        await node.start()
    before = EVERY_PART[1:EVERY_PART.index("alerts")]
    assert calls == ([f"start {name}" for name in before] + ["start alerts"]
                     + [f"stop {name}" for name in reversed(before)])
    assert node.started == () and not node.engine.running


async def test_the_lifespan_of_the_asgi_app_is_the_nodes(store: MessageStore) -> None:
    node = Node.from_config(config(url_of(store)), application(), store)
    async with node.app.router.lifespan_context(node.app):
        assert node.started == EVERY_PART[1:]
    assert node.started == ()


async def test_the_confirmations_write_through_the_engines_group_commit(store: MessageStore) -> None:
    """The composition root gives the confirmation service the engine's group commit (its claims and records share
    the writer's transactions); once the engine stopped, ``Engine.transact`` still runs work, in a transaction of its
    own."""
    node = Node.from_config(config(url_of(store)), application(), store)
    assert node.confirmation is not None and node.confirmation.transact == node.engine.transact
    writer = node.engine._pipeline.writer
    async with node.running():
        before = writer.operations
        assert await node.engine.transact(lambda connection: connection.exec_driver_sql("SELECT 1").scalar()) == 1
        assert writer.operations > before  # run by the writer, committed before its result came back
    done = writer.operations
    assert await node.engine.transact(lambda connection: connection.exec_driver_sql("SELECT 2").scalar()) == 2
    assert writer.operations == done
