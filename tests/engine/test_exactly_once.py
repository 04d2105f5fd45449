"""Issue 23, items 1 and 2 on each real database: a stable idempotency key per call, the STARTED record committed
before the call, calls in doubt repeated with the same key or held for an operator (mark done / call again)."""

from __future__ import annotations

import asyncio
import base64
import io
import json
import re
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
from openroute.persistence import ExternalCallStatus, MessageState, MessageStore, external_call_table

from openroute import Application, Exchange, route
from openroute.definitions.errors import IllegalTransitionError
from openroute.engine.idempotency import (
    CallInDoubtError,
    current_idempotency_key,
    entity_idempotency_key,
    message_idempotency_key,
)
from openroute.engine.in_doubt import NoCallInDoubtError, resolve_in_doubt
from openroute.inbound import AdminAuth, AdminUser
from openroute.server import create_app
from openroute.testing import RouteTestKit

S = MessageState
MINUTE = timedelta(minutes=1)
ADMIN = {"Authorization": "Basic " + base64.b64encode(b"ops:ops-secret").decode()}


class Remote:
    """A fake remote: records the key every call carried (argument and current key) and drops repeats by key."""

    def __init__(self) -> None:
        self.keys: list[str] = []
        self.effects: dict[str, int] = {}

    def __call__(self, exchange: Exchange, idempotency_key: str) -> dict[str, Any]:
        assert current_idempotency_key() == idempotency_key  # what SoapService / an HTTP client would send
        self.keys.append(idempotency_key)
        self.effects.setdefault(idempotency_key, len(self.effects) + 1)
        return {"effect": self.effects[idempotency_key]}


@pytest.fixture
async def kit_on(database_url: str, route_test_kit: Any) -> Callable[..., Any]:
    async def make(application: Application, **options: Any) -> RouteTestKit:
        return await route_test_kit(application, database_url=database_url, **options)

    return make


def lose_next_outcome(kit: RouteTestKit, monkeypatch: pytest.MonkeyPatch) -> None:
    """The next call outcome cannot be written (the database went away right after the remote answered): the
    call stays STARTED, in doubt, and the attempt fails technically."""
    store = kit.store
    original = store.calls.finish_many
    lost = []

    def finish_many(*args: Any, **kwargs: Any) -> list[None]:
        if not lost:
            lost.append(args)
            raise sa.exc.OperationalError("UPDATE external_call", {}, Exception("connection lost"))
        return original(*args, **kwargs)

    monkeypatch.setattr(store.calls, "finish_many", finish_many)


def call_row(store: MessageStore, message_id: int, key: str) -> Any:
    c = external_call_table.c
    with store.engine.connect() as connection:
        return connection.execute(sa.select(external_call_table).where(c.message_id == message_id,
                                                                       c.call_key == key)).one()


def test_keys_are_stable_uuids_that_tell_calls_apart() -> None:
    key = message_idempotency_key(7, "CRM", "c-1", "billing")
    assert key == message_idempotency_key(7, "CRM", "c-1", "billing") and len(key) == 36
    others = {message_idempotency_key(8, "CRM", "c-1", "billing"), message_idempotency_key(7, "ERP", "c-1", "billing"),
              message_idempotency_key(7, "CRM", "c-1", "mno"), entity_idempotency_key("customer", "7", "billing")}
    assert key not in others and len(others) == 4
    assert entity_idempotency_key("customer", "C-1", "sim") == entity_idempotency_key("customer", "C-1", "sim")


async def test_a_call_gets_its_key_and_is_recorded_started_then_ok(kit_on: Any) -> None:
    remote = Remote()
    seen: list[str] = []

    def check(exchange: Exchange) -> None:
        seen.append(exchange.idempotency_key("billing"))
        seen.append(exchange.idempotency_key("sim", scope="entity"))

    kit = await kit_on(Application(route("crm", "setCustomer").json().object_id(json="$.id").entity_type("customer")
                                   .ext_call("billing", remote).process(check)))
    sent = await kit.send_json("crm", "setCustomer", {"id": "C-1"}, correlation_id="corr-1")
    await kit.settle()
    message = kit.assert_state(sent.message_id, S.OK)
    expected = message_idempotency_key(message.id, message.source_system, "corr-1", "billing")
    assert remote.keys == [expected] and seen == [expected, entity_idempotency_key("customer", "C-1", "sim")]
    row = call_row(kit.store, message.id, "billing")
    assert (row.status, row.idempotency_key, row.node_id, row.attempts) == (ExternalCallStatus.OK, expected,
                                                                             "route-test-kit", 1)
    assert row.started_at is not None and row.result == {"effect": 1}


