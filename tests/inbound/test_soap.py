"""SOAP 1.1 / 1.2 endpoints and WSDL against a real engine (SQLite and PostgreSQL)."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
import zeep
from lxml import etree
from openroute.persistence import MessageStore

from tests.inbound.conftest import (
    ORD,
    SOAP11,
    SOAP11_HEADERS,
    SOAP12,
    SOAP12_HEADERS,
    basic,
    create_order,
    envelope,
    stored,
)

IB = "urn:openroute:inbound:v1"
TR = "urn:openroute:trace:v1"


def answer(response: httpx.Response) -> dict[str, str]:
    root = etree.fromstring(response.content)
    found = {etree.QName(e).localname: e.text or "" for e in root.iter() if isinstance(e.tag, str) and len(e) == 0}
    return found


async def test_soap11_request_is_stored_then_acknowledged(client: httpx.AsyncClient, store: MessageStore) -> None:
    trace = {"correlationId": "corr-1", "processId": "proc-9", "timestamp": "2024-03-01T10:00:00+01:00"}
    response = await client.post("/soap/orders", content=envelope(create_order(), trace=trace),
                                 headers={**SOAP11_HEADERS, **basic()})
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/xml")
    fields = answer(response)
    assert fields["status"] == "ACCEPTED" and fields["state"] == "NEW" and fields["correlationId"] == "corr-1"
    rows = stored(store)
    assert len(rows) == 1
    row = rows[0]
    assert str(row["id"]) == fields["messageId"] == response.headers["x-message-id"]
    assert (row["service"], row["operation"], row["source_system"]) == ("orders", "create", "CRM")
    assert (row["object_id"], row["entity_type"], row["funnel_value"]) == ("O-1", "order", "C-7")
    assert row["process_id"] == "proc-9" and row["msg_ts"].isoformat().startswith("2024-03-01T09:00:00")
    assert row["content_type"] == "application/xml" and row["state"] == "NEW"
    payload = etree.fromstring(row["payload"].encode())
    assert etree.QName(payload).text == f"{{{ORD}}}createOrder"  # the body element, not the envelope
    assert payload.findtext(f"{{{ORD}}}orderId") == "O-1"
    assert row["headers"]["soapVersion"] == "1.1"


async def test_soap12_request_uses_soap12_envelope(client: httpx.AsyncClient, store: MessageStore) -> None:
    response = await client.post("/soap/orders", content=envelope(create_order(), "1.2", {"correlationId": "c12"}),
                                 headers={**SOAP12_HEADERS, **basic()})
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("application/soap+xml")
    assert etree.QName(etree.fromstring(response.content)).namespace == SOAP12
    assert stored(store)[0]["headers"]["soapVersion"] == "1.2"


async def test_missing_correlation_id_is_generated_and_returned(client: httpx.AsyncClient, store: MessageStore) -> None:
    headers = {**SOAP11_HEADERS, **basic()}
    response = await client.post("/soap/orders", content=envelope(create_order()), headers=headers)
    assert response.status_code == 200
    generated = answer(response)["correlationId"]
    assert generated and response.headers["x-correlation-id"] == generated
    root = etree.fromstring(response.content)
    assert root.findtext(f"{{{SOAP11}}}Header/{{{TR}}}traceHeader/{{{TR}}}correlationId") == generated
    assert stored(store)[0]["correlation_id"] == generated


async def test_duplicate_is_answered_as_duplicate_and_stored_once(
    client: httpx.AsyncClient, store: MessageStore
) -> None:
    body = envelope(create_order(), trace={"correlationId": "same"})
    first = await client.post("/soap/orders", content=body, headers={**SOAP11_HEADERS, **basic()})
    second = await client.post("/soap/orders", content=body, headers={**SOAP11_HEADERS, **basic()})
    assert answer(first)["status"] == "ACCEPTED"
    assert answer(second)["status"] == "DUPLICATE" and answer(second)["messageId"] == answer(first)["messageId"]
    assert len(stored(store)) == 1


async def test_dispatch_by_body_element(client: httpx.AsyncClient, store: MessageStore) -> None:
    body = envelope(f'<o:cancelOrder xmlns:o="{ORD}"><o:orderId>O-5</o:orderId></o:cancelOrder>')
    response = await client.post("/soap/orders", content=body,
                                 headers={"Content-Type": "text/xml", **basic()})
    assert response.status_code == 200, response.text
    row = stored(store)[0]
    assert (row["operation"], row["object_id"], row["entity_type"]) == ("cancel", "O-5", "cancel")


async def test_validation_error_is_a_client_fault_and_nothing_is_stored(
    client: httpx.AsyncClient, store: MessageStore
) -> None:
    body = envelope(f'<o:createOrder xmlns:o="{ORD}"><o:orderId>O-1</o:orderId></o:createOrder>')
    response = await client.post("/soap/orders", content=body, headers={**SOAP11_HEADERS, **basic()})
    assert response.status_code == 500  # SOAP 1.1 HTTP binding: every fault is a 500
    fields = answer(response)
    assert fields["faultcode"] == "env:Client" and fields["code"] == "VALIDATION_ERROR"
    assert "o:customer/o:id" in fields["faultstring"]
    negative = await client.post("/soap/orders", content=envelope(create_order(quantity=-1), "1.2"),
                                 headers={**SOAP12_HEADERS, **basic()})
    assert negative.status_code == 400  # SOAP 1.2: a Sender fault is a 400
    assert answer(negative)["Value"] == "env:Sender" and "quantity must not be negative" in answer(negative)["Text"]
    assert stored(store) == []


async def test_unknown_operation_and_service_are_faults(client: httpx.AsyncClient, store: MessageStore) -> None:
    unknown = envelope('<x:deleteAll xmlns:x="urn:other"/>')
    response = await client.post("/soap/orders", content=unknown, headers={"Content-Type": "text/xml", **basic()})
    assert answer(response)["code"] == "UNKNOWN_OPERATION" and "{urn:other}deleteAll" in answer(response)["reason"]
    response = await client.post("/soap/nothing", content=envelope(create_order()),
                                 headers={**SOAP11_HEADERS, **basic()})
    assert response.status_code == 500 and answer(response)["code"] == "UNKNOWN_OPERATION"
    assert stored(store) == []


async def test_soap_action_must_match_body(client: httpx.AsyncClient, store: MessageStore) -> None:
    response = await client.post("/soap/orders", content=envelope(create_order()),
                                 headers={"Content-Type": "text/xml", "SOAPAction": "urn:wrong", **basic()})
    assert answer(response)["code"] == "VALIDATION_ERROR" and "SOAPAction" in answer(response)["reason"]
    assert stored(store) == []


async def test_version_mismatch_and_envelope_shape(client: httpx.AsyncClient, store: MessageStore) -> None:
    response = await client.post("/soap/orders", content=envelope(create_order(), "1.2"),
                                 headers={**SOAP11_HEADERS, **basic()})
    assert answer(response)["faultcode"] == "env:VersionMismatch"
    no_body = f'<env:Envelope xmlns:env="{SOAP11}"><env:Header/></env:Envelope>'.encode()
    response = await client.post("/soap/orders", content=no_body, headers={**SOAP11_HEADERS, **basic()})
    assert answer(response)["code"] == "MALFORMED_PAYLOAD" and "no Body" in answer(response)["reason"]
    two = envelope(create_order() + create_order("O-2"))
    response = await client.post("/soap/orders", content=two, headers={**SOAP11_HEADERS, **basic()})
    assert "exactly one element" in answer(response)["reason"]
    not_soap = create_order().encode()
    response = await client.post("/soap/orders", content=not_soap, headers={**SOAP11_HEADERS, **basic()})
    assert "not a SOAP envelope" in answer(response)["reason"]
    assert stored(store) == []


async def test_trace_header_source_system_must_be_the_authenticated_one(
    client: httpx.AsyncClient, store: MessageStore
) -> None:
    body = envelope(create_order(), trace={"sourceSystem": "ERP"})
    response = await client.post("/soap/orders", content=body, headers={**SOAP11_HEADERS, **basic()})
    assert response.status_code == 403 and answer(response)["code"] == "FORBIDDEN"
    same = envelope(create_order(), trace={"sourceSystem": "CRM"})
    assert (await client.post("/soap/orders", content=same, headers={**SOAP11_HEADERS, **basic()})).status_code == 200
    assert [r["source_system"] for r in stored(store)] == ["CRM"]


async def test_invalid_timestamp_is_refused(client: httpx.AsyncClient, store: MessageStore) -> None:
    for stamp, reason in (("yesterday", "ISO 8601"), ("2024-03-01T10:00:00", "time zone")):
        body = envelope(create_order(), trace={"timestamp": stamp})
        response = await client.post("/soap/orders", content=body, headers={**SOAP11_HEADERS, **basic()})
        assert reason in answer(response)["reason"]
    assert stored(store) == []


async def test_wsdl_describes_both_soap_versions(client: httpx.AsyncClient, tmp_path: Path) -> None:
    response = await client.get("/soap/orders?wsdl")
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/xml")
    path = tmp_path / "orders.wsdl"
    path.write_bytes(response.content)
    document = zeep.wsdl.Document(str(path), zeep.Transport())  # self-contained: zeep fetches nothing
    bindings = {b.name.localname: b for b in document.bindings.values()}
    assert set(bindings) == {"ordersSoap11", "ordersSoap12"}
    for binding in bindings.values():
        operations = binding.all()
        assert set(operations) == {"create", "cancel"}
        assert operations["create"].soapaction == "urn:example:orders:create"
    port = document.services["orders"].ports["ordersSoap12Port"]
    assert port.binding_options["address"] == "http://testserver/soap/orders"
    assert (await client.get("/soap/unknown?wsdl")).status_code == 404
    assert (await client.get("/soap/orders")).status_code == 404


# What is stored is the body element alone, as its own document: the namespaces it uses (those declared on the
# envelope move to its root element) and no others, then the text that follows it inside the Body.
STORED = [
    (f'<env:Envelope xmlns:env="{SOAP11}" xmlns:o="{ORD}" xmlns:unused="urn:unused"><env:Body>\n  '
     '<o:cancelOrder xmlns:x="urn:x" ref="1" o:p="2"><o:orderId>O-1 &amp; &lt;</o:orderId><![CDATA[<c>]]>'
     "</o:cancelOrder>\n </env:Body></env:Envelope>",
     f'<o:cancelOrder xmlns:o="{ORD}" ref="1" o:p="2"><o:orderId>O-1 &amp; &lt;</o:orderId>&lt;c&gt;'
     "</o:cancelOrder>\n "),
    (f'<Envelope xmlns="{SOAP11}"><Body><cancelOrder xmlns="{ORD}"><orderId>O-1</orderId></cancelOrder></Body>'
     "</Envelope>",
     f'<cancelOrder xmlns="{ORD}"><orderId>O-1</orderId></cancelOrder>'),
    (f'<env:Envelope xmlns:env="{SOAP11}"><env:Body><o:cancelOrder xmlns:o="{ORD}"><!-- note --><?pi x?>'
     '<o:orderId xml:lang="cs">O-1 Ž €</o:orderId><env:note>n</env:note></o:cancelOrder></env:Body></env:Envelope>',
     f'<o:cancelOrder xmlns:o="{ORD}" xmlns:env="{SOAP11}"><o:orderId xml:lang="cs">O-1 Ž €</o:orderId>'
     "<env:note>n</env:note></o:cancelOrder>"),
]


@pytest.mark.parametrize(("sent", "payload"), STORED, ids=["envelope-prefix-and-tail", "default-namespace",
                                                           "comments-and-envelope-namespace-inside"])
async def test_the_stored_payload_is_the_body_element_with_the_namespaces_it_uses(
    client: httpx.AsyncClient, store: MessageStore, sent: str, payload: str
) -> None:
    response = await client.post("/soap/orders", content=sent.encode(), headers={"Content-Type": "text/xml",
                                                                                 **basic()})
    assert response.status_code == 200, response.text
    row = stored(store)[0]
    assert row["payload"] == payload
    assert row["object_id"].startswith("O-1")


async def test_trace_header_fields_are_read_in_any_order_first_one_wins(
    client: httpx.AsyncClient, store: MessageStore
) -> None:
    body = (f'<env:Envelope xmlns:env="{SOAP11}"><env:Body>{create_order()}</env:Body><env:Header>'
            f'<tr:traceHeader xmlns:tr="{TR}"><tr:processId> p-1 </tr:processId><tr:correlationId>first'
            "</tr:correlationId><tr:unknown>u</tr:unknown><tr:correlationId>second</tr:correlationId>"
            "</tr:traceHeader></env:Header></env:Envelope>")
    response = await client.post("/soap/orders", content=body.encode(), headers={**SOAP11_HEADERS, **basic()})
    assert response.status_code == 200, response.text
    row = stored(store)[0]
    assert (row["correlation_id"], row["process_id"]) == ("first", "p-1")


@pytest.mark.parametrize(("sent", "reason"), [
    (f'<env:Envelope xmlns:env="{SOAP11}"><e12:Body xmlns:e12="{SOAP12}">{create_order()}</e12:Body>'
     "</env:Envelope>", "no Body"),
    (f'<env:Envelope xmlns:env="{SOAP11}"><env:Body> text <!-- c --> </env:Body></env:Envelope>',
     "exactly one element, found 0"),
    (f'<env:Envelope xmlns:env="{SOAP11}"><env:Body>{create_order()}</env:Body></env:Envelope>'
     .replace("Envelope", "Envelop"), "not a SOAP envelope"),
    # an Envelope in a namespace that is no SOAP version is a VersionMismatch fault (SOAP 1.1 section 4.4.1):
    # see HOSTILE_XML in test_json_and_hostile.py
], ids=["body-of-the-other-version", "no-element-in-body", "wrong-root-name"])
async def test_a_wrong_envelope_is_a_client_fault(
    client: httpx.AsyncClient, store: MessageStore, sent: str, reason: str
) -> None:
    response = await client.post("/soap/orders", content=sent.encode(), headers={**SOAP11_HEADERS, **basic()})
    assert response.status_code == 500 and answer(response)["faultcode"] == "env:Client"
    assert answer(response)["code"] == "MALFORMED_PAYLOAD" and reason in answer(response)["reason"]
    assert stored(store) == []


#: plain texts, and texts with each thing escaping changes
_ANSWER_TEXTS = ["ABC-123_x.y:z", "id 42/7@host+1=2,3;(4)#$%*!?~", "a<b", "a&b", "x>y", 'q"uote', "t'ick", "é"]


@pytest.mark.parametrize("text", [*_ANSWER_TEXTS, "\x00nul", "tab\t", "line\nbreak", "\ud800", ""])
def test_texts_go_into_answers_escaped_as_escape_writes_them(text: str) -> None:
    """Plain texts (most correlation ids) skip the escaping: the answer's text is the same either way."""
    from xml.sax.saxutils import escape

    from openroute.inbound.soap import _INVALID_XML_CHARS, _text

    assert _text(text) == escape(_INVALID_XML_CHARS.sub("\ufffd", text))
