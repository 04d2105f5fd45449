"""Node state (RUN / HANDLES_EXISTING_MESSAGES / STOPPED): the engine obeys it, the admin API reads and sets it."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import AsyncIterator

import httpx
import pytest
from openroute.persistence import MessageState, MessageStore, NodeState

from openroute import Exchange, Route, RouteRegistry
from openroute.definitions.errors import NodeNotAcceptingError
from openroute.definitions.message import InboundMessage
from openroute.engine import Engine, EngineSettings
from openroute.inbound import AdminAuth, AdminUser
from openroute.server import create_app


def _step(exchange: Exchange) -> None:
    return None


def registry() -> RouteRegistry:
    return RouteRegistry([Route("orders", "create", [_step])])


def inbound(correlation_id: str) -> InboundMessage:
    return InboundMessage(service="orders", operation="create", payload="{}", content_type="application/json",
                          correlation_id=correlation_id, source_system="CRM")


def basic(user: str, password: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


ADMIN, WEB = basic("ops", "ops-secret"), basic("viewer", "viewer-secret")


@pytest.fixture
async def engine(store: MessageStore) -> AsyncIterator[Engine]:
    node = Engine(store, registry(), EngineSettings(repoll_interval=None, node_id="node-a"))
    await node.start()
    yield node
    await node.stop()


@pytest.fixture
async def client(engine: Engine) -> AsyncIterator[httpx.AsyncClient]:
    auth = AdminAuth([AdminUser("ops", "ops-secret"), AdminUser("viewer", "viewer-secret", frozenset({"web"}))])
    app = create_app(engine, admin_auth=auth, manage_engine=False)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://testserver") as http:
        yield http


async def test_a_drained_node_refuses_new_messages_and_finishes_stored_ones(
    engine: Engine, store: MessageStore
) -> None:
    feeder = Engine(store, registry(), EngineSettings(repoll_interval=None, node_id="feeder"))  # never started
    stored = (await feeder.accept(inbound("before"))).message_id  # stays NEW: nobody queued it
    await feeder.stop()
    await engine.set_node_state("node-a", NodeState.STOPPED)
    await engine.repoll_once(new_cutoff=engine.clock.now())
    assert store.get(stored).state is MessageState.NEW  # a STOPPED node picks up no work
    with pytest.raises(NodeNotAcceptingError, match="node-a is STOPPED"):
        await engine.accept(inbound("stopped"))
    await engine.set_node_state("node-a", NodeState.HANDLES_EXISTING_MESSAGES)
    assert store.nodes.state_of("node-a") is NodeState.HANDLES_EXISTING_MESSAGES
    with pytest.raises(NodeNotAcceptingError, match="node-a is HANDLES_EXISTING_MESSAGES"):
        await engine.accept(inbound("after"))
    await engine.repoll_once(new_cutoff=engine.clock.now())
    await engine.wait_idle(20)
    assert store.get(stored).state is MessageState.OK  # draining still finishes stored messages
    assert store.count_by_state().get(MessageState.NEW, 0) == 0  # "after" was never stored
    await engine.set_node_state("node-a", NodeState.RUN)
    assert (await engine.accept(inbound("again"))).state is MessageState.NEW


async def test_a_node_reads_its_state_at_heartbeat_and_keeps_it_across_restarts(
    engine: Engine, store: MessageStore
) -> None:
    other = Engine(store, registry(), EngineSettings(repoll_interval=None, node_id="node-b"))
    await other.start()
    try:
        await engine.set_node_state("node-b", NodeState.HANDLES_EXISTING_MESSAGES)  # set from another node
        assert other.node_state is NodeState.RUN
        await other._repoll.heartbeat()
        assert other.node_state is NodeState.HANDLES_EXISTING_MESSAGES
    finally:
        await other.stop()
    again = Engine(store, registry(), EngineSettings(repoll_interval=None, node_id="node-b"))
    await again.start()
    try:
        assert again.node_state is NodeState.HANDLES_EXISTING_MESSAGES
    finally:
        await again.stop()
    with pytest.raises(LookupError):
        await engine.set_node_state("nobody", NodeState.RUN)


async def test_admin_api_lists_and_drains_nodes(client: httpx.AsyncClient, engine: Engine) -> None:
    listed = await client.get("/admin/nodes", headers=WEB)
    assert listed.status_code == 200
    [node] = listed.json()["nodes"]
    assert node["id"] == "node-a" and node["state"] == "RUN" and node["alive"] is True
    response = await client.post("/admin/nodes/node-a/state", json={"state": "HANDLES_EXISTING_MESSAGES"},
                                 headers=ADMIN)
    assert response.status_code == 200 and response.json() == {"id": "node-a", "state": "HANDLES_EXISTING_MESSAGES"}
    assert engine.node_state is NodeState.HANDLES_EXISTING_MESSAGES
    sent = await client.post("/api/orders/create", json={}, headers={"X-Correlation-Id": "x-1",
                                                                     "X-Source-System": "CRM"})
    assert sent.status_code == 503 and sent.json()["error"] == "NODE_NOT_ACCEPTING"
    assert (await client.get("/admin/nodes", headers=ADMIN)).json()["nodes"][0]["state"] == (
        "HANDLES_EXISTING_MESSAGES"
    )


@pytest.mark.parametrize(
    ("path", "body", "headers", "status", "code"),
    [
        ("/admin/nodes/node-a/state", {"state": "SLEEPING"}, ADMIN, 400, "INVALID_QUERY"),
        ("/admin/nodes/node-a/state", {}, ADMIN, 400, "INVALID_QUERY"),
        ("/admin/nodes/node-a/state", ["RUN"], ADMIN, 400, "INVALID_QUERY"),
        ("/admin/nodes/nobody/state", {"state": "RUN"}, ADMIN, 404, "NOT_FOUND"),
        ("/admin/nodes/node-a/state", {"state": "STOPPED"}, WEB, 403, "FORBIDDEN"),
        ("/admin/nodes/node-a/state", {"state": "STOPPED"}, {}, 401, "UNAUTHENTICATED"),
    ],
)
async def test_bad_node_state_requests(
    client: httpx.AsyncClient, engine: Engine, path: str, body: object, headers: dict[str, str], status: int,
    code: str,
) -> None:
    response = await client.post(path, json=body, headers=headers)
    assert response.status_code == status and response.json()["error"] == code
    assert engine.node_state is NodeState.RUN


async def test_malformed_json_body_is_a_400(client: httpx.AsyncClient) -> None:
    response = await client.post("/admin/nodes/node-a/state", content=b"{not json",
                                 headers={**ADMIN, "Content-Type": "application/json"})
    assert response.status_code == 400 and "must be JSON" in response.json()["reason"]


async def test_web_role_reads_but_cannot_act(client: httpx.AsyncClient, engine: Engine) -> None:
    message_id = (await engine.accept(inbound("w-1"))).message_id
    await asyncio.wait_for(engine.wait_idle(20), 30)
    assert (await client.get("/admin/messages", headers=WEB)).status_code == 200
    assert (await client.get(f"/admin/messages/{message_id}", headers=WEB)).status_code == 200
    assert (await client.get("/admin/counts", headers=WEB)).status_code == 200
    refused = await client.post(f"/admin/messages/{message_id}/cancel", json={}, headers=WEB)
    assert refused.status_code == 403 and "'admin'" in refused.json()["reason"]
