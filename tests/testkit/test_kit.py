"""The route test kit itself: sending through the real endpoints, driving time, reading the store, its assertions
failing tests, the fake external function, and the pytest fixture a user's project gets from the entry point."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from openroute.persistence import MessageState

from openroute import Exchange, RouteRegistry
from openroute.definitions.errors import BusinessError, TechnicalError
from openroute.definitions.interceptors import InterceptionContext, MessageInterceptor
from openroute.dsl import Application, route
from openroute.testing import CallRecorder, RecordedCall, RouteTestKit, SendResult

S = MessageState
NS = "http://openroute.dev/kit"
ONE_MINUTE = timedelta(minutes=1)


def customer_app(billing: Any, mno: Any, *, attempts: int = 3) -> Application:
    """A setCustomer route on SOAP and JSON: required id, object id, two external calls."""
    return Application(
        route("crm", "setCustomer")
        .soap(f"{{{NS}}}setCustomerRequest", namespaces={"k": NS}).json()
        .require("k:id", json="$.id")
        .object_id("k:id", json="$.id").entity_type("customer")
        .retry(max_attempts=attempts, interval=ONE_MINUTE)
        .ext_call("billing", billing).ext_call("mno", mno)
    )


def soap_request(customer: str) -> str:
    return f'<k:setCustomerRequest xmlns:k="{NS}"><k:id>{customer}</k:id></k:setCustomerRequest>'


# -- sending -----------------------------------------------------------------------------------------------------
async def test_send_json_goes_through_the_binding_and_the_engine(database_url: str, route_test_kit: Any) -> None:
    billing, mno = CallRecorder(result={"account": "A-1"}), CallRecorder()
    kit = await route_test_kit(customer_app(billing, mno), database_url=database_url)
    sent = await kit.send("crm", "setCustomer", {"id": "C-1"}, correlation_id="corr-1", source_system="crm")
    assert isinstance(sent, SendResult) and sent.accepted and sent.status_code == 202
    assert (sent.correlation_id, sent.duplicate, sent.error_code) == ("corr-1", False, None)
    await kit.settle()
    done = kit.assert_state(sent.message_id, S.OK)
    assert (done.object_id, done.entity_type, done.source_system) == ("C-1", "customer", "crm")
    assert (billing.calls, mno.calls) == (1, 1) and billing.arguments[0].message.id == sent.message_id
    assert kit.external_calls(sent.message_id) == {"billing": ("OK", 1, {"account": "A-1"}),
                                                   "mno": ("OK", 1, {"ok": True})}
    assert kit.count_by_state() == {"OK": 1}
    again = await kit.send("crm", "setCustomer", {"id": "C-1"}, correlation_id="corr-1", source_system="crm")
    assert again.duplicate and again.accepted and again.message_id == sent.message_id and again.status_code == 200


async def test_send_soap_wraps_the_request_element_or_sends_a_whole_envelope(route_test_kit: Any) -> None:
    kit = await route_test_kit(customer_app(CallRecorder(), CallRecorder()))
    wrapped = await kit.send("crm", "setCustomer", soap_request("C-1"))
    envelope_12 = (f'<?xml version="1.0"?><env:Envelope xmlns:env="http://www.w3.org/2003/05/soap-envelope">'
                   f"<env:Body>{soap_request('C-2')}</env:Body></env:Envelope>")
    whole = await kit.send("crm", "setCustomer", envelope_12)
    assert wrapped.accepted and whole.accepted and wrapped.status_code == whole.status_code == 200
    await kit.settle()
    first, second = kit.assert_state(wrapped.message_id, S.OK), kit.assert_state(whole.message_id, S.OK)
    assert (first.object_id, second.object_id) == ("C-1", "C-2")
    assert (first.content_type, second.headers["soapVersion"]) == ("application/xml", "1.2")
    duplicate = await kit.send("crm", "setCustomer", soap_request("C-1"), correlation_id=first.correlation_id)
    assert duplicate.duplicate and duplicate.message_id == first.id


async def test_refused_requests_are_typed_and_store_nothing(route_test_kit: Any) -> None:
    kit = await route_test_kit(customer_app(CallRecorder(), CallRecorder()))
    missing = await kit.send("crm", "setCustomer", {"name": "no id"})
    assert (missing.accepted, missing.status_code, missing.message_id) == (False, 400, None)
    assert missing.error_code == "VALIDATION_ERROR" and "required $.id is missing" in (missing.reason or "")
    fault = await kit.send("crm", "setCustomer", f'<k:setCustomerRequest xmlns:k="{NS}"/>')
    assert (fault.accepted, fault.status_code, fault.error_code) == (False, 500, "VALIDATION_ERROR")  # SOAP 1.1
    assert "required k:id is missing" in (fault.reason or "")
    unknown = await kit.send("crm", "nothing", {"id": "C-1"})
    assert (unknown.accepted, unknown.status_code, unknown.error_code) == (False, 404, "UNKNOWN_OPERATION")
    not_json = await kit.send("crm", "setCustomer", "{broken")
    assert not not_json.accepted and not_json.status_code == 400
    assert kit.count_by_state() == {}
    with pytest.raises(ValueError, match="soap_action is for SOAP requests"):
        await kit.send("crm", "setCustomer", {"id": "C-1"}, soap_action="urn:x")


async def test_send_fails_the_test_when_soap_routes_to_another_operation(route_test_kit: Any) -> None:
    app = Application(route("crm", "a").soap(f"{{{NS}}}a").process(lambda ex: None),
                      route("crm", "b").soap(f"{{{NS}}}b").process(lambda ex: None))
    kit = await route_test_kit(app)
    with pytest.raises(AssertionError, match="routed to crm/a, not crm/b"):
        await kit.send("crm", "b", f'<a xmlns="{NS}"/>')


# -- time, retries and waiting ---------------------------------------------------------------------------------
async def test_advance_drives_retries_until_ok_and_only_the_failed_call_is_repeated(
    database_url: str, route_test_kit: Any
) -> None:
    billing, mno = CallRecorder(), CallRecorder(fail_first=2)
    kit = await route_test_kit(customer_app(billing, mno), database_url=database_url)
    sent = await kit.send("crm", "setCustomer", {"id": "C-1"})
    await kit.settle()
    failed = kit.assert_state(sent.message_id, "PARTLY_FAILED")
    assert (failed.failed_count, failed.last_error_code) == (1, "DOWN")
    await kit.advance(seconds=30)  # not due yet: nothing happens
    kit.assert_state(sent.message_id, S.PARTLY_FAILED)
    assert mno.calls == 1
    await kit.advance(seconds=30)
    kit.assert_state(sent.message_id, S.PARTLY_FAILED)
    final = await kit.run_until_final(sent.message_id)
    assert final.state is S.OK and (billing.calls, mno.calls, mno.failures) == (1, 3, 2)
    calls = kit.external_calls(sent.message_id)
    assert calls["billing"] == RecordedCall("OK", 1, {"ok": True}) and calls["mno"].attempts == 3


async def test_exhausted_retries_end_failed_and_run_until_final_gives_up(route_test_kit: Any) -> None:
    never = CallRecorder(fail_first=1000)
    kit = await route_test_kit(customer_app(CallRecorder(), never, attempts=2))
    sent = await kit.send("crm", "setCustomer", {"id": "C-1"})
    failed = await kit.run_until_final(sent.message_id)
    assert failed.state is S.FAILED and never.calls == 2
    slow = Application(route("crm", "slow").json().retry(max_attempts=5, interval=timedelta(hours=1))
                       .process(CallRecorder(fail_first=1000)))
    other = await route_test_kit(slow)
    stuck = await other.send("crm", "slow", {"id": 1})
    with pytest.raises(AssertionError, match=r"is still PARTLY_FAILED after 2 steps of 0:01:00"):
        await other.run_until_final(stuck.message_id, max_steps=2)


async def test_settle_fails_the_test_when_the_engine_does_not_go_idle(route_test_kit: Any) -> None:
    entered, release = asyncio.Event(), asyncio.Event()

    async def held(exchange: Exchange) -> None:
        entered.set()
        await release.wait()

    kit = await route_test_kit(Application(route("crm", "held").json().process(held),
                                           route("crm", "quick").json().process(lambda ex: None)))
    sent = await kit.send("crm", "held", {"id": 1})
    async with asyncio.timeout(10):
        await entered.wait()
    with pytest.raises(AssertionError, match=r"did not settle within 0.05 s \(1 in flight"):
        await kit.settle(timeout=0.05)
    quick = await kit.send("crm", "quick", {"id": 2})
    await kit.wait_for_state(quick.message_id, S.OK)  # while the other one holds the engine busy
    await kit.wait_for_state(sent.message_id, S.PROCESSING, S.OK)
    with pytest.raises(AssertionError, match=f"message {sent.message_id} is PROCESSING, not OK after 0.05 s"):
        await kit.wait_for_state(sent.message_id, S.OK, timeout=0.05)
    release.set()
    await kit.wait_for_state(sent.message_id, S.OK)
    await kit.settle()
    with pytest.raises(ValueError, match="at least one state"):
        await kit.wait_for_state(sent.message_id)


# -- reading the store and the assertion helpers -------------------------------------------------------------------
async def test_assertions_fail_a_test_with_the_reason(route_test_kit: Any) -> None:
    def refuse(exchange: Exchange) -> None:
        raise BusinessError("NO_CREDIT", "customer has no credit")

    kit = await route_test_kit(Application(route("crm", "x").json().process(refuse)))
    sent = await kit.send("crm", "x", {"a": 1})
    await kit.settle()
    with pytest.raises(AssertionError, match=r"is FAILED, expected OK \(last error NO_CREDIT: "):
        kit.assert_state(sent.message_id, S.OK)
    assert kit.assert_state(sent.message_id, "FAILED").business_errors
    with pytest.raises(AssertionError, match="no message 999 in the store"):
        kit.state(999)
    with pytest.raises(ValueError):
        kit.assert_state(sent.message_id, "NOT_A_STATE")


async def test_children_and_entity_calls(route_test_kit: Any) -> None:
    provision = CallRecorder(result={"line": "L"})
    app = Application(
        route("shop", "order").json().object_id(json="$.id").entity_type("order")
        .ext_call("reserve", provision, scope="entity")
        .split(lambda ex: [{"n": 1}, {"n": 2}], into="line"),
        route("shop", "line").json().process(lambda ex: None),
    )
    kit = await route_test_kit(app)
    sent = await kit.send("shop", "order", {"id": "O-1"})
    await kit.settle()
    kit.assert_state(sent.message_id, S.OK)
    children = kit.children(sent.message_id)
    assert [(c.operation, c.payload, c.state) for c in children] == [
        ("line", '{"n": 1}', S.OK), ("line", '{"n": 2}', S.OK)]
    assert kit.entity_calls("order", "O-1") == {"reserve": ("OK", 1, {"line": "L"})}
    assert kit.external_calls(sent.message_id) == {} and kit.entity_calls("order", "O-2") == {}
    assert kit.count_by_state() == {"OK": 3}


async def test_kit_as_a_context_manager_removes_its_database() -> None:
    kit = RouteTestKit(Application(route("crm", "x").json().process(lambda ex: None)))
    async with kit:
        sent = await kit.send("crm", "x", {"a": 1})
        await kit.settle()
        kit.assert_state(sent.message_id, S.OK)
        health = await kit.client.get("/health")
        assert health.status_code == 200
    assert kit._tmp is not None and not Path(kit._tmp.name).exists()


async def test_a_bare_registry_with_bindings_and_engine_wide_interceptors(route_test_kit: Any) -> None:
    class Stamp(MessageInterceptor):
        async def around_delivery(self, context: InterceptionContext, call_next: Any) -> None:
            if context.message.object_id == "drop-me":
                context.drop("not for us")
            await call_next()

    definition = route("crm", "x").json().object_id(json="$.id").process(lambda ex: None).build()
    registry = RouteRegistry([definition.route])
    default = await route_test_kit(registry)  # default bindings: no extraction
    plain = await default.send("crm", "x", {"id": "A"})
    await default.settle()
    assert default.assert_state(plain.message_id, S.OK).object_id is None
    kit = await route_test_kit(registry, bindings=definition.bindings, interceptors=[Stamp()])
    kept, dropped = await kit.send("crm", "x", {"id": "A"}), await kit.send("crm", "x", {"id": "drop-me"})
    await kit.settle()
    assert kit.assert_state(kept.message_id, S.OK).object_id == "A"
    gone = kit.assert_state(dropped.message_id, S.SKIPPED)
    assert (gone.last_error_code, gone.last_error_text) == ("DROPPED", "not for us")


# -- the fake external function -----------------------------------------------------------------------------------
def test_call_recorder_counts_fails_first_n_then_answers() -> None:
    recorder = CallRecorder(result=lambda x: {"echo": x}, fail_first=2)
    for _ in range(2):
        with pytest.raises(TechnicalError, match="remote system unavailable"):
            recorder("a")
    assert recorder("b") == {"echo": "b"}
    assert (recorder.calls, recorder.failures, recorder.arguments) == (3, 2, ["a", "a", "b"])
    business = CallRecorder(fail_first=1, error=BusinessError("REFUSED", "no"))
    with pytest.raises(BusinessError, match="no"):
        business()
    assert business() == {"ok": True} and business.arguments == [(), ()]
    by_class = CallRecorder(fail_first=1, error=KeyError)
    with pytest.raises(KeyError):
        by_class(1, 2)
    assert by_class.arguments == [(1, 2)]


@pytest.mark.parametrize(
    ("options", "error", "reason"),
    [
        ({"fail_first": -1}, ValueError, "fail_first must be an integer >= 0"),
        ({"fail_first": True}, ValueError, "fail_first must be an integer >= 0"),
        ({"error": "boom"}, TypeError, "error must be an exception"),
    ],
)
def test_call_recorder_rejects_bad_settings(options: dict[str, Any], error: type[Exception], reason: str) -> None:
    with pytest.raises(error, match=reason):
        CallRecorder(**options)


# -- the pytest plugin --------------------------------------------------------------------------------------------
def test_a_users_project_gets_the_fixture_from_the_entry_point(tmp_path: Path) -> None:
    """A project with no conftest: the ``route_test_kit`` fixture comes from the installed pytest11 plugin."""
    (tmp_path / "pytest.ini").write_text("[pytest]\nasyncio_mode = auto\n")
    (tmp_path / "test_user_route.py").write_text(textwrap.dedent("""
        from openroute.dsl import Application, route
        from openroute.testing import CallRecorder

        async def test_route(route_test_kit):
            mno = CallRecorder(fail_first=1)
            kit = await route_test_kit(Application(route("crm", "set").json().ext_call("mno", mno)))
            sent = await kit.send("crm", "set", {"id": "C-1"})
            await kit.settle()
            kit.assert_state(sent.message_id, "PARTLY_FAILED")
            await kit.advance(minutes=5)
            kit.assert_state(sent.message_id, "OK")
            assert mno.calls == 2

        async def test_state_not_reached(route_test_kit):
            kit = await route_test_kit(Application(route("crm", "set").json().process(lambda ex: 1 / 0)))
            sent = await kit.send("crm", "set", {"id": "C-1"})
            await kit.settle()
            kit.assert_state(sent.message_id, "OK")
    """))
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly", str(tmp_path)],
        cwd=tmp_path, capture_output=True, text=True, timeout=120, env=env,
    )
    output = done.stdout + done.stderr
    assert "1 failed, 1 passed" in output, output
    assert "message 1 is PARTLY_FAILED, expected OK (last error ZeroDivisionError" in output, output
