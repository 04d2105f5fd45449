"""Scenarios of the reference routes (routes/), through their real endpoints, on each real database."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest
from openroute.confirmation import (
    ConfirmationCallback,
    ConfirmationRequest,
    ConfirmationSendError,
    ConfirmationService,
)
from openroute.persistence import MessageState
from openroute_reference import ReferenceSystems, build_application, external_systems
from openroute_reference.mvno import NAMESPACE as MVNO

S = MessageState


@pytest.fixture
def systems() -> ReferenceSystems:
    return external_systems()  # the in-process fakes (no URLs configured in the tests)


@pytest.fixture
async def kit(database_url: str, route_test_kit: Any, systems: ReferenceSystems) -> Any:
    return await route_test_kit(build_application(systems), database_url=database_url)


def _customer(customer: str, msisdn: str = "420777123456", operation: str = "setCustomer") -> str:
    return (f'<m:{operation}Request xmlns:m="{MVNO}"><m:customerId>{customer}</m:customerId>'
            f"<m:msisdn>{msisdn}</m:msisdn><m:tariff>unlimited</m:tariff></m:{operation}Request>")


async def test_set_customer_over_soap_calls_billing_then_mno(kit: Any, systems: ReferenceSystems) -> None:
    sent = await kit.send_soap("crm", _customer("C-1"), correlation_id="crm-1", source_system="CRM")
    assert sent.status_code == 200 and sent.message_id is not None
    await kit.settle()
    done = kit.assert_state(sent.message_id, S.OK)
    assert (done.object_id, done.entity_type) == ("C-1", "customer")
    assert done.custom_data == {"accountId": "BILLING-C-1-1", "activationId": "MNO-C-1-1"}
    assert systems.billing_fake is not None and systems.mno_fake is not None
    assert (systems.billing_fake.calls["C-1"], systems.mno_fake.calls["C-1"]) == (1, 1)


async def test_mno_down_once_then_only_the_mno_is_called_again(kit: Any, systems: ReferenceSystems) -> None:
    assert systems.mno_fake is not None and systems.billing_fake is not None
    systems.mno_fake.fail_next(1)
    sent = await kit.send_json("crm", "setCustomer", {"customerId": "C-2", "msisdn": "420777000111"})
    await kit.settle()
    failed = kit.assert_state(sent.message_id, S.PARTLY_FAILED)
    assert failed.last_error_code == "HTTP_503"
    await kit.advance(timedelta(seconds=30))
    kit.assert_state(sent.message_id, S.OK)
    assert (systems.billing_fake.calls["C-2"], systems.mno_fake.calls["C-2"]) == (1, 2)


async def test_soap_fault_fails_the_message_with_a_business_error_and_a_confirmation(
    kit: Any, systems: ReferenceSystems
) -> None:
    service = ConfirmationService(kit.store, _Recorder(fail_first=0), clock=kit.clock)  # keeps rows
    kit.engine.on_final_state_in_transaction(service.on_final_state_tx)
    sent = await kit.send_json("crm", "setCustomer", {"customerId": "blocked-7", "msisdn": "420777000222"},
                               source_system="CRM")
    await kit.settle()
    failed = kit.assert_state(sent.message_id, S.FAILED)
    assert failed.business_errors == [{"code": "Client", "text": "customer blocked-7 is blocked in billing"}]
    confirmation = await service.get(sent.message_id)
    assert confirmation is not None and confirmation.outcome_state == "FAILED"
    assert systems.mno_fake is not None and systems.mno_fake.calls["blocked-7"] == 0


async def test_a_newer_ok_message_of_the_other_operation_makes_an_older_one_obsolete(
    kit: Any, systems: ReferenceSystems
) -> None:
    assert systems.mno_fake is not None
    msg1 = await kit.send_soap("crm", _customer("C-3"), correlation_id="MSG1")
    await kit.settle()
    kit.clock.advance(timedelta(seconds=1))
    systems.mno_fake.fail_next(1)
    msg2 = await kit.send_soap("crm", _customer("C-3"), correlation_id="MSG2")
    await kit.settle()
    kit.clock.advance(timedelta(seconds=1))
    msg3 = await kit.send_json("crm", "createCustomerExtAll", {"customerId": "C-3", "msisdn": "420777000333"},
                               correlation_id="MSG3")
    await kit.settle()
    assert [kit.state(m.message_id) for m in (msg1, msg2, msg3)] == [S.OK, S.PARTLY_FAILED, S.OK]
    mno_calls = systems.mno_fake.calls["C-3"]
    await kit.advance(timedelta(minutes=1))
    kit.assert_state(msg2.message_id, S.SKIPPED)
    assert systems.mno_fake.calls["C-3"] == mno_calls  # MSG2 was never processed again


async def test_bad_customer_requests_are_refused_and_nothing_is_stored(kit: Any) -> None:
    missing = await kit.send_json("crm", "setCustomer", {"customerId": "C-4"})
    bad_number = await kit.send_soap("crm", _customer("C-4", msisdn="12ab"))
    assert missing.status_code == 400 and missing.error_code == "INVALID_BODY"
    assert [(f["field"], f["type"]) for f in json.loads(missing.body)["fields"]] == [("msisdn", "missing")]
    assert bad_number.status_code == 500 and bad_number.error_code == "INVALID_BODY"  # SOAP 1.1 Fault
    assert "msisdn: String should match pattern" in bad_number.body
    assert kit.count_by_state() == {}


async def test_order_is_split_into_lines_and_ends_ok(kit: Any) -> None:
    order = {"orderId": "O-1", "lines": [{"sku": "A", "quantity": 1}, {"sku": "B", "quantity": 2},
                                         {"sku": "C", "quantity": 3}]}
    sent = await kit.send_json("shop", "createOrder", order, source_system="SHOP")
    await kit.settle()
    kit.assert_state(sent.message_id, S.OK)
    lines = kit.children(sent.message_id)
    assert [(c.object_id, c.state) for c in lines] == [("O-1/1", S.OK), ("O-1/2", S.OK), ("O-1/3", S.OK)]
    assert lines[1].custom_data == {"reserved": {"sku": "B", "quantity": 2}}


async def test_order_with_a_bad_line_fails_and_is_confirmed_once(kit: Any) -> None:
    service = ConfirmationService(kit.store, _Recorder(fail_first=0), clock=kit.clock)  # keeps rows
    kit.engine.on_final_state_in_transaction(service.on_final_state_tx)
    order = {"orderId": "O-2", "lines": [{"sku": "A", "quantity": 1}, {"sku": "B", "quantity": 0}]}
    sent = await kit.send_json("shop", "createOrder", order, source_system="SHOP")
    await kit.settle()
    failed = kit.assert_state(sent.message_id, S.FAILED)
    assert failed.business_errors == [{"code": "INVALID_QUANTITY", "text": "line 'B' has quantity 0"}]
    assert [c.state for c in kit.children(sent.message_id)] == [S.OK, S.FAILED]
    confirmations = await service.find(limit=10)
    assert [c.message_id for c in confirmations] == [sent.message_id]  # the lines are not confirmed on their own


async def test_mno_fault_after_billing_fails_the_message_without_retrying(kit: Any, systems: ReferenceSystems) -> None:
    assert systems.billing_fake is not None and systems.mno_fake is not None
    systems.mno_fake.fault_next(1, "SimUnavailable")
    sent = await kit.send_json("crm", "setCustomer", {"customerId": "C-9", "msisdn": "420777000999"})
    await kit.settle()
    failed = kit.assert_state(sent.message_id, S.FAILED)
    assert failed.business_errors == [{"code": "SimUnavailable", "text": "mno refused the request"}]
    await kit.advance(timedelta(minutes=30))  # a business error is final: nothing is called again
    assert (systems.billing_fake.calls["C-9"], systems.mno_fake.calls["C-9"]) == (1, 1)


class _Recorder(ConfirmationCallback):
    """A source system that is down for its first ``fail_first`` confirmations, then records them."""

    def __init__(self, fail_first: int) -> None:
        self.fail_first, self.attempts, self.received = fail_first, 0, []

    async def confirm(self, request: ConfirmationRequest) -> None:
        self.attempts += 1
        if self.attempts <= self.fail_first:
            raise ConfirmationSendError("source system down")
        self.received.append(request)


async def test_each_final_message_is_confirmed_exactly_once(kit: Any, systems: ReferenceSystems) -> None:
    assert systems.mno_fake is not None
    recorder = _Recorder(fail_first=2)
    service = ConfirmationService(kit.store, recorder, clock=kit.clock)
    kit.engine.on_final_state_in_transaction(service.on_final_state_tx)
    kit.engine.on_final_state(service.on_final_state)
    ok = await kit.send_soap("crm", _customer("C-10"), correlation_id="ok", source_system="CRM")
    await kit.settle()
    kit.clock.advance(timedelta(seconds=1))
    systems.mno_fake.fault_next(1)
    failed = await kit.send_json("crm", "setCustomer", {"customerId": "C-11", "msisdn": "420777000011"},
                                 correlation_id="failed", source_system="CRM")
    await kit.settle()
    order = await kit.send_json("shop", "createOrder", {"orderId": "O-10", "lines": [
        {"sku": "A", "quantity": 1}, {"sku": "B", "quantity": 1}]}, correlation_id="order", source_system="SHOP")
    await kit.settle()
    systems.mno_fake.fail_next(1)
    cancelled = await kit.send_json("crm", "setCustomer", {"customerId": "C-12", "msisdn": "420777000012"},
                                    correlation_id="cancelled", source_system="CRM")
    await kit.settle()
    await kit.engine.cancel(cancelled.message_id)
    await kit.settle()
    for _ in range(6):  # the confirmations that failed come back on their own schedule; sent ones never do
        kit.clock.advance(timedelta(minutes=5))
        await service.process_due()
    received = sorted((r.correlation_id, r.state, [e.code for e in r.business_errors]) for r in recorder.received)
    assert received == [("cancelled", "CANCEL", []), ("failed", "FAILED", ["Server"]), ("ok", "OK", []),
                        ("order", "OK", [])]
    assert recorder.attempts == 4 + 2
    infos = {info.message_id: info for info in await service.find(limit=20)}
    assert set(infos) == {ok.message_id, failed.message_id, order.message_id, cancelled.message_id}
    assert all(info.status == "SENT" for info in infos.values())
