"""Counts that survive a restart (issue 42): the message detail's attempts over the whole history (its transition
rows), and its external calls' calls made apart from the calls a circuit breaker refused."""

from __future__ import annotations

import json
import re
from datetime import timedelta
from typing import Any

import httpx
from openroute.persistence import MessageState

from openroute import Exchange, route
from openroute.dsl import Application
from openroute.outbound import ExternalHttpClient
from openroute.server import create_app
from openroute.testing import FakeHttpService
from tests.console.conftest import ADMIN, auth

S = MessageState
hlr = ExternalHttpClient("HLR")
BREAKER = """
[external_systems.HLR.breaker]
minimum_calls = 1
window_size = 1
open_wait = "5m"
trial_calls = 1
"""


async def activate(exchange: Exchange) -> Any:
    return await hlr.post_json("/activations", json.loads(exchange.payload), idempotency_key="k")


APP = Application(route("crm", "activate").json().retry(max_attempts=2, interval=timedelta(minutes=1), backoff=1.0)
                  .ext_call("activate", activate, system="HLR"))


async def test_attempts_and_refused_calls_survive_a_restart(database_url: str, route_test_kit: Any) -> None:
    fake = FakeHttpService({"activation": "A-1"}).fail(None, status=503)
    kit = await route_test_kit(APP, database_url=database_url, external_systems={"HLR": fake}, config=BREAKER)
    message_id = (await kit.send("crm", "activate", {"msisdn": "420777000001"})).message_id
    await kit.settle()  # attempt 1: the call fails, the breaker opens for 5 minutes
    await kit.advance(minutes=1)  # due again: the call is refused (not made, not an attempt), parked
    parked = kit.assert_state(message_id, S.POSTPONED)
    assert (parked.last_error_code, parked.failed_count, fake.calls) == ("CIRCUIT_OPEN", 1, 1)
    await kit.advance(minutes=4)  # attempt 2: the breaker's trial call fails: the retries are spent
    assert kit.assert_state(message_id, S.FAILED).failed_count == 2
    await kit.engine.restart(message_id, cause="admin:ops")
    fake.recover()
    await kit.advance(seconds=1)  # the breaker is open again (its trial failed): refused once more
    kit.assert_state(message_id, S.POSTPONED)
    await kit.advance(minutes=5)  # attempt 3: the trial succeeds
    done = kit.assert_state(message_id, S.OK)
    assert done.failed_count == 0  # the restart started the count again ...

    admin = create_app(kit.engine, admin_auth=auth(), manage_engine=False)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=admin), base_url="http://node") as client:
        answer = await client.get(f"/admin/messages/{message_id}", headers=ADMIN)
        page = await client.get(f"/console/messages/{message_id}", headers=ADMIN)
    assert answer.status_code == 200, answer.text
    detail = answer.json()
    assert (detail["failedCount"], detail["attempts"]) == (0, 3)  # ... the history did not
    [call] = detail["externalCalls"]
    assert (call["callKey"], call["status"], call["attempts"], call["refused"]) == ("activate", "OK", 3, 2)
    assert fake.calls == 3
    assert page.status_code == 200 and 'id="attempts">3<' in page.text and 'id="failed-count">0<' in page.text
    calls = re.search(r'<table id="external-calls">(.*?)</table>', page.text, re.S)
    assert calls and "<td>3</td><td>2</td>" in calls.group(1)


async def test_an_entity_scoped_call_refused_by_the_breaker_is_no_call_made(route_test_kit: Any) -> None:
    app = Application(route("crm", "activate").json().object_id(json="$.msisdn").entity_type("sim")
                      .retry(max_attempts=3, interval=timedelta(minutes=1), backoff=1.0)
                      .ext_call("activate", activate, system="HLR", scope="entity"))
    fake = FakeHttpService({"activation": "A-1"}).fail(1, status=503)
    kit = await route_test_kit(app, external_systems={"HLR": fake}, config=BREAKER)
    message_id = (await kit.send("crm", "activate", {"msisdn": "420777000002"})).message_id
    await kit.settle()  # the call fails, the breaker opens
    await kit.advance(minutes=1)  # refused
    assert kit.assert_state(message_id, S.POSTPONED).last_error_code == "CIRCUIT_OPEN"
    [refused] = kit.store.calls.of_entity("sim", "420777000002")
    assert (refused["status"], refused["attempts"], refused["refused"]) == ("FAILED", 1, 1)
    await kit.advance(minutes=4)  # the trial call succeeds
    kit.assert_state(message_id, S.OK)
    [done] = kit.store.calls.of_entity("sim", "420777000002")
    assert (done["status"], done["attempts"], done["refused"]) == ("OK", 2, 1) and fake.calls == 2
