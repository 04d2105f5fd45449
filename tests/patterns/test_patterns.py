"""The processing patterns of issue 5 on each real database, driven through the route test kit."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import pytest
from openroute.persistence import MessageState

from openroute import Application, BusinessError, ChildMessage, Exchange, TechnicalError, route
from openroute.definitions.interceptors import InterceptionContext, MessageInterceptor
from openroute.testing import CallRecorder, RouteTestKit
from tests.patterns.steps import failing_first_attempt_of

S = MessageState
ONE_MINUTE = timedelta(minutes=1)


@pytest.fixture
async def kit_on(database_url: str, route_test_kit: Any) -> Any:
    async def make(application: Application, **options: Any) -> RouteTestKit:
        return await route_test_kit(application, database_url=database_url, **options)

    return make


# -- external calls ----------------------------------------------------------------------------------------
async def test_mvno_billing_ok_mno_failed_then_only_mno_is_called_again(kit_on: Any) -> None:
    billing = CallRecorder(result={"invoice": "I-1"})
    mno = CallRecorder(fail_first=1)
    app = Application(
        route("crm", "setCustomer").json().object_id(json="$.id").retry(max_attempts=3, interval=ONE_MINUTE)
        .ext_call("billing", billing).ext_call("mno", mno)
    )
    kit = await kit_on(app)
    sent = await kit.send_json("crm", "setCustomer", {"id": "C-1"})
    assert sent.status_code == 202
    await kit.settle()
    failed = kit.assert_state(sent.message_id, S.PARTLY_FAILED)
    assert failed.failed_count == 1 and failed.last_error_code == "DOWN"
    assert (billing.calls, mno.calls) == (1, 1)
    await kit.advance(ONE_MINUTE)
    kit.assert_state(sent.message_id, S.OK)
    assert (billing.calls, mno.calls) == (1, 2)
    calls = kit.external_calls(sent.message_id)
    assert calls["billing"] == ("OK", 1, {"invoice": "I-1"}) and calls["mno"][0] == "OK" and calls["mno"][1] == 2


async def _release_first_then_second_ends_ok(kit: Any, release: asyncio.Event, first_id: int, second_id: int) -> None:
    """Lets the first message's step go on: it ends OK, and the second, held back meanwhile, ends OK at its next
    attempt a minute later."""
    release.set()
    await kit.settle()
    kit.assert_state(first_id, S.OK)
    await kit.advance(ONE_MINUTE)
    kit.assert_state(second_id, S.OK)


async def test_entity_scoped_call_runs_once_for_concurrent_messages_of_one_entity(kit_on: Any) -> None:
    entered = asyncio.Event()
    release = asyncio.Event()
    calls = 0

    async def provision(exchange: Exchange) -> dict[str, int]:
        nonlocal calls
        calls += 1
        entered.set()
        await release.wait()
        return {"sim": 7}

    app = Application(
        route("crm", "setCustomer").json().object_id(json="$.id").entity_type("customer")
        .retry(max_attempts=5, interval=ONE_MINUTE).ext_call("provision", provision, scope="entity")
    )
    kit = await kit_on(app)
    first = await kit.send_json("crm", "setCustomer", {"id": "C-1"})
    async with asyncio.timeout(10):
        await entered.wait()
    second = await kit.send_json("crm", "setCustomer", {"id": "C-1", "again": True})
    await kit.wait_for_state(second.message_id, S.PARTLY_FAILED)  # it found the call in progress: retried later
    assert kit.message(second.message_id).last_error_code == "EXT_CALL_IN_PROGRESS"
    await _release_first_then_second_ends_ok(kit, release, first.message_id, second.message_id)
    assert calls == 1
    assert kit.store.calls.of_entity("customer", "C-1")[0]["status"] == "OK"


# -- business errors -------------------------------------------------------------------------------------
class CustomerBlocked(Exception):
    """An expected exception of the route (a business error)."""


async def test_business_errors_continue_or_fail_per_route(kit_on: Any) -> None:
    ran: list[str] = []

    def warn(exchange: Exchange) -> None:
        ran.append(f"{exchange.message.operation}:warn")
        exchange.add_business_error("ADDRESS", "address incomplete")

    def refuse(exchange: Exchange) -> None:
        ran.append(f"{exchange.message.operation}:refuse")
        raise CustomerBlocked("customer C-1 is blocked")

    def last(exchange: Exchange) -> None:
        ran.append(f"{exchange.message.operation}:last")

    app = Application(
        route("crm", "lenient").json().on_business_error("continue", CustomerBlocked)
        .process(warn).process(refuse).process(last),
        route("crm", "strict").json().on_business_error("fail", CustomerBlocked)
        .process(warn).process(refuse).process(last),
    )
    kit = await kit_on(app)
    lenient = await kit.send_json("crm", "lenient", {"id": 1})
    strict = await kit.send_json("crm", "strict", {"id": 1})
    await kit.settle()
    ok = kit.assert_state(lenient.message_id, S.OK)
    assert ok.business_errors == [{"code": "ADDRESS", "text": "address incomplete"},
                                  {"code": "CustomerBlocked", "text": "customer C-1 is blocked"}]
    failed = kit.assert_state(strict.message_id, S.FAILED)
    assert failed.business_errors == ok.business_errors and failed.last_error_code == "CustomerBlocked"
    assert ran.count("lenient:last") == 1 and "strict:last" not in ran


# -- obsolete detection ----------------------------------------------------------------------------------
async def test_obsolete_message_is_skipped_and_never_processed(kit_on: Any) -> None:
    processed: list[str] = []
    work = failing_first_attempt_of("MSG2", TechnicalError("MNO down"), processed)

    def customer_route(operation: str) -> Any:
        return (route("crm", operation).json().object_id(json="$.customer").entity_type("customer")
                .obsolete_check().retry(max_attempts=5, interval=ONE_MINUTE).process(work))

    kit = await kit_on(Application(customer_route("setCustomerExt"), customer_route("createCustomerExtAll")))
    msg1 = await kit.send_json("crm", "setCustomerExt", {"customer": "C-9"}, correlation_id="MSG1")
    await kit.settle()
    kit.clock.advance(timedelta(seconds=1))
    msg2 = await kit.send_json("crm", "setCustomerExt", {"customer": "C-9"}, correlation_id="MSG2")
    await kit.settle()
    kit.clock.advance(timedelta(seconds=1))
    msg3 = await kit.send_json("crm", "createCustomerExtAll", {"customer": "C-9"}, correlation_id="MSG3")
    await kit.settle()
    kit.assert_state(msg1.message_id, S.OK)
    kit.assert_state(msg2.message_id, S.PARTLY_FAILED)
    kit.assert_state(msg3.message_id, S.OK)
    await kit.advance(ONE_MINUTE)
    skipped = kit.assert_state(msg2.message_id, S.SKIPPED)
    assert skipped.last_error_code == "OBSOLETE"
    assert processed == ["MSG1", "MSG2", "MSG3"]  # MSG2's second attempt never ran the step
    # without an object id nothing is obsolete
    plain = [await kit.send_json("crm", "setCustomerExt", {"other": n}, correlation_id=f"P{n}") for n in (1, 2)]
    await kit.settle()
    assert [kit.state(p.message_id) for p in plain] == [S.OK, S.OK]


# -- splitter --------------------------------------------------------------------------------------------
def _order_app(line_step: Any, confirmations: list[int] | None = None, fail_after_split: bool = False) -> Application:
    attempts = {"n": 0}

    def lines(exchange: Exchange) -> list[Any]:
        import json

        order = json.loads(exchange.payload)
        return [ChildMessage(payload=json.dumps(line), operation="createOrderLine", key=str(line["no"]))
                for line in order["lines"]]

    def after_split(exchange: Exchange) -> None:
        attempts["n"] += 1
        if fail_after_split and attempts["n"] == 1:
            raise TechnicalError("stock service timed out")

    return Application(
        route("shop", "createOrder").json().retry(max_attempts=3, interval=ONE_MINUTE)
        .split(lines, into="createOrderLine").process(after_split),
        route("shop", "createOrderLine").json().retry(max_attempts=3, interval=ONE_MINUTE).process(line_step),
    )


async def test_split_children_in_order_then_parent_ok_and_confirmed_once(kit_on: Any) -> None:
    order_seen: list[str] = []
    app = _order_app(lambda ex: order_seen.append(ex.message.correlation_id))
    kit = await kit_on(app)
    finals: list[tuple[int, MessageState]] = []

    async def hook(message: Any) -> None:
        finals.append((message.id, message.state))

    kit.engine.on_final_state(hook)
    sent = await kit.send_json("shop", "createOrder", {"lines": [{"no": 1}, {"no": 2}, {"no": 3}]},
                               correlation_id="O-1")
    await kit.settle()
    kit.assert_state(sent.message_id, S.OK)
    children = kit.children(sent.message_id)
    assert [c.state for c in children] == [S.OK] * 3
    assert order_seen == ["O-1:1", "O-1:2", "O-1:3"]
    assert [c.parent_id for c in children] == [sent.message_id] * 3
    assert [f for f in finals if f[0] == sent.message_id] == [(sent.message_id, S.OK)]


async def test_split_parent_fails_when_a_child_fails_and_waits_for_retried_children(kit_on: Any) -> None:
    def line(exchange: Exchange) -> None:
        if '"no": 2' in exchange.payload and exchange.message.correlation_id.startswith("BAD"):
            raise BusinessError("OUT_OF_STOCK", "line 2 is out of stock")
        if '"no": 3' in exchange.payload and exchange.message.failed_count == 0:
            raise TechnicalError("warehouse busy")

    kit = await kit_on(_order_app(line))
    bad = await kit.send_json("shop", "createOrder", {"lines": [{"no": 1}, {"no": 2}]}, correlation_id="BAD")
    slow = await kit.send_json("shop", "createOrder", {"lines": [{"no": 1}, {"no": 3}]}, correlation_id="SLOW")
    await kit.settle()
    failed = kit.assert_state(bad.message_id, S.FAILED)
    assert failed.last_error_code == "CHILD_FAILED"
    assert {"code": "OUT_OF_STOCK", "text": "line 2 is out of stock"} in failed.business_errors
    kit.assert_state(slow.message_id, S.WAITING_FOR_CHILDREN)
    assert [c.state for c in kit.children(slow.message_id)] == [S.OK, S.PARTLY_FAILED]
    await kit.advance(ONE_MINUTE)
    kit.assert_state(slow.message_id, S.OK)


async def test_a_split_run_again_stores_no_child_twice(kit_on: Any) -> None:
    kit = await kit_on(_order_app(lambda ex: None, fail_after_split=True))
    sent = await kit.send_json("shop", "createOrder", {"lines": [{"no": 1}, {"no": 2}]}, correlation_id="O-2")
    await kit.settle()
    kit.assert_state(sent.message_id, S.PARTLY_FAILED)
    await kit.advance(ONE_MINUTE)
    kit.assert_state(sent.message_id, S.OK)
    assert [c.correlation_id for c in kit.children(sent.message_id)] == ["O-2:1", "O-2:2"]


# -- funnel and guaranteed order -----------------------------------------------------------------------------
async def test_funnel_holds_a_second_message_postponed_while_the_first_runs(kit_on: Any) -> None:
    entered = asyncio.Event()
    release = asyncio.Event()

    async def slow(exchange: Exchange) -> None:
        if exchange.message.correlation_id == "A":
            entered.set()
            await release.wait()

    kit = await kit_on(Application(route("crm", "update").json().funnel(json="$.customer").process(slow)))
    first = await kit.send_json("crm", "update", {"customer": "C-1"}, correlation_id="A")
    async with asyncio.timeout(10):
        await entered.wait()
    second = await kit.send_json("crm", "update", {"customer": "C-1"}, correlation_id="B")
    other = await kit.send_json("crm", "update", {"customer": "C-2"}, correlation_id="C")
    await kit.wait_for_state(second.message_id, S.POSTPONED)
    await kit.wait_for_state(other.message_id, S.OK)  # another funnel value is not held
    assert kit.message(second.message_id).last_error_code == "FUNNEL"
    await _release_first_then_second_ends_ok(kit, release, first.message_id, second.message_id)


async def test_guaranteed_order_holds_newer_messages_until_the_older_is_final(kit_on: Any) -> None:
    finished: list[str] = []

    def work(exchange: Exchange) -> None:
        if exchange.message.correlation_id == "OLD" and exchange.message.failed_count == 0:
            raise TechnicalError("first attempt fails")
        finished.append(exchange.message.correlation_id)

    app = Application(route("crm", "update").json().funnel(json="$.customer", guaranteed_order=True)
                      .retry(max_attempts=3, interval=ONE_MINUTE).process(work))
    kit = await kit_on(app)
    old = await kit.send_json("crm", "update", {"customer": "C-1"}, correlation_id="OLD")
    await kit.settle()
    kit.assert_state(old.message_id, S.PARTLY_FAILED)
    new = await kit.send_json("crm", "update", {"customer": "C-1"}, correlation_id="NEW")
    await kit.settle()
    kit.assert_state(new.message_id, S.POSTPONED)
    await kit.run_until_final(old.message_id)
    await kit.run_until_final(new.message_id)
    kit.assert_state(new.message_id, S.OK)
    assert finished == ["OLD", "NEW"]


# -- interceptors ----------------------------------------------------------------------------------------
class Recording(MessageInterceptor):
    def __init__(self, name: str, log: list[str]) -> None:
        self.name = name
        self.log = log

    async def around_delivery(self, context: InterceptionContext, call_next: Any) -> None:
        self.log.append(f"{self.name}:before")
        context.metadata.setdefault("seen-by", []).append(self.name)
        if context.message.correlation_id == "DROP" and self.name == "route":
            context.drop("blocked by the route's interceptor")
        if context.message.correlation_id == "BOOM" and self.name == "engine":
            raise RuntimeError("interceptor failed")
        await call_next()
        self.log.append(f"{self.name}:after")

    async def around_step(self, context: InterceptionContext, call_next: Any) -> Any:
        self.log.append(f"{self.name}:step:{context.step_name}")
        return await call_next()


async def test_interceptors_wrap_delivery_and_steps_in_order_and_can_drop(kit_on: Any) -> None:
    log: list[str] = []
    seen: list[list[str]] = []

    def check(exchange: Exchange) -> None:
        seen.append(list(exchange.metadata["seen-by"]))

    app = Application(route("crm", "ping").json().intercept(Recording("route", log)).process(check, name="check"))
    kit = await kit_on(app, interceptors=[Recording("engine", log)])
    ok = await kit.send_json("crm", "ping", {"n": 1}, correlation_id="OK")
    await kit.settle()
    kit.assert_state(ok.message_id, S.OK)
    assert log == ["engine:before", "route:before", "engine:step:check", "route:step:check", "route:after",
                   "engine:after"]
    assert seen == [["engine", "route"]]
    dropped = await kit.send_json("crm", "ping", {"n": 2}, correlation_id="DROP")
    boom = await kit.send_json("crm", "ping", {"n": 3}, correlation_id="BOOM")
    await kit.settle()
    skipped = kit.assert_state(dropped.message_id, S.SKIPPED)
    assert (skipped.last_error_code, skipped.last_error_text) == ("DROPPED", "blocked by the route's interceptor")
    failed = kit.assert_state(boom.message_id, S.PARTLY_FAILED)
    assert failed.last_error_code == "RuntimeError" and len(seen) == 1


def test_a_drop_needs_a_reason() -> None:
    context = InterceptionContext(message=None, exchange=None, route=None)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="needs a reason"):
        context.drop("  ")
