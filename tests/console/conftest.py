"""A store with messages in several states, an engine node over it and console/admin clients."""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from openroute.persistence import MessageStore

from openroute import Exchange, Route, RouteRegistry
from openroute.definitions.errors import BusinessError
from openroute.definitions.message import InboundMessage
from openroute.engine import Engine, EngineSettings
from openroute.inbound import AdminAuth, AdminUser
from openroute.server import create_app
from tests._support.message_details import add_child_call_and_confirmation


def _step(exchange: Exchange) -> None:
    if "fail" in exchange.payload and not exchange.custom_data.get("restarted"):
        raise BusinessError("REFUSED", "customer blocked")


def registry() -> RouteRegistry:
    return RouteRegistry([Route("orders", "create", [_step]), Route("billing", "charge", [_step])])


def inbound(correlation_id: str, payload: str = "{}", **values: Any) -> InboundMessage:
    defaults: dict[str, Any] = {"service": "orders", "operation": "create", "source_system": "CRM",
                                "content_type": "application/json"}
    defaults.update(values)
    return InboundMessage(payload=payload, correlation_id=correlation_id, **defaults)


def basic(user: str, password: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


ADMIN = basic("ops", "ops-secret")
WEB = basic("viewer", "viewer-secret")
OTHER = basic("guest", "guest-secret")  # authenticated, but neither web nor admin


def auth() -> AdminAuth:
    return AdminAuth([AdminUser("ops", "ops-secret"), AdminUser("viewer", "viewer-secret", frozenset({"web"})),
                      AdminUser("guest", "guest-secret", frozenset({"guest"}))])


class World:
    """The node the console acts through and the ids of the stored messages by name."""

    def __init__(self, engine: Engine, ids: dict[str, int]) -> None:
        self.engine, self.ids = engine, ids
        self.store = engine.store


async def populate(store: MessageStore) -> dict[str, int]:
    """Two FAILED (one XML), one OK, processed by a worker node that stopped; then two NEW and a child."""
    worker = Engine(store, registry(), EngineSettings(repoll_interval=None, node_id="worker"))
    await worker.start()
    ids: dict[str, int] = {}
    for name, message in {
        "failed1": inbound("f-1", '{"fail": 1, "customer": {"id": "A-1"}}', object_id="A-1"),
        "failed2": inbound("f-2", "<charge><fail>2</fail><amount>10</amount></charge>", service="billing",
                           operation="charge", source_system="ERP", content_type="application/xml"),
        "ok": inbound("ok-1", object_id="A-1"),
    }.items():
        ids[name] = (await worker.accept(message)).message_id
    await worker.wait_idle(20)
    await worker.stop()
    feeder = Engine(store, registry(), EngineSettings(repoll_interval=None, node_id="feeder"))  # never started
    ids["new"] = (await feeder.accept(inbound("n-1", object_id="B-2", process_id="p-1"))).message_id
    ids["new2"] = (await feeder.accept(inbound("n-2", source_system="ERP"))).message_id
    await feeder.stop()
    ids["child"] = add_child_call_and_confirmation(store, ids["failed1"])
    return ids


@pytest.fixture
async def world(store: MessageStore) -> AsyncIterator[World]:
    ids = await populate(store)
    # not started, so the NEW messages stay NEW; a test that wants processing starts it
    node = Engine(store, registry(), EngineSettings(repoll_interval=None, node_id="console-node"))
    yield World(node, ids)
    await node.stop()


@pytest.fixture
async def client(world: World) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(world.engine, admin_auth=auth(), manage_engine=False)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://testserver") as http:
        yield http


