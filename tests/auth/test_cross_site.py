"""Cross-site requests cannot act through the admin API or the console; NUL in admin filters is a 400; security
headers on every response; ``/metrics`` behind credentials when configured (real store: SQLite and PostgreSQL)."""

from __future__ import annotations

import base64
import re
from collections.abc import AsyncIterator

import httpx
import pytest
from openroute.persistence import MessageState, MessageStore, NodeState

from openroute.auth.cross_site import check_origin, normalize_origins
from openroute.auth.headers import CONTENT_SECURITY_POLICY
from openroute.definitions.errors import ConfigurationError
from openroute.definitions.message import InboundMessage
from openroute.definitions.route import Route, RouteRegistry
from openroute.engine import Engine, EngineSettings, Exchange
from openroute.inbound import AdminAuth, AdminUser
from openroute.server import create_app


def _step(exchange: Exchange) -> None:
    return None


def registry() -> RouteRegistry:
    return RouteRegistry([Route("orders", "create", [_step])])


def basic(user: str, password: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


ADMIN, WEB = basic("ops", "ops-secret"), basic("viewer", "viewer-secret")
EVIL = "http://evil.example"


class Node:
    def __init__(self, engine: Engine, store: MessageStore, message_id: int, http: httpx.AsyncClient) -> None:
        self.engine, self.store, self.message_id, self.http = engine, store, message_id, http


def _users() -> AdminAuth:
    return AdminAuth([AdminUser("ops", "ops-secret"), AdminUser("viewer", "viewer-secret", frozenset({"web"}))])


@pytest.fixture
async def node(store: MessageStore) -> AsyncIterator[Node]:
    engine = Engine(store, registry(), EngineSettings(repoll_interval=None, node_id="node-x"))
    await engine.start()
    feeder = Engine(store, registry(), EngineSettings(repoll_interval=None, node_id="feeder"))  # never started
    message_id = (await feeder.accept(InboundMessage(
        service="orders", operation="create", payload="{}", content_type="application/json", correlation_id="x-1",
        source_system="CRM"))).message_id  # stays NEW: nobody queued it
    app = create_app(engine, admin_auth=_users(), manage_engine=False, allowed_origins=["https://ops.example"],
                     metrics_auth=True)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://node.local:8080") as http:
        yield Node(engine, store, message_id, http)
    await engine.stop()


def _unchanged(node: Node) -> None:
    message = node.store.get(node.message_id)
    assert message is not None and message.state is MessageState.NEW
    assert node.engine.node_state is NodeState.RUN
    assert {row["id"]: str(row["state"]) for row in node.store.nodes.all()}["node-x"] == NodeState.RUN.value


REFUSED = [
    ({"Origin": EVIL, "Content-Type": "text/plain"}, 403, "CROSS_SITE"),  # the forged request of the report
    ({"Origin": EVIL, "Content-Type": "application/json"}, 403, "CROSS_SITE"),
    ({"Origin": "null", "Content-Type": "application/json"}, 403, "CROSS_SITE"),  # a sandboxed frame
    ({"Origin": "http://node.local:8080.evil.example", "Content-Type": "application/json"}, 403, "CROSS_SITE"),
    ({"Content-Type": "text/plain"}, 415, "UNSUPPORTED_MEDIA_TYPE"),
    ({"Content-Type": "application/x-www-form-urlencoded"}, 415, "UNSUPPORTED_MEDIA_TYPE"),
    ({"Content-Type": "multipart/form-data; boundary=x"}, 415, "UNSUPPORTED_MEDIA_TYPE"),
    ({}, 415, "UNSUPPORTED_MEDIA_TYPE"),  # no body type at all: a bodiless fetch() of another page
]


async def test_cross_site_admin_actions_are_refused_and_change_nothing(node: Node) -> None:
    body = b'{"state": "STOPPED"}'
    for headers, status, code in REFUSED:
        for path in (f"/admin/messages/{node.message_id}/cancel", "/admin/nodes/node-x/state"):
            response = await node.http.post(path, content=body, headers={**ADMIN, **headers})
            assert (response.status_code, response.json()["error"]) == (status, code), (path, headers, response.text)
            assert "nothing was done" in response.json()["reason"]
    _unchanged(node)


async def test_same_site_and_listed_origins_may_act(node: Node) -> None:
    own = await node.http.post("/admin/nodes/node-x/state", json={"state": "RUN"},
                               headers={**ADMIN, "Origin": "http://node.local:8080"})
    assert own.status_code == 200, own.text
    listed = await node.http.post(f"/admin/messages/{node.message_id}/cancel", json={},
                                  headers={**ADMIN, "Origin": "https://ops.example:443"})
    assert listed.status_code == 200, listed.text
    assert node.store.get(node.message_id).state is MessageState.CANCEL  # type: ignore[union-attr]


async def test_console_actions_from_another_site_are_refused_even_with_the_token(node: Node) -> None:
    page = await node.http.get(f"/console/messages/{node.message_id}", headers=ADMIN)
    token = re.search(r'name="csrf" value="([0-9a-f]+)"', page.text)
    assert token is not None, page.text
    for origin in (EVIL, "null"):
        refused = await node.http.post(f"/console/messages/{node.message_id}/cancel", data={"csrf": token[1]},
                                       headers={**ADMIN, "Origin": origin})
        assert refused.status_code == 403 and "another site" in refused.text
    _unchanged(node)
    done = await node.http.post(f"/console/messages/{node.message_id}/cancel", data={"csrf": token[1]},
                                headers={**ADMIN, "Origin": "http://node.local:8080"})
    assert done.status_code == 303


NUL_QUERIES = [
    "object_id=%00", "service=%00", "correlation_id=a%00b", "source_system=%00", "operation=x%00",
    "entity_type=%00", "funnel_value=%00", "process_id=%00", "state=%00", "received_from=%00", "cursor=%00",
    "limit=%00", "%00=1",
]


async def test_nul_in_an_admin_filter_is_a_400(node: Node) -> None:
    for query in NUL_QUERIES:
        response = await node.http.get(f"/admin/messages?{query}", headers=ADMIN)
        assert response.status_code == 400, (query, response.text)
        assert response.json()["error"] == "INVALID_QUERY"
        console = await node.http.get(f"/console/messages?{query}", headers=ADMIN)
        assert console.status_code == 400, (query, console.text)


async def test_nul_in_an_admin_path_is_a_400(node: Node) -> None:
    response = await node.http.post("/admin/nodes/a%00b/state", json={"state": "RUN"}, headers=ADMIN)
    assert (response.status_code, response.json()["error"]) == (400, "INVALID_QUERY")
    detail = await node.http.get("/admin/messages/1%00", headers=ADMIN)
    assert detail.status_code == 400
    _unchanged(node)


async def test_every_response_carries_the_security_headers(node: Node) -> None:
    for path, headers in (("/console/", ADMIN), ("/console/messages", WEB), ("/console/static/console.css", ADMIN),
                          ("/admin/counts", ADMIN), ("/admin/messages?limit=0", ADMIN), ("/health", {}),
                          ("/console/", {}), ("/admin/openapi.json", {})):
        response = await node.http.get(path, headers=headers)
        assert response.headers["x-frame-options"] == "DENY", path
        assert response.headers["x-content-type-options"] == "nosniff", path
        assert response.headers["content-security-policy"] == CONTENT_SECURITY_POLICY, path
        assert "frame-ancestors 'none'" in response.headers["content-security-policy"]


async def test_metrics_can_require_credentials(node: Node) -> None:
    anonymous = await node.http.get("/metrics")
    assert anonymous.status_code == 401 and anonymous.headers["www-authenticate"].startswith("Basic")
    assert "openroute_" not in anonymous.text
    assert (await node.http.get("/metrics", headers=basic("ops", "wrong"))).status_code == 401
    viewer = await node.http.get("/metrics", headers=WEB)
    assert viewer.status_code == 200 and "openroute_accepted" in viewer.text
    # by default /metrics stays open (documented); metrics_auth without users is a configuration error
    app = create_app(node.engine, admin_auth=_users(), manage_engine=False)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://n") as http:
        assert (await http.get("/metrics")).status_code == 200
    with pytest.raises(ConfigurationError, match="metrics_auth needs admin users"):
        create_app(node.engine, manage_engine=False, metrics_auth=True)


def test_origins_are_compared_normalized() -> None:
    allowed = normalize_origins(["HTTPS://Ops.Example:443", "http://[::1]:9000"])
    assert allowed == {"https://ops.example", "http://[::1]:9000"}
    check_origin({"origin": "https://ops.example"}, allowed)
    check_origin({"origin": "http://[::1]:9000"}, allowed)
    check_origin({"origin": "http://node:80", "host": "node"})
    check_origin({"host": "node"})  # no Origin: not a browser's cross-site request
    for bad in ("ops.example", "https://ops.example/path", "ftp://x", "https://u:p@x"):
        with pytest.raises(ConfigurationError):
            normalize_origins([bad])
