"""SOAP (zeep) and HTTP JSON confirmation against a real local receiver."""

from __future__ import annotations

import logging
from datetime import UTC, datetime

import pytest
from lxml import etree
from openroute.confirmation import (
    BusinessErrorInfo,
    ConfirmationRequest,
    ConfirmationSendError,
    DefaultConfirmationCallback,
    DelegateConfirmationCallback,
    HttpJsonConfirmation,
    InvalidConfirmationError,
    SoapConfirmation,
)
from openroute.confirmation.transports import DEFAULT_WSDL

from tests.confirmation.receiver import PARSER, Receiver, parse_confirm

FINISHED = datetime(2024, 5, 17, 10, 30, tzinfo=UTC)


def request(message_id: int = 7, state: str = "FAILED", **extra: object) -> ConfirmationRequest:
    values: dict[str, object] = dict(
        message_id=message_id,
        correlation_id=f"corr-{message_id}",
        source_system="CRM",
        state=state,
        process_id="proc-1",
        service="customer",
        operation="create",
        business_errors=(BusinessErrorInfo("E1", "unknown customer"), BusinessErrorInfo("E2", "no address")),
        error_code="E_BUSINESS",
        error_text="business error",
        finished_at=FINISHED,
    )
    values.update(extra)
    return ConfirmationRequest(**values)  # type: ignore[arg-type]


async def test_soap_confirmation_sends_every_field(receiver: Receiver) -> None:
    soap = SoapConfirmation("CRM", receiver.url + "/soap", timeout=5)
    try:
        await soap.confirm(request())
    finally:
        await soap.aclose()
    [got] = receiver.snapshot()
    assert got["correlationId"] == "corr-7"
    assert got["messageId"] == 7
    assert got["sourceSystem"] == "CRM"
    assert got["processId"] == "proc-1"
    assert (got["service"], got["operation"]) == ("customer", "create")
    assert got["state"] == "FAILED"
    assert datetime.fromisoformat(str(got["finishedAt"])) == FINISHED
    assert got["businessErrors"] == [{"code": "E1", "text": "unknown customer"}, {"code": "E2", "text": "no address"}]
    assert (got["errorCode"], got["errorText"]) == ("E_BUSINESS", "business error")


@pytest.mark.parametrize("state", ["OK", "CANCEL"])
async def test_soap_confirmation_optional_fields_may_be_absent(receiver: Receiver, state: str) -> None:
    soap = SoapConfirmation("CRM", receiver.url + "/soap")
    try:
        await soap.confirm(ConfirmationRequest(message_id=1, correlation_id="c", source_system="CRM", state=state))
    finally:
        await soap.aclose()
    [got] = receiver.snapshot()
    assert got["state"] == state
    assert got["processId"] is None and got["errorCode"] is None
    assert got["businessErrors"] == []


@pytest.mark.parametrize(
    ("failure", "expected"),
    [
        ("fault", "SOAP Fault"),
        ("http500", "HTTP 500"),
        ("refuse", "refused by CRM: not yet (attempt 1)"),
    ],
)
async def test_soap_failure_is_a_send_error_with_reason(receiver: Receiver, failure: str, expected: str) -> None:
    receiver.reset(fail_first=1, failure=failure)
    soap = SoapConfirmation("CRM", receiver.url + "/soap")
    try:
        with pytest.raises(ConfirmationSendError) as caught:
            await soap.confirm(request())
        assert expected in caught.value.reason
        if failure == "fault":
            assert "receiver is down (attempt 1)" in caught.value.reason
        assert receiver.snapshot() == []
        await soap.confirm(request())  # the second request is accepted
    finally:
        await soap.aclose()
    assert len(receiver.snapshot()) == 1


async def test_soap_timeout_is_a_send_error(receiver: Receiver) -> None:
    receiver.reset(fail_first=1, failure="hang")
    receiver.hang_seconds = 1.5
    soap = SoapConfirmation("CRM", receiver.url + "/soap", timeout=0.2)
    try:
        with pytest.raises(ConfirmationSendError, match="timeout"):
            await soap.confirm(request())
    finally:
        await soap.aclose()


async def test_soap_connection_refused_is_a_send_error() -> None:
    import socket

    with socket.socket() as sock:  # a port nobody listens on once closed
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    soap = SoapConfirmation("CRM", f"http://127.0.0.1:{port}/soap", timeout=2)
    try:
        with pytest.raises(ConfirmationSendError, match="cannot call"):
            await soap.confirm(request())
    finally:
        await soap.aclose()


