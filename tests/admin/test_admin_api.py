"""Admin API against a real store (SQLite and PostgreSQL): search, detail, restart, cancel, counts, auth."""

from __future__ import annotations

import base64
import json
import logging
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
from openroute.persistence import (
    MessageState,
    MessageStore,
    StoredMessage,
    message_table,
)

from openroute import Exchange, Route, RouteRegistry
from openroute.definitions.errors import BusinessError
from openroute.definitions.message import InboundMessage
from openroute.engine import Engine, EngineSettings
from openroute.inbound import AdminAuth, AdminUser
from openroute.queries import parse_filters
from openroute.queries.messages import summaries
from openroute.queries.search import search_summaries
from openroute.server import create_app
from tests._support.message_details import add_child_call_and_confirmation


def _step(exchange: Exchange) -> None:
    if "fail" in exchange.payload:
        raise BusinessError("REFUSED", "customer blocked")


def registry() -> RouteRegistry:
    return RouteRegistry([Route("orders", "create", [_step]), Route("billing", "charge", [_step])])


def inbound(correlation_id: str, payload: str = "{}", **values: Any) -> InboundMessage:
    defaults: dict[str, Any] = {"service": "orders", "operation": "create", "source_system": "CRM"}
    defaults.update(values)
    return InboundMessage(payload=payload, content_type="application/json", correlation_id=correlation_id, **defaults)


