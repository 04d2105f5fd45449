"""JSON endpoint, authentication and hostile input: each refused clearly, nothing stored, the server keeps serving."""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator

import httpx
import pytest
from openroute.persistence import MessageStore

from openroute.inbound import ApiKey, BasicCredentials
from tests.inbound.conftest import API_KEY, SOAP11_HEADERS, basic, create_order, envelope, stored

ORDER = {"orderId": "O-1", "customer": {"id": "C-7"}, "quantity": 2}
JSON = {"Content-Type": "application/json"}


async def test_json_request_is_stored_then_acknowledged(client: httpx.AsyncClient, store: MessageStore) -> None:
    headers = {**JSON, "X-API-Key": API_KEY, "X-Correlation-Id": "j-1", "X-Process-Id": "p-1",
               "X-Message-Timestamp": "2024-03-01T10:00:00Z"}
    response = await client.post("/api/orders/create", content=json.dumps(ORDER), headers=headers)
    assert response.status_code == 202, response.text
    body = response.json()
    assert body["status"] == "ACCEPTED" and body["correlationId"] == "j-1" and body["state"] == "NEW"
    row = stored(store)[0]
    assert row["id"] == body["messageId"] and row["source_system"] == "ERP" and row["process_id"] == "p-1"
    assert (row["object_id"], row["entity_type"], row["funnel_value"]) == ("O-1", "order", "C-7")
    assert json.loads(row["payload"]) == ORDER and row["content_type"] == "application/json"
    again = await client.post("/api/orders/create", content=json.dumps(ORDER), headers=headers)
    assert again.status_code == 200 and again.json()["status"] == "DUPLICATE"
    assert again.json()["messageId"] == body["messageId"] and len(stored(store)) == 1


async def test_json_missing_correlation_id_is_generated(client: httpx.AsyncClient, store: MessageStore) -> None:
    response = await client.post("/api/orders/create", json=ORDER, headers=basic())
    assert response.status_code == 202
    generated = response.json()["correlationId"]
    assert response.headers["x-correlation-id"] == generated == stored(store)[0]["correlation_id"]


@pytest.mark.parametrize(
    ("body", "status", "code", "reason"),
    [
        ({"customer": {"id": "C"}}, 400, "VALIDATION_ERROR", "$.orderId"),
        ({"orderId": "O", "customer": {}}, 400, "VALIDATION_ERROR", "$.customer.id"),
        ({"orderId": "O", "customer": {"id": "C"}, "quantity": -3}, 400, "VALIDATION_ERROR", "must not be negative"),
        ({"orderId": "O" * 300, "customer": {"id": "C"}}, 400, "VALIDATION_ERROR", "object_id is longer"),
    ],
)
async def test_json_validation_errors(
    client: httpx.AsyncClient, store: MessageStore, body: dict[str, object], status: int, code: str, reason: str
) -> None:
    response = await client.post("/api/orders/create", json=body, headers=basic())
    assert response.status_code == status and response.json()["error"] == code
    assert reason in response.json()["reason"]
    assert stored(store) == []


async def test_unknown_json_operation_is_404(client: httpx.AsyncClient, store: MessageStore) -> None:
    for path in ("/api/orders/delete", "/api/nothing/create", "/api/orders/cancel"):  # cancel has only SOAP
        response = await client.post(path, json=ORDER, headers=basic())
        assert response.status_code == 404 and response.json()["error"] == "UNKNOWN_OPERATION"
    assert stored(store) == []


HOSTILE_JSON = [
    (b'{"orderId": "O-1", ', {}, 400, "MALFORMED_PAYLOAD", "malformed JSON"),
    (b"", {}, 400, "MALFORMED_PAYLOAD", "empty"),
    (b'["orderId"]', {}, 400, "MALFORMED_PAYLOAD", "must be an object"),
    (b'{"orderId": NaN, "customer": {"id": "C"}}', {}, 400, "MALFORMED_PAYLOAD", "NaN"),
    (b'{"orderId": "\xff\xfe"}', {}, 400, "MALFORMED_PAYLOAD", "not UTF-8"),
    (b'{"a":' * 40 + b"1" + b"}" * 40, {}, 400, "NESTING_TOO_DEEP", "32 levels"),
    (b"[" * 100_000 + b"]" * 100_000, {}, 413, "PAYLOAD_TOO_LARGE", "limit of 65536"),
    (b'{"a":' * 20_000 + b"1" + b"}" * 20_000, {}, 413, "PAYLOAD_TOO_LARGE", "limit"),
    (json.dumps(ORDER).encode(), {"Content-Type": "text/plain"}, 415, "UNSUPPORTED_MEDIA_TYPE", "text/plain"),
    (json.dumps(ORDER).encode(), {"Content-Type": "application/json; charset=latin-1"}, 415,
     "UNSUPPORTED_MEDIA_TYPE", "UTF-8"),
    # text no database stores (PostgreSQL refuses NUL and lone surrogates) and numbers Python will not convert
    (b'{"orderId": "O-\\u0000", "customer": {"id": "C"}}', {}, 400, "INVALID_CHARACTER", "NUL"),
    (b'{"orderId": "O-1", "customer": {"id": "C"}, "note": "a\\u0000b"}', {}, 400, "INVALID_CHARACTER", "NUL"),
    (b'{"orderId": "O-1", "customer": {"id": "C"}, "n\\u0000": 1}', {}, 400, "INVALID_CHARACTER", "NUL"),
    (b'{"orderId": "\\ud800", "customer": {"id": "C"}}', {}, 400, "INVALID_CHARACTER", "surrogate"),
    (b'{"orderId": "O-1", "customer": {"id": "C"}, "x": ["\\udfff"]}', {}, 400, "INVALID_CHARACTER", "surrogate"),
    (b'{"orderId": "O-1", "customer": {"id": "C"}, "quantity": ' + b"7" * 5000 + b"}", {}, 400, "NUMBER_TOO_LONG",
     "digits"),
]