async def test_soap_not_xml_answer_is_a_send_error(receiver: Receiver) -> None:
    soap = SoapConfirmation("CRM", receiver.url + "/json")  # the JSON endpoint answers JSON, not SOAP
    try:
        with pytest.raises(ConfirmationSendError):
            await soap.confirm(request())
    finally:
        await soap.aclose()


async def test_http_json_confirmation(receiver: Receiver) -> None:
    http = HttpJsonConfirmation("CRM", receiver.url + "/json", headers={"X-Api-Key": "secret"})
    try:
        await http.confirm(request())
    finally:
        await http.aclose()
    [got] = receiver.snapshot()
    assert got["_headers"]["x-api-key"] == "secret"  # type: ignore[index]
    assert got["messageId"] == 7 and got["state"] == "FAILED"
    assert got["businessErrors"] == [{"code": "E1", "text": "unknown customer"}, {"code": "E2", "text": "no address"}]
    assert datetime.fromisoformat(str(got["finishedAt"])) == FINISHED


async def test_http_json_non_2xx_is_a_send_error(receiver: Receiver) -> None:
    receiver.reset(fail_first=1)
    http = HttpJsonConfirmation("CRM", receiver.url + "/json")
    try:
        with pytest.raises(ConfirmationSendError, match="HTTP 503") as caught:
            await http.confirm(request())
        assert caught.value.status_code == 503
    finally:
        await http.aclose()
    assert receiver.snapshot() == []


@pytest.mark.parametrize("cls", [SoapConfirmation, HttpJsonConfirmation])
@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"source_system": "", "url": "http://x/"}, "source_system"),
        ({"source_system": "CRM", "url": "ftp://x/"}, "http"),
        ({"source_system": "CRM", "url": "not a url"}, "http"),
        ({"source_system": "CRM", "url": "http://x/", "timeout": 0}, "timeout"),
        ({"source_system": "CRM", "url": "http://x/", "connect_timeout": -1}, "connect_timeout"),
    ],
)
def test_bad_transport_configuration(cls: type, kwargs: dict[str, object], match: str) -> None:
    args = dict(kwargs)
    url = args.pop("url")
    with pytest.raises(InvalidConfirmationError, match=match):
        cls(args.pop("source_system"), url, **args)


def test_wsdl_and_xsd_are_shipped_and_valid() -> None:
    assert DEFAULT_WSDL.is_file() and DEFAULT_WSDL.with_suffix(".xsd").is_file()
    schema = etree.XMLSchema(etree.parse(str(DEFAULT_WSDL.with_suffix(".xsd")), PARSER))
    ns = "urn:openroute:confirmation:v1"
    good = etree.fromstring(
        f'<confirmRequest xmlns="{ns}"><correlationId>c</correlationId><messageId>1</messageId>'
        "<sourceSystem>CRM</sourceSystem><state>CANCEL</state></confirmRequest>"
    )
    assert schema.validate(good)
    bad = etree.fromstring(
        f'<confirmRequest xmlns="{ns}"><correlationId>c</correlationId><messageId>1</messageId>'
        "<sourceSystem>CRM</sourceSystem><state>SKIPPED</state></confirmRequest>"
    )
    assert not schema.validate(bad)


def test_receiver_parser_refuses_entities() -> None:
    # the test peer itself must not expand entities (what a secure receiver does)
    body = (
        b'<?xml version="1.0"?><!DOCTYPE x [<!ENTITY e "EXPANDED">]>'
        b'<s:Envelope xmlns:s="http://schemas.xmlsoap.org/soap/envelope/"><s:Body>'
        b'<c:confirmRequest xmlns:c="urn:openroute:confirmation:v1"><c:correlationId>&e;</c:correlationId>'
        b"</c:confirmRequest></s:Body></s:Envelope>"
    )
    assert parse_confirm(body)["correlationId"] != "EXPANDED"


async def test_default_callback_logs(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG, logger="openroute.confirmation"):
        await DefaultConfirmationCallback().confirm(request())
    assert "message 7 (correlation corr-7) from CRM ended FAILED" in caplog.text
    assert "business errors [E1,E2]" in caplog.text
    assert [r.levelno for r in caplog.records] == [logging.DEBUG]


