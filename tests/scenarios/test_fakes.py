"""The fake billing / MNO systems of the reference application, reached as the routes reach real ones."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from openroute_reference import WSDL, ReferenceApplication, registry
from openroute_reference.fakes import FakeSoapSystem, fake_billing, fake_mno

from openroute.definitions.errors import BusinessError, ConfigurationError, TechnicalError
from openroute.outbound import SoapService
from openroute.outbound.soap import SoapFaultError, SoapTransportError


async def test_a_fake_served_on_a_real_port_answers_soap_service_calls() -> None:
    billing = fake_billing()
    async with billing.served() as url:
        assert url.startswith("http://127.0.0.1:")
        async with SoapService(WSDL / "billing.wsdl", address=url) as service:
            first = await service.call("createAccount", customerId="C-1", tariff="basic")
            billing.fail_next(1)
            with pytest.raises(SoapTransportError) as transport:
                await service.call("createAccount", customerId="C-1", tariff="basic")
            billing.fault_next(1, "AccountLocked")
            with pytest.raises(SoapFaultError) as fault:
                await service.call("createAccount", customerId="C-1", tariff="basic")
            again = await service.call("createAccount", customerId="C-1", tariff="basic")
    assert (str(first), str(again)) == ("BILLING-C-1-1", "BILLING-C-1-4")
    assert isinstance(transport.value, TechnicalError) and transport.value.code == "HTTP_503"
    assert isinstance(fault.value, BusinessError) and fault.value.code == "AccountLocked"
    assert billing.calls["C-1"] == 4 and billing.total_calls == 4
    with pytest.raises(httpx.TransportError):  # stopped with the block
        async with httpx.AsyncClient() as client:
            await client.post(url, content=b"<x/>")


async def test_the_mno_in_process_and_its_blocked_customers() -> None:
    mno = fake_mno()
    async with SoapService(WSDL / "mno.wsdl", address="http://mno.fake/", http_client=mno.client()) as service:
        assert str(await service.call("activateSim", customerId="C-2", msisdn="420777000000")) == "MNO-C-2-1"
        with pytest.raises(SoapFaultError, match="customer blocked-1 is blocked in mno") as fault:
            await service.call("activateSim", customerId="blocked-1", msisdn="420777000000")
    assert fault.value.code == "Client"
    assert mno.status() == {"name": "mno", "calls": {"C-2": 1, "blocked-1": 1}, "total": 2, "effects": {"C-2": 1},
                            "repeats": 0, "failures_left": 0, "faults_left": 0}
    mno.fail_next(3)
    mno.reset()
    assert mno.status()["total"] == 0 and mno.failures_left == 0


@pytest.mark.parametrize("count", [-1, 1.5, True, "2", None])
def test_a_bad_failure_count_is_refused(count: object) -> None:
    fake = fake_billing()
    with pytest.raises(ValueError, match="integer >= 0"):
        fake.fail_next(count)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="integer >= 0"):
        fake.fault_next(count)  # type: ignore[arg-type]
    assert (fake.failures_left, fake.faults_left) == (0, 0)


@pytest.mark.parametrize("code", ["", "  ", "s:Server", 7])
def test_a_bad_fault_code_is_refused(code: object) -> None:
    with pytest.raises(ValueError, match="fault code"):
        fake_mno().fault_next(1, code)  # type: ignore[arg-type]


async def test_control_endpoints_and_bad_requests() -> None:
    fake = fake_billing()
    async with fake.client() as client:
        programmed = await client.post("http://billing.fake/fail", params={"count": "2", "kind": "fault"})
        assert programmed.status_code == 200 and programmed.json()["faults_left"] == 2
        assert (await client.post("http://billing.fake/fail", params={"count": "1"})).json()["failures_left"] == 1
        for params in ({"count": "x"}, {"count": "-1"}, {"kind": "smoke"}, {"kind": "fault", "code": ""}):
            refused = await client.post("http://billing.fake/fail", params=params)
            assert refused.status_code == 400 and refused.json()["error"], params
        for body in (b"not xml", b'<s:Envelope xmlns:s="http://schemas.xmlsoap.org/soap/envelope/"><s:Body/>'
                                b"</s:Envelope>", b"<a>" + b"x" * (1 << 20) + b"</a>",
                     b'<!DOCTYPE a [<!ENTITY e SYSTEM "file:///etc/passwd">]><a>&e;</a>'):
            answer = await client.post("http://billing.fake/", content=body)
            assert answer.status_code == 500 and "<faultcode>s:Client</faultcode>" in answer.text
            assert "root:" not in answer.text
        status = (await client.get("http://billing.fake/calls")).json()
    assert status == {"name": "billing", "calls": {}, "total": 0, "effects": {}, "repeats": 0, "failures_left": 1,
                      "faults_left": 2}


def test_reference_registry_mounts_the_fakes_it_uses(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENROUTE_BILLING_URL", raising=False)
    monkeypatch.setenv("OPENROUTE_MNO_URL", "http://mno.example:8080/ws")
    application = registry()
    assert isinstance(application, ReferenceApplication)
    assert [path for path, _app in application.mounts] == ["/fakes/billing"]
    assert len(application.notes) == 1 and "OPENROUTE_BILLING_URL is not set" in application.notes[0]
    assert application.systems.mno_fake is None and isinstance(application.systems.billing_fake, FakeSoapSystem)
    assert len(application.routes) == 5


def test_a_wsdl_that_is_not_there_is_a_configuration_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("OPENROUTE_BILLING_WSDL", str(tmp_path / "missing.wsdl"))
    with pytest.raises(ConfigurationError, match=r"missing\.wsdl"):
        registry()


async def test_a_fake_drops_a_repeat_of_an_idempotency_key_and_answers_as_the_first_time() -> None:
    billing = fake_billing()
    async with SoapService(WSDL / "billing.wsdl", address="http://billing.fake/", http_client=billing.client()) as svc:
        first = await svc.call("createAccount", customerId="C-7", tariff="basic", _idempotency_key="k-1")
        billing.fail_next(1)  # a failed call acts on nothing: the same key is still new afterwards
        with pytest.raises(SoapTransportError):
            await svc.call("createAccount", customerId="C-7", tariff="basic", _idempotency_key="k-2")
        repeat = await svc.call("createAccount", customerId="C-7", tariff="basic", _idempotency_key="k-1")
        second = await svc.call("createAccount", customerId="C-7", tariff="basic", _idempotency_key="k-2")
        unkeyed = await svc.call("createAccount", customerId="C-7", tariff="basic")
    assert str(repeat) == str(first) == "BILLING-C-7-1" and str(second) == "BILLING-C-7-4"
    assert str(unkeyed) == "BILLING-C-7-5"
    assert (billing.calls["C-7"], billing.effects["C-7"], billing.repeats) == (5, 3, 1)


async def test_soap_service_sends_the_key_of_the_running_call_on_its_own() -> None:
    from openroute.engine.idempotency import using_idempotency_key

    mno = fake_mno()
    async with SoapService(WSDL / "mno.wsdl", address="http://mno.fake/", http_client=mno.client()) as service:
        with using_idempotency_key("6f1c2a9e-0000-5000-8000-000000000001"):
            first = await service.call("activateSim", customerId="C-5", msisdn="420777000000")
            again = await service.call("activateSim", customerId="C-5", msisdn="420777000000")
        with pytest.raises(ConfigurationError, match="_soapheaders must be a list"):
            await service.call("activateSim", customerId="C-5", msisdn="420777000000", _idempotency_key="k",
                               _soapheaders={"x": 1})
    assert str(first) == str(again) and (mno.calls["C-5"], mno.effects["C-5"], mno.repeats) == (2, 1, 1)
