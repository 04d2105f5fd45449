"""The fakes of external systems (openroute/testing/_fakes.py, _fake_http.py, _fake_soap.py) behind routes written with
the shipped clients, as they are: the kit's ``external_systems`` and ``config``, canned answers, failures, latency,
recorded requests with their idempotency keys, and the breaker on the kit's clock."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from openroute.persistence import MessageState

from openroute import Exchange, route
from openroute.definitions.errors import ConfigurationError
from openroute.dsl import Application
from openroute.outbound import BreakerState, ExternalHttpClient, ExternalSystem, SoapService
from openroute.testing import FakeHttpService, FakeRequest, FakeSoapService, RouteTestKit

S = MessageState
WSDL = Path(__file__).resolve().parents[1] / "outbound" / "billing.wsdl"
payments = ExternalHttpClient("PAYMENTS")  # module level, as a route module has it
billing = SoapService(WSDL, address="http://billing.example/ws")


async def pay(exchange: Exchange) -> Any:
    order = json.loads(exchange.payload)
    return await payments.post_json("/charges", {"order": order["id"]},
                                    idempotency_key=exchange.idempotency_key("pay"))


async def charge(exchange: Exchange) -> Any:
    return await billing.call("charge", customerId=json.loads(exchange.payload)["id"], amount="10.00")


PAY = Application(route("shop", "order").json().retry(max_attempts=3, interval=timedelta(minutes=1), backoff=1.0)
                  .ext_call("pay", pay, system="PAYMENTS"))
CHARGE = Application(route("shop", "charge").json().retry(max_attempts=3, interval=timedelta(minutes=1), backoff=1.0)
                     .ext_call("charge", charge, system="BILLING"))


# -- HTTP --------------------------------------------------------------------------------------------------------
async def test_a_route_with_the_shipped_http_client_calls_the_fake_with_its_idempotency_key(
        database_url: str, route_test_kit: Any) -> None:
    fake = FakeHttpService({"charge": "CH-1"})
    kit = await route_test_kit(PAY, database_url=database_url, external_systems={"PAYMENTS": fake})
    sent = await kit.send("shop", "order", {"id": "O-1"})
    await kit.settle()
    done = kit.assert_state(sent.message_id, S.OK)
    assert kit.external_calls(done.id)["pay"] == ("OK", 1, {"charge": "CH-1"})
    [request] = fake.requests
    assert (request.method, request.path, request.json) == ("POST", "/charges", {"order": "O-1"})
    assert request.idempotency_key is not None and request.headers["idempotency-key"] == request.idempotency_key
    assert kit.breaker_state("PAYMENTS") is BreakerState.CLOSED


async def test_programmed_failures_are_retried_with_the_same_idempotency_key(route_test_kit: Any) -> None:
    fake = FakeHttpService().fail(1, status=503).fail(1, error="timeout")
    kit = await route_test_kit(PAY, external_systems={"PAYMENTS": fake})
    sent = await kit.send("shop", "order", {"id": "O-1"})
    await kit.settle()
    assert kit.assert_state(sent.message_id, S.PARTLY_FAILED).last_error_code == "HTTP_503"
    await kit.advance(minutes=1)
    assert kit.assert_state(sent.message_id, S.PARTLY_FAILED).last_error_code == "TIMEOUT"
    await kit.advance(minutes=1)
    kit.assert_state(sent.message_id, S.OK)
    assert fake.calls == 3 and len(set(fake.idempotency_keys)) == 1


async def test_a_refused_connection_and_a_4xx_answer(route_test_kit: Any) -> None:
    fake = FakeHttpService().fail(error="connect").on("POST", "/charges", {"error": "no such card"}, status=404)
    kit = await route_test_kit(PAY, external_systems={"PAYMENTS": fake})
    sent = await kit.send("shop", "order", {"id": "O-1"})
    await kit.settle()
    assert kit.assert_state(sent.message_id, S.PARTLY_FAILED).last_error_code == "CONNECTION_ERROR"
    await kit.advance(minutes=1)
    failed = kit.assert_state(sent.message_id, S.FAILED)  # a 4xx is an answer: a business error, at once
    assert [error["code"] for error in failed.business_errors] == ["HTTP_404"]


async def test_answers_by_path_and_computed_from_the_request(route_test_kit: Any) -> None:
    def echo(request: FakeRequest) -> Any:
        return {"paid": request.json["order"]}

    fake = FakeHttpService("not this").on("post", "/charges", echo, status=201)
    kit = await route_test_kit(PAY, external_systems={"PAYMENTS": fake})
    sent = await kit.send("shop", "order", {"id": "O-7"})
    await kit.settle()
    assert kit.external_calls(sent.message_id)["pay"].result == {"paid": "O-7"}
    raw = FakeHttpService(httpx.Response(200, content=b"not json"))
    kit = await route_test_kit(PAY, external_systems={"PAYMENTS": raw})
    sent = await kit.send("shop", "order", {"id": "O-8"})
    await kit.settle()
    assert kit.assert_state(sent.message_id, S.PARTLY_FAILED).last_error_code == "INVALID_RESPONSE"


async def test_latency_past_the_call_timeout_or_the_read_timeout_is_a_timeout(route_test_kit: Any) -> None:
    slow = FakeHttpService(latency=30)
    kit = await route_test_kit(PAY, external_systems={"PAYMENTS": slow},
                               config='[external_systems.PAYMENTS]\ncall_timeout = "50ms"\n')
    sent = await kit.send("shop", "order", {"id": "O-1"})
    await kit.settle()
    assert kit.assert_state(sent.message_id, S.PARTLY_FAILED).last_error_code == "TIMEOUT"
    reading = FakeHttpService(latency=30)
    kit = await route_test_kit(PAY, external_systems={"PAYMENTS": reading},
                               config='[external_systems.PAYMENTS]\ntimeout = "50ms"\n')
    sent = await kit.send("shop", "order", {"id": "O-2"})
    await kit.settle()
    failed = kit.assert_state(sent.message_id, S.PARTLY_FAILED)
    assert failed.last_error_code == "TIMEOUT" and "ReadTimeout" in (failed.last_error_text or "")
    assert reading.calls == 1


async def test_the_breaker_opens_on_the_fakes_failures_parks_messages_and_closes_on_the_kits_clock(
        route_test_kit: Any) -> None:
    fake = FakeHttpService().fail(None, status=503)  # down until recover()
    kit = await route_test_kit(PAY, external_systems={"PAYMENTS": fake}, config="""