async def test_a_call_in_doubt_is_made_again_with_the_same_key(kit_on: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    remote = Remote()
    kit = await kit_on(Application(route("crm", "setCustomer").json().retry(max_attempts=3, interval=MINUTE)
                                   .ext_call("billing", remote)))
    lose_next_outcome(kit, monkeypatch)
    sent = await kit.send_json("crm", "setCustomer", {"id": "C-2"})
    await kit.settle()
    kit.assert_state(sent.message_id, S.PARTLY_FAILED)
    assert kit.store.calls.in_doubt(sent.message_id)[0].status is ExternalCallStatus.STARTED
    await kit.advance(MINUTE)
    kit.assert_state(sent.message_id, S.OK)
    assert len(remote.keys) == 2 and remote.keys[0] == remote.keys[1]  # raw repeat, same key
    assert len(remote.effects) == 1  # ... dropped by the remote: one effect
    row = call_row(kit.store, sent.message_id, "billing")
    assert (row.status, row.attempts) == (ExternalCallStatus.OK, 2)


async def test_a_held_call_in_doubt_waits_for_the_operator(kit_on: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    remote = Remote()
    kit = await kit_on(Application(route("crm", "setCustomer").json().retry(max_attempts=3, interval=MINUTE)
                                   .ext_call("billing", remote, in_doubt="hold")))
    ids = []
    for n in range(4):
        lose_next_outcome(kit, monkeypatch)
        ids.append((await kit.send_json("crm", "setCustomer", {"id": f"C-{n}"})).message_id)
        await kit.settle()
    await kit.advance(MINUTE)
    for message_id in ids:
        held = kit.assert_state(message_id, S.FAILED)
        assert held.last_error_code == "CALL_IN_DOUBT" and held.failed_count == 1
        assert "billing" in (held.last_error_text or "") and "mark done / call again" in (held.last_error_text or "")
    assert len(remote.keys) == 4  # nothing called again on its own

    # the admin API shows the doubt and resolves it
    auth = AdminAuth([AdminUser("ops", "ops-secret")])
    app = create_app(kit.engine, admin_auth=auth, manage_engine=False)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://admin") as client:
        detail = (await client.get(f"/admin/messages/{ids[0]}", headers=ADMIN)).json()
        assert detail["callsInDoubt"] == ["billing"] and detail["lastErrorCode"] == "CALL_IN_DOUBT"
        call = detail["externalCalls"][0]
        assert call["inDoubt"] and call["status"] == "STARTED" and call["idempotencyKey"] == remote.keys[0]
        done = await client.post(f"/admin/messages/{ids[0]}/mark-done", json={}, headers=ADMIN)
        assert done.status_code == 200, done.text
        assert done.json() == {"id": ids[0], "previousState": "FAILED", "state": "PARTLY_FAILED",
                               "action": "mark-done", "callKeys": ["billing"]}
        again = await client.post(f"/admin/messages/{ids[1]}/call-again", json={}, headers=ADMIN)
        assert again.status_code == 200 and again.json()["state"] == "PARTLY_FAILED"
        none = await client.post(f"/admin/messages/{ids[0]}/call-again", json={}, headers=ADMIN)
        assert none.status_code == 409 and none.json()["error"] == "ILLEGALTRANSITION"  # PARTLY_FAILED now
        refused = await client.post(f"/admin/messages/{ids[2]}/mark-done", json={}, headers={})
        assert refused.status_code == 401
        # the console shows the doubt and offers both answers
        html = (await client.get(f"/console/messages/{ids[3]}", headers=ADMIN)).text
        assert 'id="calls-in-doubt"' in html and 'id="mark-done"' in html and 'id="call-again"' in html
        token = re.search(r'name="csrf" value="([0-9a-f]+)"', html).group(1)  # type: ignore[union-attr]
        posted = await client.post(f"/console/messages/{ids[3]}/mark-done", data={"csrf": token}, headers=ADMIN)
        assert posted.status_code == 303 and posted.headers["location"].endswith("?done=mark-done")
        again = await client.post(f"/console/messages/{ids[3]}/mark-done", data={"csrf": token}, headers=ADMIN)
        assert again.status_code == 409
    await kit.settle()
    await kit.advance(MINUTE)
    kit.assert_state(ids[0], S.OK)
    kit.assert_state(ids[1], S.OK)
    kit.assert_state(ids[3], S.OK)
    assert remote.keys.count(remote.keys[3]) == 1
    assert remote.keys.count(remote.keys[0]) == 1  # marked done: not called again
    assert remote.keys.count(remote.keys[1]) == 2  # called again, same key
    assert call_row(kit.store, ids[0], "billing").status is ExternalCallStatus.OK

    # the CLI over the store does the same; a message without doubt is refused
    from openroute.cli import build_parser
    from openroute.console.cli import run

    out, err = io.StringIO(), io.StringIO()
    show = build_parser().parse_args(["messages", "show", str(ids[2]), "--database-url", kit.store.url])
    assert run(show, out, err) == 0 and "callsInDoubt" in out.getvalue() and "mark-done|call-again" in out.getvalue()
    args = build_parser().parse_args(["messages", "call-again", str(ids[2]), str(ids[0]), "--database-url",
                                      kit.store.url, "--yes", "--json"])
    out = io.StringIO()
    assert await asyncio.to_thread(run, args, out, err) == 1  # ids[0] is OK: refused
    results = {r["id"]: r for r in json.loads(out.getvalue())["results"]}
    assert results[ids[2]] == {"id": ids[2], "ok": True, "detail": "PARTLY_FAILED"}
    assert not results[ids[0]]["ok"]
    await kit.advance(MINUTE)
    kit.assert_state(ids[2], S.OK)
    assert remote.keys.count(remote.keys[2]) == 2


async def test_resolving_needs_a_restartable_message_with_a_call_in_doubt(kit_on: Any) -> None:
    kit = await kit_on(Application(route("crm", "setCustomer").json().ext_call("billing", Remote())))
    sent = await kit.send_json("crm", "setCustomer", {"id": "C-9"})
    await kit.settle()
    with pytest.raises(IllegalTransitionError):
        await resolve_in_doubt(kit.engine, sent.message_id, "mark-done", "test")
    with pytest.raises(LookupError):
        await resolve_in_doubt(kit.engine, 999_999, "call-again", "test")
    with pytest.raises(ValueError, match="mark-done"):
        await resolve_in_doubt(kit.engine, sent.message_id, "forget", "test")  # type: ignore[arg-type]


async def test_a_message_being_processed_is_neither_restarted_nor_resolved(kit_on: Any) -> None:
    """An operator's restart leads to PARTLY_FAILED from FAILED or CANCEL only: a PROCESSING message (a worker holds
    it; the engine's own failures take it to PARTLY_FAILED) is refused, and nothing changes."""
    from datetime import UTC, datetime

    from openroute.persistence import NewMessage

    from openroute.engine import states

    kit = await kit_on(Application(route("crm", "setCustomer").json().ext_call("billing", Remote())))
    stored = kit.store.insert_message(NewMessage(
        service="crm", operation="setCustomer", payload="{}", content_type="application/json",
        correlation_id="held-by-a-worker", source_system="CRM", receive_ts=datetime.now(UTC))).message
    processing = states.claim(kit.store, [stored], "other-node", datetime.now(UTC))[0]
    with pytest.raises(IllegalTransitionError):
        await kit.engine.restart(processing.id, cause="test")
    with pytest.raises(IllegalTransitionError):
        await resolve_in_doubt(kit.engine, processing.id, "call-again", "test")
    assert kit.store.get(processing.id) == processing


async def test_no_call_in_doubt_is_a_clear_refusal(kit_on: Any) -> None:
    remote = Remote()
    kit = await kit_on(Application(route("crm", "setCustomer").json()
                                   .ext_call("billing", remote).process(lambda exchange: 1 / 0)))
    sent = await kit.send_json("crm", "setCustomer", {"id": "C-10"})
    await kit.run_until_final(sent.message_id)
    kit.assert_state(sent.message_id, S.FAILED)
    with pytest.raises(NoCallInDoubtError, match="no call in doubt"):
        await resolve_in_doubt(kit.engine, sent.message_id, "mark-done", "test")
    kit.assert_state(sent.message_id, S.FAILED)  # nothing changed


def test_entity_calls_in_doubt_are_held_on_request(store: MessageStore) -> None:
    from datetime import UTC, datetime

    now = datetime(2026, 11, 25, tzinfo=UTC)
    stale = now - timedelta(minutes=5)
    assert store.calls.begin_entity("customer", "C-1", "sim", 1, now, stale) == ("RUN", None)
    # the attempt died: its own IN_PROGRESS record is in doubt on the next attempt
    assert store.calls.begin_entity("customer", "C-1", "sim", 1, now, stale, hold_in_doubt=True) == ("IN_DOUBT", None)
    assert store.calls.resolve_in_doubt(1, True, now) == ["sim"]
    assert store.calls.begin_entity("customer", "C-1", "sim", 1, now, stale, hold_in_doubt=True) == ("OK", None)


def test_a_bad_in_doubt_choice_is_refused() -> None:
    from openroute.definitions.errors import DeploymentError

    with pytest.raises(DeploymentError, match="in_doubt must be 'repeat' or 'hold'"):
        route("crm", "x").json().ext_call("billing", Remote(), in_doubt="later")  # type: ignore[arg-type]
    error = CallInDoubtError("billing", "k-1", "no outcome recorded")
    assert error.code == "CALL_IN_DOUBT" and error.call_key == "billing" and error.idempotency_key == "k-1"