@pytest.mark.parametrize(("body", "headers", "status", "code", "reason"), HOSTILE_JSON)
async def test_hostile_json(
    client: httpx.AsyncClient, store: MessageStore, body: bytes, headers: dict[str, str], status: int, code: str,
    reason: str,
) -> None:
    response = await client.post("/api/orders/create", content=body, headers={**JSON, **basic(), **headers})
    assert (response.status_code, response.json()["error"]) == (status, code), response.text
    assert reason in response.json()["reason"]
    assert stored(store) == []
    ok = await client.post("/api/orders/create", json=ORDER, headers=basic())  # still serving
    assert ok.status_code == 202


async def test_deep_json_within_size_limit(client: httpx.AsyncClient, store: MessageStore) -> None:
    body = b'{"x":' + b"[" * 5000 + b"]" * 5000 + b"}"  # past the depth limit, below the size limit
    response = await client.post("/api/orders/create", content=body, headers={**JSON, **basic()})
    assert response.status_code == 400 and response.json()["error"] == "NESTING_TOO_DEEP"
    assert stored(store) == []


XXE = b"""<?xml version="1.0"?><!DOCTYPE foo [<!ENTITY xxe SYSTEM "file:///etc/passwd">]>
<env:Envelope xmlns:env="http://schemas.xmlsoap.org/soap/envelope/"><env:Body>
<o:createOrder xmlns:o="urn:example:orders:v1"><o:orderId>&xxe;</o:orderId><o:customer><o:id>C</o:id></o:customer>
</o:createOrder></env:Body></env:Envelope>"""

LAUGHS = b"""<?xml version="1.0"?><!DOCTYPE lolz [<!ENTITY lol "lol">
<!ENTITY lol2 "&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;">
<!ENTITY lol3 "&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;">
<!ENTITY lol4 "&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;">]>
<env:Envelope xmlns:env="http://schemas.xmlsoap.org/soap/envelope/"><env:Body>
<o:createOrder xmlns:o="urn:example:orders:v1"><o:orderId>&lol4;</o:orderId></o:createOrder>
</env:Body></env:Envelope>"""

EXTERNAL_DTD = b"""<?xml version="1.0"?><!DOCTYPE env:Envelope SYSTEM "http://127.0.0.1:9/evil.dtd">
<env:Envelope xmlns:env="http://schemas.xmlsoap.org/soap/envelope/"><env:Body/></env:Envelope>"""

UTF16_DOCTYPE = ('<?xml version="1.0" encoding="UTF-16"?><!DOCTYPE x [<!ENTITY a "b">]>'
                 + envelope(create_order()).decode().split("?>", 1)[1]).encode("utf-16")


def _deep_xml(levels: int) -> bytes:
    inner = "<o:x>" * levels + "</o:x>" * levels
    return envelope(f'<o:createOrder xmlns:o="urn:example:orders:v1"><o:orderId>O</o:orderId>'
                    f"<o:customer><o:id>C</o:id></o:customer>{inner}</o:createOrder>")


HOSTILE_XML = [
    (XXE, {}, "FORBIDDEN_XML", "DOCTYPE"),
    (LAUGHS, {}, "FORBIDDEN_XML", "DOCTYPE"),
    (EXTERNAL_DTD, {}, "FORBIDDEN_XML", "DOCTYPE"),
    (UTF16_DOCTYPE, {}, "FORBIDDEN_XML", "DOCTYPE"),
    (b"<env:Envelope xmlns:env='http://schemas.xmlsoap.org/soap/envelope/'><env:Body>", {}, "MALFORMED_PAYLOAD",
     "malformed XML"),
    (b"<a>&undefined;</a>", {}, "MALFORMED_PAYLOAD", "malformed XML"),
    (b"", {}, "MALFORMED_PAYLOAD", "empty"),
    (_deep_xml(40), {}, "NESTING_TOO_DEEP", "32 levels"),
    (_deep_xml(300), {}, "NESTING_TOO_DEEP", "32 levels"),  # past libxml2's own limit of 256 levels too
    (b"<env:Envelope xmlns:env='urn:not:soap'><env:Body/></env:Envelope>", {}, "VERSION_MISMATCH", "no SOAP version"),
    (b"<Envelope><Body/></Envelope>", {}, "VERSION_MISMATCH", "no SOAP version"),
    (b"<a>" + b"x" * 70_000 + b"</a>", {}, "PAYLOAD_TOO_LARGE", "65536"),
    (envelope(create_order()), {"Content-Type": "application/json"}, "UNSUPPORTED_MEDIA_TYPE", "not SOAP"),
    (envelope(create_order()), {"Content-Type": "text/xml; charset=ebcdic"}, "UNSUPPORTED_MEDIA_TYPE", "charset"),
]