[external_systems.PAYMENTS.breaker]
minimum_calls = 2
window_size = 2
open_wait = "30s"
trial_calls = 1
""")
    first, second = [(await kit.send("shop", "order", {"id": f"O-{n}"})).message_id for n in (1, 2)]
    await kit.settle()
    assert kit.breaker_state("PAYMENTS") is BreakerState.OPEN
    third = (await kit.send("shop", "order", {"id": "O-3"})).message_id
    await kit.settle()
    parked = kit.assert_state(third, S.POSTPONED)
    assert (parked.last_error_code, parked.failed_count, fake.calls) == ("CIRCUIT_OPEN", 0, 2)  # not called
    fake.recover()
    for message_id in (first, second, third):
        assert (await kit.run_until_final(message_id)).state is S.OK
    assert kit.breaker_state("PAYMENTS") is BreakerState.CLOSED
    assert fake.calls == 5  # two failures, then one success each


# -- SOAP --------------------------------------------------------------------------------------------------------
async def test_a_route_with_a_soap_service_calls_the_fake_answering_from_the_wsdl(
        database_url: str, route_test_kit: Any) -> None:
    fake = FakeSoapService(WSDL).answer("charge", {"invoiceId": "INV-1"})
    kit = await route_test_kit(CHARGE, database_url=database_url, external_systems={"BILLING": fake})
    sent = await kit.send("shop", "charge", {"id": "C-1"})
    await kit.settle()
    kit.assert_state(sent.message_id, S.OK)
    assert kit.external_calls(sent.message_id)["charge"].result == "INV-1"
    [request] = fake.requests
    assert request.operation == "charge" and request.idempotency_key is not None
    assert "<ns0:customerId>C-1</ns0:customerId>" in request.text


async def test_soap_faults_failures_and_operations_without_an_answer(route_test_kit: Any) -> None:
    fake = FakeSoapService(WSDL).fault("Client", "customer is blocked")
    kit = await route_test_kit(CHARGE, external_systems={"BILLING": fake})
    blocked = await kit.send("shop", "charge", {"id": "C-1"})
    await kit.settle()
    failed = kit.assert_state(blocked.message_id, S.FAILED)
    assert failed.business_errors == [{"code": "Client", "text": "customer is blocked"}]
    fake.fail(1, status=503)
    down = await kit.send("shop", "charge", {"id": "C-2"})
    await kit.settle()
    assert kit.assert_state(down.message_id, S.PARTLY_FAILED).last_error_code == "HTTP_503"
    await kit.advance(minutes=1)  # no answer programmed for charge: a fault that says so
    unanswered = kit.assert_state(down.message_id, S.FAILED)
    assert "no answer for charge" in unanswered.business_errors[0]["text"]
    fake.answer("charge", lambda request: f'<b:chargeResponse xmlns:b="urn:example:billing:v1">'
                                          f"<b:invoiceId>INV-{request.operation}</b:invoiceId></b:chargeResponse>")
    ok = await kit.send("shop", "charge", {"id": "C-3"})
    await kit.settle()
    kit.assert_state(ok.message_id, S.OK)
    assert kit.external_calls(ok.message_id)["charge"].result == "INV-charge"
    assert [r.idempotency_key is not None for r in fake.requests] == [True] * 4


async def test_a_slow_soap_fake_meets_the_call_timeout_or_the_services_own_timeout(route_test_kit: Any) -> None:
    slow = FakeSoapService(WSDL, latency=30).answer("charge", {"invoiceId": "INV-1"})
    kit = await route_test_kit(CHARGE, external_systems={"BILLING": slow},
                               config='[external_systems.BILLING]\ncall_timeout = "50ms"\n')
    sent = await kit.send("shop", "charge", {"id": "C-1"})
    await kit.settle()
    assert kit.assert_state(sent.message_id, S.PARTLY_FAILED).last_error_code == "TIMEOUT"
    # the SoapService's own read timeout reaches the fake, as it would reach the network
    impatient = SoapService(WSDL, address="http://billing.example/ws", timeout=0.05)

    async def charge_quickly(exchange: Exchange) -> Any:
        return await impatient.call("charge", customerId=json.loads(exchange.payload)["id"], amount="10.00")

    app = Application(route("shop", "charge").json().ext_call("charge", charge_quickly, system="BILLING"))
    reading = FakeSoapService(WSDL, latency=3).answer("charge", {"invoiceId": "INV-2"})  # within httpx's default 5 s
    kit = await route_test_kit(app, external_systems={"BILLING": reading})
    sent = await kit.send("shop", "charge", {"id": "C-2"})
    await kit.settle()
    failed = kit.assert_state(sent.message_id, S.PARTLY_FAILED)
    assert failed.last_error_code == "TIMEOUT" and "ReadTimeout" in (failed.last_error_text or "")
    assert reading.calls == 1 and reading.requests[0].operation == "charge"


# -- bad input ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("options", "reason"), [
    ({"config": "[external_systems.X"}, "config is not valid TOML"),
    ({"config": "[engine]\nconcurrency = 2\n"}, r"only the \[external_systems\] tables are read, got \['engine'\]"),
    ({"config": "[external_systems]\nX = 1\n"}, "each external system is a table"),
    ({"config": "[external_systems.X]\ncall_timeout = \"soon\"\n"}, "external_systems.X: .*call_timeout"),
    ({"config": "[external_systems.X]\nspeed = 1\n"}, "external_systems.X: .*speed"),
    ({"config": "[external_systems.X.breaker]\nwindow_size = 0\n"}, "external_systems.X: .*window_size"),
    ({"external_systems": {"X": "http://x/"}}, r"external_systems\['X'\] must be a fake"),
    ({"external_systems": {"X": ExternalSystem("Y")}}, "external system X is given twice .*under another name: Y"),
    ({"external_systems": {"X": ExternalSystem("X")}, "config": "[external_systems.X]\n"}, "given twice"),
])
def test_bad_external_systems_are_configuration_errors(options: dict[str, Any], reason: str) -> None:
    with pytest.raises(ConfigurationError, match=reason):
        RouteTestKit(PAY, **options)


def test_bad_fake_programs_are_value_errors() -> None:
    fake = FakeHttpService()
    for call, reason in [
        (lambda: fake.fail(0), "times must be an integer >= 1"),
        (lambda: fake.fail(status=200), "status must be an HTTP error status"),
        (lambda: fake.fail(error="slow"), "error must be 'timeout' or 'connect'"),  # type: ignore[arg-type]
        (lambda: fake.on("POST", "charges", {}), "path must start with '/'"),
        (lambda: fake.on("", "/charges", {}), "method must be an HTTP method"),
        (lambda: FakeHttpService(status=42), "status must be an HTTP status"),
        (lambda: FakeHttpService(latency=-1), "latency must be a number of seconds >= 0"),
        (lambda: FakeSoapService(WSDL).answer("refund", {}), r"Billing has no operation 'refund'; it has \['charge'\]"),
        (lambda: FakeSoapService(WSDL).fault("s:Server"), "a fault code must be a non-empty local name"),
    ]:
        with pytest.raises(ValueError, match=reason):
            call()
    with pytest.raises(ConfigurationError, match=r"transport must be an httpx\.AsyncBaseTransport"):
        ExternalSystem("X", transport="fake")  # type: ignore[arg-type]
