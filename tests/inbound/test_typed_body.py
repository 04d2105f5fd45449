"""A typed route through the real endpoints: the step reads the bound model, a body the model refuses is answered
with its field errors (HTTP 400 / SOAP Fault) and nothing is stored; on SQLite and PostgreSQL."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from lxml import etree
from openroute.persistence import message_table
from pydantic import BaseModel, Field

from openroute import Application, Exchange, route
from openroute.definitions.body import Body
from openroute.inbound import INBOUND_NS
from openroute.testing import RouteTestKit

NS = "urn:example:crm"


class Address(BaseModel):
    city: str
    zip: str = Field(pattern=r"^[0-9]{5}$")


class Customer(BaseModel):
    customerId: str
    msisdn: str = Field(pattern=r"^[0-9]{8,15}$")
    addresses: list[Address] = Field(default_factory=list, alias="address")
    vip: bool = False


def application(seen: list[dict[str, Any]]) -> Application:
    def first(exchange: Exchange) -> None:
        customer = exchange.body_as(Customer)
        seen.append({"customer": customer, "payload": exchange.payload, "body": id(exchange.body)})

    def second(exchange: Exchange) -> None:
        seen[-1]["same"] = id(exchange.body) == seen[-1]["body"]

    return Application(
        route("crm", "setCustomer").soap(f"{{{NS}}}setCustomer").json().body(Customer).object_id(
            lambda payload: payload.json["customerId"] if payload.json is not None
            else payload.xml.findtext(f"{{{NS}}}customerId") if payload.xml is not None else None
        ).process(first).process(second)
    )


def rows(kit: RouteTestKit) -> int:
    with kit.store.engine.connect() as connection:
        return int(connection.execute(sa.select(sa.func.count()).select_from(message_table)).scalar_one())


async def test_the_steps_read_the_bound_model_once_per_attempt_and_the_raw_payload_stays(
        route_test_kit: Any, database_url: str) -> None:
    seen: list[dict[str, Any]] = []
    kit = await route_test_kit(application(seen), database_url=database_url)
    sent = await kit.send_json("crm", "setCustomer", {"customerId": "C-1", "msisdn": "491701234567",
                                                      "address": [{"city": "Bonn", "zip": "53111"}]})
    assert sent.status_code == 202, sent.body
    soap = await kit.send_soap("crm", f'<c:setCustomer xmlns:c="{NS}"><c:customerId>C-2</c:customerId>'
                                      "<c:msisdn>491709999999</c:msisdn><c:vip>true</c:vip>"
                                      "<c:address><c:city>Köln</c:city><c:zip>50667</c:zip></c:address>"
                                      "</c:setCustomer>")
    assert soap.status_code == 200, soap.body
    await kit.settle()
    kit.assert_state(sent.message_id, "OK")
    kit.assert_state(soap.message_id, "OK")
    by_id = {entry["customer"].customerId: entry for entry in seen}
    assert by_id["C-1"]["customer"] == Customer(customerId="C-1", msisdn="491701234567",
                                                address=[Address(city="Bonn", zip="53111")])
    assert by_id["C-2"]["customer"] == Customer(customerId="C-2", msisdn="491709999999", vip=True,
                                                address=[Address(city="Köln", zip="50667")])
    assert all(entry["same"] for entry in seen)  # one parse per attempt, shared by its steps
    assert by_id["C-1"]["payload"].startswith("{") and '"C-1"' in by_id["C-1"]["payload"]
    assert by_id["C-2"]["payload"].startswith("<c:setCustomer")
    assert kit.message(soap.message_id).object_id == "C-2"


async def test_a_json_body_the_model_refuses_is_answered_400_with_field_errors_and_not_stored(
        route_test_kit: Any, database_url: str) -> None:
    kit = await route_test_kit(application([]), database_url=database_url)
    response = await kit.client.post(
        "/api/crm/setCustomer", json={"customerId": "C-1", "msisdn": "12", "address": [{"city": "Bonn"}]},
        headers={"X-Source-System": "test"})
    assert response.status_code == 400
    answer = response.json()
    assert answer["error"] == "INVALID_BODY"
    assert {(f["field"], f["type"]) for f in answer["fields"]} == {("msisdn", "string_pattern_mismatch"),
                                                                  ("address.0.zip", "missing")}
    assert "Customer" in answer["reason"]
    assert rows(kit) == 0


async def test_a_soap_body_the_model_refuses_is_a_fault_with_field_errors_in_its_detail_and_not_stored(
        route_test_kit: Any, database_url: str) -> None:
    kit = await route_test_kit(application([]), database_url=database_url)
    refused = await kit.send_soap("crm", f'<c:setCustomer xmlns:c="{NS}"><c:msisdn>4917012345</c:msisdn>'
                                         "<c:vip>maybe</c:vip></c:setCustomer>")
    assert refused.status_code == 500 and refused.error_code == "INVALID_BODY"  # SOAP 1.1: a Client fault is 500
    fault = etree.fromstring(refused.body.encode())
    assert fault.findtext(".//faultcode") == "env:Client"
    fields = {(f.findtext(f"{{{INBOUND_NS}}}name"), f.findtext(f"{{{INBOUND_NS}}}type"))
              for f in fault.iter(f"{{{INBOUND_NS}}}field")}
    assert fields == {("customerId", "missing"), ("vip", "bool_parsing")}
    assert rows(kit) == 0


async def test_the_endpoints_bind_the_document_they_parsed_and_accept_does_not_parse_it_again(
        route_test_kit: Any, monkeypatch: Any) -> None:
    kit = await route_test_kit(application([]))

    def parse_again(*_args: Any) -> None:
        raise AssertionError("the text was parsed a second time at accept")

    monkeypatch.setattr(Body, "parse", parse_again)
    sent = await kit.client.post("/api/crm/setCustomer", json={"customerId": "C-1", "msisdn": "491701234567"},
                                 headers={"X-Source-System": "test"})
    assert sent.status_code == 202, sent.text
    soap = await kit.send_soap("crm", f'<c:setCustomer xmlns:c="{NS}"><c:customerId>C-2</c:customerId>'
                                      "<c:msisdn>491709999999</c:msisdn></c:setCustomer>")
    assert soap.status_code == 200, soap.body
    assert rows(kit) == 2