def auth_header(user: str, password: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


ADMIN = auth_header("ops", "ops-secret")


class World:
    def __init__(self, engine: Engine, ids: dict[str, int], tx_finals: list[StoredMessage],
                 finals: list[StoredMessage]) -> None:
        self.engine, self.ids, self.tx_finals, self.finals = engine, ids, tx_finals, finals


@pytest.fixture
async def world(store: MessageStore) -> AsyncIterator[World]:
    """Two FAILED and one OK message (processed by a worker node), then NEW messages on an idle node."""
    worker = Engine(store, registry(), EngineSettings(repoll_interval=None, node_id="worker"))
    await worker.start()
    ids: dict[str, int] = {}
    for name, message in {
        "failed1": inbound("f-1", '{"fail": 1}', object_id="A-1"),
        "failed2": inbound("f-2", '{"fail": 2}', service="billing", operation="charge", source_system="ERP"),
        "ok": inbound("ok-1", object_id="A-1"),
    }.items():
        ids[name] = (await worker.accept(message)).message_id
    await worker.wait_idle(20)
    await worker.stop()
    node = Engine(store, registry(), EngineSettings(repoll_interval=None, node_id="admin-node"))
    ids["new"] = (await node.accept(inbound("n-1", object_id="B-2", process_id="p-1"))).message_id
    ids["new2"] = (await node.accept(inbound("n-2", source_system="ERP"))).message_id
    ids["child"] = add_child_call_and_confirmation(store, ids["failed1"])
    tx_finals: list[StoredMessage] = []
    finals: list[StoredMessage] = []

    async def on_final(message: StoredMessage) -> None:
        finals.append(message)

    node.on_final_state_in_transaction(lambda message, connection: tx_finals.append(message))
    node.on_final_state(on_final)
    yield World(node, ids, tx_finals, finals)
    await node.stop()


@pytest.fixture
async def client(world: World) -> AsyncIterator[httpx.AsyncClient]:
    auth = AdminAuth([AdminUser("ops", "ops-secret"), AdminUser("viewer", "viewer-secret", frozenset({"viewer"}))])
    app = create_app(world.engine, admin_auth=auth, manage_engine=False)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://testserver") as http:
        yield http


async def search(client: httpx.AsyncClient, **params: Any) -> dict[str, Any]:
    response = await client.get("/admin/messages", params=params, headers=ADMIN)
    assert response.status_code == 200, response.text
    return response.json()


async def test_search_filters_and_paging(client: httpx.AsyncClient, world: World) -> None:
    ids = world.ids
    everything = await search(client)
    assert everything["total"] == 6 and [m["id"] for m in everything["items"]] == sorted(ids.values(), reverse=True)
    assert {m["id"] for m in (await search(client, state="FAILED"))["items"]} == {ids["failed1"], ids["failed2"]}
    both = await search(client, state=["FAILED", "OK"])
    assert {m["id"] for m in both["items"]} == {ids["failed1"], ids["failed2"], ids["ok"]}
    assert [m["id"] for m in (await search(client, service="billing"))["items"]] == [ids["failed2"]]
    assert [m["id"] for m in (await search(client, operation="charge"))["items"]] == [ids["failed2"]]
    assert {m["id"] for m in (await search(client, source_system="ERP"))["items"]} == {ids["failed2"], ids["new2"]}
    assert [m["id"] for m in (await search(client, correlation_id="n-1"))["items"]] == [ids["new"]]
    assert {m["id"] for m in (await search(client, object_id="A-1"))["items"]} == {ids["failed1"], ids["ok"]}
    future = (datetime.now(UTC) + timedelta(hours=1)).isoformat()
    past = (datetime.now(UTC) - timedelta(hours=1)).isoformat()
    assert (await search(client, received_from=future))["total"] == 0
    assert (await search(client, received_from=past, received_to=future))["total"] == 6
    first = await search(client, limit=4)
    second = await search(client, limit=4, cursor=first["nextCursor"])
    assert len(first["items"]) == 4 and len(second["items"]) == 2 and first["total"] == second["total"] == 6
    assert "nextCursor" not in second and not first["countEstimated"]
    assert [m["id"] for m in first["items"] + second["items"]] == [m["id"] for m in everything["items"]]
    # the cursor keeps its place when newer messages arrive meanwhile, and the old page_size name still works
    await world.engine.accept(inbound("n-late"))
    third = await search(client, page_size=4, cursor=first["nextCursor"])
    assert [m["id"] for m in third["items"]] == [m["id"] for m in second["items"]] and third["total"] == 7
    failed = next(m for m in everything["items"] if m["id"] == ids["failed1"])
    assert failed["lastErrorCode"] == "REFUSED" and failed["state"] == "FAILED" and "payload" not in failed


async def test_the_search_answer_is_the_json_of_the_summaries(client: httpx.AsyncClient, world: World,
                                                             store: MessageStore) -> None:
    """orjson writes the answer (api.JsonAnswer): the same text as the stdlib's compact JSON of the API's items."""
    whole_second = datetime(2024, 3, 1, 10, 15, tzinfo=UTC)  # isoformat() leaves the fraction out of such a time
    with store.engine.begin() as connection:
        connection.execute(sa.update(message_table).where(message_table.c.id == world.ids["failed1"]).values(
            receive_ts=whole_second, last_update_ts=whole_second + timedelta(microseconds=250),
            next_attempt_at=whole_second + timedelta(seconds=1), object_id="Ä-1 \u2028"))
    response = await client.get("/admin/messages", params={"limit": "50"}, headers=ADMIN)
    answer = response.json()
    assert response.content == json.dumps(answer, ensure_ascii=False, allow_nan=False,
                                          separators=(",", ":")).encode()
    with store.engine.connect() as connection:
        rows = search_summaries(connection, parse_filters({}), None, 50).rows
    assert answer["items"] == summaries(rows)
    failed = next(item for item in answer["items"] if item["id"] == world.ids["failed1"])
    assert (failed["receivedAt"], failed["lastUpdateAt"], failed["nextAttemptAt"], failed["objectId"]) == (
        "2024-03-01T10:15:00+00:00", "2024-03-01T10:15:00.000250+00:00", "2024-03-01T10:15:01+00:00", "Ä-1 \u2028")


@pytest.mark.parametrize(
    ("params", "reason"),
    [
        ({"state": "BROKEN"}, "unknown state"),
        ({"colour": "red"}, "unknown search parameters"),
        ({"page": "2"}, "follow nextCursor"),
        ({"limit": "0"}, "limit must be in"),
        ({"limit": "501"}, "limit must be in"),
        ({"page_size": "501"}, "page_size must be in"),
        ({"limit": "x"}, "must be an integer"),
        ({"cursor": "not-a-cursor"}, "is not one this search returned"),
        ({"cursor": "WyJ4IiwxXQ"}, "is not one this search returned"),  # ["x",1]: base64 JSON, not a cursor
        ({"correlation_id": ""}, "1-255 characters"),
        ({"received_from": "yesterday"}, "ISO 8601"),
        ({"received_from": "2024-01-01T00:00:00"}, "time zone"),
        ({"received_from": "2024-02-01T00:00:00Z", "received_to": "2024-01-01T00:00:00Z"}, "before"),
        # no UTC form: the store compares UTC times
        ({"received_from": "0001-01-01T00:00:00+05:00"}, "out of range in UTC"),
        ({"received_to": "9999-12-31T23:59:59-05:00"}, "out of range in UTC"),
        # a cursor whose id is beyond a BIGINT, or whose time has no UTC form
        ({"cursor": "WyIyMDI0LTAxLTAxVDAwOjAwOjAwKzAwOjAwIiw5MjIzMzcyMDM2ODU0Nzc1ODA4XQ"}, "is not one this search"),
        ({"cursor": "WyIwMDAxLTAxLTAxVDAwOjAwOjAwKzA1OjAwIiwxXQ"}, "is not one this search returned"),
    ],
)
async def test_bad_search_parameters(client: httpx.AsyncClient, params: dict[str, str], reason: str) -> None:
    response = await client.get("/admin/messages", params=params, headers=ADMIN)
    assert response.status_code == 400 and response.json()["error"] == "INVALID_QUERY"
    assert reason in response.json()["reason"]


async def test_detail_with_calls_children_and_confirmation(client: httpx.AsyncClient, world: World) -> None:
    response = await client.get(f"/admin/messages/{world.ids['failed1']}", headers=ADMIN)
    assert response.status_code == 200
    body = response.json()
    assert body["payload"] == '{"fail": 1}'
    assert body["businessErrors"] == [{"code": "REFUSED", "text": "customer blocked"}]
    assert [(c["callKey"], c["status"], c["result"]) for c in body["externalCalls"]] == [
        ("billing.charge", "OK", {"invoice": 7})
    ]
    assert [c["id"] for c in body["children"]] == [world.ids["child"]]
    assert body["confirmation"]["status"] == "FAILED" and body["confirmation"]["attempts"] == 3
    assert body["confirmation"]["lastError"] == "HTTP 500: down"
    plain = (await client.get(f"/admin/messages/{world.ids['new']}", headers=ADMIN)).json()
    assert plain["externalCalls"] == [] and plain["children"] == [] and plain["confirmation"] is None
    assert [(t["fromState"], t["toState"], t["cause"], t["attempt"]) for t in plain["transitions"]] == [
        (None, "NEW", "engine", 1)
    ]
    assert [(t["fromState"], t["toState"]) for t in body["transitions"]] == [
        (None, "NEW"), ("NEW", "PROCESSING"), ("PROCESSING", "FAILED")
    ]
    assert body["transitions"][-1]["errorCode"] == "REFUSED"
    assert (await client.get("/admin/messages/999999", headers=ADMIN)).status_code == 404
    bad = await client.get("/admin/messages/abc", headers=ADMIN)
    assert bad.status_code == 400 and bad.json()["error"] == "INVALID_QUERY"


async def test_restart_failed_message(client: httpx.AsyncClient, world: World, store: MessageStore) -> None:
    message_id = world.ids["failed1"]
    response = await client.post(f"/admin/messages/{message_id}/restart", json={}, headers=ADMIN)
    assert response.status_code == 200, response.text
    assert response.json() == {"id": message_id, "previousState": "FAILED", "state": "PARTLY_FAILED"}
    restarted = store.get(message_id)
    assert restarted is not None and restarted.state is MessageState.PARTLY_FAILED
    assert restarted.failed_count == 0 and restarted.next_attempt_at is not None
    due = store.due([MessageState.PARTLY_FAILED], datetime.now(UTC) + timedelta(seconds=1), 10)
    assert [m.id for m in due] == [message_id]  # the repoll will pick it up
    again = await client.post(f"/admin/messages/{message_id}/restart", json={}, headers=ADMIN)
    assert again.status_code == 409 and "PARTLY_FAILED -> PARTLY_FAILED" in again.json()["reason"]


async def test_search_by_what_went_wrong(client: httpx.AsyncClient, world: World) -> None:
    ids = world.ids
    failed = {ids["failed1"], ids["failed2"]}
    assert {m["id"] for m in (await search(client, error_code="REFUSED"))["items"]} == failed
    assert {m["id"] for m in (await search(client, error_code=["REFUSED", "OTHER"]))["items"]} == failed
    assert (await search(client, error_code="REFUSED", service="billing"))["total"] == 1
    assert {m["id"] for m in (await search(client, error_text="BLOCKED"))["items"]} == failed
    assert [m["id"] for m in (await search(client, payload_text='"fail": 2'))["items"]] == [ids["failed2"]]
    assert (await search(client, payload_text="fail", state="OK"))["total"] == 0
    too_many = await client.get("/admin/messages", params={"error_code": ",".join(f"C{i}" for i in range(51))},
                                headers=ADMIN)
    assert too_many.status_code == 400 and "error_code" in too_many.json()["reason"]


async def test_restart_is_logged_with_who_and_from_where(client: httpx.AsyncClient, world: World,
                                                         caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("INFO", logger="openroute.admin")
    message_id = world.ids["failed2"]
    assert (await client.post(f"/admin/messages/{message_id}/restart", json={}, headers=ADMIN)).status_code == 200
    assert (f"message {message_id} restarted by ops from 127.0.0.1 (admin API) (FAILED -> PARTLY_FAILED)"
            in [r.getMessage() for r in caplog.records])


async def test_restart_of_ok_or_new_is_refused(client: httpx.AsyncClient, world: World, store: MessageStore) -> None:
    for name in ("ok", "new"):
        before = store.get(world.ids[name])
        response = await client.post(f"/admin/messages/{world.ids[name]}/restart", json={}, headers=ADMIN)
        assert response.status_code == 409 and response.json()["error"] == "ILLEGALTRANSITION"
        assert store.get(world.ids[name]) == before


async def test_cancel_non_final_message_runs_final_hooks(
    client: httpx.AsyncClient, world: World, store: MessageStore
) -> None:
    message_id = world.ids["new"]
    response = await client.post(f"/admin/messages/{message_id}/cancel", json={}, headers=ADMIN)
    assert response.status_code == 200
    assert response.json() == {"id": message_id, "previousState": "NEW", "state": "CANCEL"}
    cancelled = store.get(message_id)
    assert cancelled is not None and cancelled.state is MessageState.CANCEL
    assert cancelled.last_error_text == "cancelled by operator ops"
    assert [m.id for m in world.tx_finals] == [message_id] and [m.id for m in world.finals] == [message_id]
    for name in ("new", "ok", "failed1"):  # final messages cannot be cancelled
        refused = await client.post(f"/admin/messages/{world.ids[name]}/cancel", json={}, headers=ADMIN)
        assert refused.status_code == 409
    # an operator may restart a cancelled message (CANCEL -> PARTLY_FAILED, due now)
    restart = await client.post(f"/admin/messages/{message_id}/restart", json={}, headers=ADMIN)
    assert restart.status_code == 200 and restart.json()["state"] == "PARTLY_FAILED"
    restarted = store.get(message_id)
    assert restarted is not None and restarted.state is MessageState.PARTLY_FAILED and restarted.failed_count == 0
    assert [(t["from_state"], t["to_state"], t["cause"]) for t in store.transitions.of(message_id)] == [
        (None, MessageState.NEW, "engine"),
        (MessageState.NEW, MessageState.CANCEL, "admin:ops"),
        (MessageState.CANCEL, MessageState.PARTLY_FAILED, "admin:ops"),
    ]
    assert (await client.post("/admin/messages/424242/cancel", json={}, headers=ADMIN)).status_code == 404


async def test_admin_cancel_goes_through_the_engine(client: httpx.AsyncClient, world: World) -> None:
    """Stats and transition listeners of the engine hear of an operator's cancel and restart (#13 item 3)."""
    heard: list[tuple[MessageState | None, MessageState, int]] = []
    world.engine.on_transition(lambda previous, message: heard.append((previous, message.state,
                                                                                     message.id)))
    message_id = world.ids["new2"]
    before = world.engine.stats.outcomes[MessageState.CANCEL]
    response = await client.post(f"/admin/messages/{message_id}/cancel", json={}, headers=ADMIN)
    assert response.status_code == 200, response.text
    assert world.engine.stats.outcomes[MessageState.CANCEL] == before + 1
    assert heard == [(MessageState.NEW, MessageState.CANCEL, message_id)]
    assert [m.id for m in world.finals] == [message_id]
    restart = await client.post(f"/admin/messages/{message_id}/restart", json={}, headers=ADMIN)
    assert restart.status_code == 200
    assert heard[-1] == (MessageState.CANCEL, MessageState.PARTLY_FAILED, message_id)
    rows = world.engine.store.transitions.of(message_id)
    assert [(str(r["to_state"]), r["cause"]) for r in rows[-2:]] == [("CANCEL", "admin:ops"),
                                                                      ("PARTLY_FAILED", "admin:ops")]


async def test_counts_per_state(client: httpx.AsyncClient) -> None:
    response = await client.get("/admin/counts", headers=ADMIN)
    assert response.status_code == 200
    body = response.json()
    assert body["total"] == 6
    assert body["states"] == {**{s.value: 0 for s in MessageState}, "NEW": 3, "FAILED": 2, "OK": 1}


@pytest.mark.parametrize(
    ("headers", "status"),
    [
        ({}, 401),
        (auth_header("ops", "wrong"), 401),
        (auth_header("nobody", "ops-secret"), 401),
        (auth_header("viewer", "viewer-secret"), 403),
    ],
)
async def test_admin_needs_the_admin_role(
    client: httpx.AsyncClient, world: World, store: MessageStore, headers: dict[str, str], status: int
) -> None:
    for method, path in (("GET", "/admin/messages"), ("GET", "/admin/counts"),
                         ("GET", f"/admin/messages/{world.ids['new']}"),
                         ("POST", f"/admin/messages/{world.ids['new']}/cancel"),
                         ("POST", f"/admin/messages/{world.ids['failed1']}/restart")):
        response = await client.request(method, path, headers=headers)
        assert response.status_code == status, (method, path)
        assert "ops-secret" not in response.text
    assert store.get(world.ids["new"]).state is MessageState.NEW
    assert store.get(world.ids["failed1"]).state is MessageState.FAILED


async def test_admin_without_configured_users_is_closed(world: World) -> None:
    app = create_app(world.engine, manage_engine=False)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as http:
        assert (await http.get("/admin/counts", headers=ADMIN)).status_code == 401


async def test_metrics_show_the_backlog_per_route_not_the_final_messages(client: httpx.AsyncClient) -> None:
    metrics = (await client.get("/metrics")).text
    gauge = metrics.split("# HELP openroute_messages ")[1].split("# HELP")[0]
    assert 'openroute_messages{operation="create",service="orders",state="NEW"} 3.0' in gauge
    # final messages are counted by the node that finished them (openroute_final_messages_total), not read here
    assert 'state="OK"' not in gauge and 'state="FAILED"' not in gauge


#: one more than the largest id a BIGINT (PostgreSQL) or an INTEGER (SQLite) holds
BEYOND_BIGINT = 2**63


async def test_ids_beyond_bigint_and_deep_or_large_action_bodies_are_400_never_500(
    world: World, store: MessageStore, caplog: pytest.LogCaptureFixture
) -> None:
    """Every admin and console input out of range or too deep is a 400 with an error code (the web role reaches the
    reads): nothing is changed, no traceback is logged."""
    before = {m.id: (m.state, m.version) for m in store.find()}
    auth = AdminAuth([AdminUser("ops", "ops-secret"), AdminUser("viewer", "viewer-secret", frozenset({"web"}))])
    app = create_app(world.engine, admin_auth=auth, manage_engine=False)
    client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://testserver")
    viewer = auth_header("viewer", "viewer-secret")
    for method, path, headers in [
        ("GET", f"/admin/messages/{BEYOND_BIGINT}", viewer),
        ("GET", f"/console/messages/{BEYOND_BIGINT}", viewer),
        *(("POST", f"/admin/messages/{BEYOND_BIGINT}/{action}", ADMIN)
          for action in ("restart", "cancel", "mark-done", "call-again")),
    ]:
        answer = await client.request(method, path, headers={**headers, "Content-Type": "application/json"})
        assert answer.status_code == 400, (path, answer.status_code, answer.text[:200])
        if path.startswith("/admin"):
            assert answer.json()["error"] == "INVALID_QUERY" and "1..9223372036854775807" in answer.json()["reason"]
    deep = '{"state": ' + "[" * 5000 + "]" * 5000 + "}"
    for path in ("/admin/nodes/admin-node/state", "/admin/breakers/HLR/state"):
        for body, status, code in ((deep, 400, "NESTING_TOO_DEEP"), ("[" * 10_000, 400, "NESTING_TOO_DEEP"),
                                   ('{"state": "' + "x" * 20_000 + '"}', 413, "PAYLOAD_TOO_LARGE"),
                                   ("[1]", 400, "INVALID_QUERY"), ("{not json", 400, "INVALID_QUERY")):
            answer = await client.post(path, content=body, headers={**ADMIN, "Content-Type": "application/json"})
            assert (answer.status_code, answer.json()["error"]) == (status, code), (path, body[:20], answer.text)
    assert {m.id: (m.state, m.version) for m in store.find()} == before
    nodes = (await client.get("/admin/nodes", headers=ADMIN)).json()["nodes"]
    assert all(node["state"] == "RUN" for node in nodes)
    await client.aclose()
    assert not [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR]