@pytest.mark.parametrize(("body", "headers", "code", "reason"), HOSTILE_XML)
async def test_hostile_xml(
    client: httpx.AsyncClient, store: MessageStore, body: bytes, headers: dict[str, str], code: str, reason: str
) -> None:
    response = await client.post("/soap/orders", content=body, headers={**SOAP11_HEADERS, **basic(), **headers})
    assert f"<ib:code>{code}</ib:code>" in response.text, response.text
    assert reason in response.text
    assert b"root:" not in response.content  # /etc/passwd never appears
    assert stored(store) == []
    ok = await client.post("/soap/orders", content=envelope(create_order()), headers={**SOAP11_HEADERS, **basic()})
    assert ok.status_code == 200


async def test_xml_nested_exactly_to_the_depth_limit_is_accepted(
    client: httpx.AsyncClient, store: MessageStore
) -> None:
    # Envelope, Body and createOrder are levels 1 to 3: 29 more reach the limit of 32, one more passes it
    headers = {**SOAP11_HEADERS, **basic()}
    assert (await client.post("/soap/orders", content=_deep_xml(29), headers=headers)).status_code == 200
    refused = await client.post("/soap/orders", content=_deep_xml(30), headers=headers)
    assert "<ib:code>NESTING_TOO_DEEP</ib:code>" in refused.text and "32 levels" in refused.text
    assert len(stored(store)) == 1


async def _streamed(size: int) -> AsyncIterator[bytes]:
    chunk = b"x" * 8192
    sent = 0
    while sent < size:
        yield chunk
        sent += len(chunk)


async def test_oversized_body_without_content_length_is_cut_off(
    client: httpx.AsyncClient, store: MessageStore
) -> None:
    # chunked upload: no Content-Length, so the limit must hold while streaming
    response = await client.post("/api/orders/create", content=_streamed(10 * 1024 * 1024),
                                 headers={**JSON, **basic()})
    assert response.status_code == 413 and "limit of 65536" in response.json()["reason"]
    assert stored(store) == []


class _Unreadable:
    """A body whose reading fails the test: authentication must reject before the body is touched."""

    def __aiter__(self) -> _Unreadable:
        return self

    async def __anext__(self) -> bytes:
        raise AssertionError("the body was read before authentication")


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"Authorization": "Basic " + base64.b64encode(b"crm:wrong").decode()},
        {"Authorization": "Basic " + base64.b64encode(b"nobody:crm-secret").decode()},
        {"Authorization": "Basic !!!not-base64"},
        {"X-API-Key": "not-a-configured-key-at-all"},
        {"Authorization": "Bearer something"},
    ],
)
async def test_unauthenticated_requests_are_rejected_before_the_body(
    client: httpx.AsyncClient, store: MessageStore, headers: dict[str, str]
) -> None:
    response = await client.post("/api/orders/create", content=_Unreadable(), headers={**JSON, **headers})
    assert response.status_code == 401 and response.json()["error"] == "UNAUTHENTICATED"
    assert response.headers["www-authenticate"].startswith("Basic")
    assert "crm-secret" not in response.text
    soap = await client.post("/soap/orders", content=_Unreadable(), headers={**SOAP11_HEADERS, **headers})
    assert soap.status_code == 401 and "<ib:code>UNAUTHENTICATED</ib:code>" in soap.text
    assert stored(store) == []


async def test_wrong_source_system_is_rejected_before_the_body(
    client: httpx.AsyncClient, store: MessageStore
) -> None:
    response = await client.post("/api/orders/create", content=_Unreadable(),
                                 headers={**JSON, **basic(), "X-Source-System": "ERP"})
    assert response.status_code == 403 and "cannot send as 'ERP'" in response.json()["reason"]
    assert stored(store) == []


async def test_secrets_are_not_logged(
    client: httpx.AsyncClient, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("DEBUG")
    await client.post("/api/orders/create", json=ORDER, headers=basic("crm", "crm-secret-wrong"))
    await client.post("/api/orders/create", json=ORDER, headers={"X-API-Key": API_KEY})
    await client.post("/api/orders/create", json={"bad": 1}, headers={"X-API-Key": API_KEY})
    assert caplog.records  # the refusals are logged ...
    text = caplog.text
    assert "crm-secret" not in text and API_KEY not in text  # ... without any secret
    assert "crm-secret" not in repr(BasicCredentials("crm", "crm-secret")) and API_KEY not in repr(ApiKey(API_KEY))