async def test_default_callback_logs_at_debug_unless_given_a_level_and_keeps_no_rows(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.INFO, logger="openroute.confirmation"):
        await DefaultConfirmationCallback().confirm(request())  # the transition log's line of the outcome says it
        assert caplog.records == []
        await DefaultConfirmationCallback(level=logging.INFO).confirm(request())
    assert [r.levelno for r in caplog.records] == [logging.INFO]
    assert DefaultConfirmationCallback().durable is False
    assert DelegateConfirmationCallback().durable is True


async def test_delegate_picks_the_system_confirmation(receiver: Receiver) -> None:
    crm = HttpJsonConfirmation("CRM", receiver.url + "/json")
    erp = SoapConfirmation("ERP", receiver.url + "/soap")
    delegate = DelegateConfirmationCallback([crm, erp])
    try:
        assert delegate.confirmed_systems() == {"CRM", "ERP"}
        assert delegate.confirms("ERP") and not delegate.confirms("BILLING")
        await delegate.confirm(request(1, source_system="ERP"))
        await delegate.confirm(request(2, source_system="CRM"))
        await delegate.confirm(request(3, source_system="BILLING"))  # not registered: not confirmed
    finally:
        await delegate.aclose()
    got = receiver.snapshot()
    assert [(g["messageId"], g["sourceSystem"]) for g in got] == [(1, "ERP"), (2, "CRM")]
    assert "_headers" in got[1] and "_headers" not in got[0]  # CRM went over JSON, ERP over SOAP


def test_delegate_rejects_duplicates_and_wrong_types() -> None:
    delegate = DelegateConfirmationCallback([HttpJsonConfirmation("CRM", "http://127.0.0.1:1/")])
    with pytest.raises(InvalidConfirmationError, match="already has"):
        delegate.register(HttpJsonConfirmation("CRM", "http://127.0.0.1:2/"))
    with pytest.raises(InvalidConfirmationError, match="ExternalSystemConfirmation"):
        delegate.register(DefaultConfirmationCallback())  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"state": "SKIPPED"}, "state"),
        ({"state": "ok"}, "state"),
        ({"message_id": None}, "message_id"),
        ({"message_id": ""}, "message_id"),
        ({"message_id": True}, "message_id"),
        ({"message_id": "7"}, "message_id"),  # an integer, as in the accept answer
        ({"correlation_id": ""}, "correlation_id"),
        ({"source_system": None}, "source_system"),
        ({"business_errors": ("E1",)}, "BusinessErrorInfo"),
        ({"business_errors": "E1"}, "business_errors"),
        ({"finished_at": datetime(2024, 1, 1)}, "aware"),
    ],
)
def test_bad_request_is_rejected(changes: dict[str, object], match: str) -> None:
    with pytest.raises(InvalidConfirmationError, match=match):
        request(**changes)


def test_bad_business_error_is_rejected() -> None:
    with pytest.raises(InvalidConfirmationError, match="code"):
        BusinessErrorInfo("")
    with pytest.raises(InvalidConfirmationError, match="text"):
        BusinessErrorInfo("E1", None)  # type: ignore[arg-type]


def test_business_errors_list_becomes_tuple() -> None:
    r = request(business_errors=[BusinessErrorInfo("E9")])
    assert r.business_errors == (BusinessErrorInfo("E9", ""),)


def test_request_is_keyword_only() -> None:
    with pytest.raises(TypeError):
        ConfirmationRequest(1, "c", "CRM", "OK")  # type: ignore[misc]


async def test_configured_http_confirmations_send_on_openroutes_network_transport(receiver: Receiver) -> None:
    """The composition root gives the JSON and SOAP confirmations the network transport of ``ExternalHttpClient``
    (its pool looks at idle connections for less); they send as before."""
    from openroute.config.sections import ConfirmationsConfig
    from openroute.outbound._connections import KeptSocketBackend

    callback = ConfirmationsConfig.model_validate(
        {"systems": {"CRM": {"http": receiver.url + "/json"}, "ERP": {"soap": receiver.url + "/soap"}}}).callback()
    assert isinstance(callback, DelegateConfirmationCallback)
    try:
        for confirmation in callback._by_system.values():
            assert isinstance(confirmation, HttpJsonConfirmation | SoapConfirmation)
            pool = confirmation._client._transport._pool  # type: ignore[attr-defined]
            assert isinstance(pool._network_backend, KeptSocketBackend)
        await callback.confirm(request(1, source_system="CRM"))
        await callback.confirm(request(2, source_system="ERP"))
    finally:
        await callback.aclose()
    assert [(g["messageId"], g["sourceSystem"]) for g in receiver.snapshot()] == [(1, "CRM"), (2, "ERP")]
