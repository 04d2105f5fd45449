"""openroute/definitions/body.py: a route's typed body, bound from JSON or a SOAP request element, refused before the
store."""

from __future__ import annotations

import pytest
from lxml import etree
from openroute.persistence import MessageStore
from pydantic import AliasChoices, BaseModel, Field

from openroute import DeploymentError, Engine, EngineSettings, InboundMessage, ValidationError, route
from openroute.definitions.body import Body, InvalidBodyError, element_data
from openroute.definitions.route import Route, RouteRegistry

NS = "urn:example:shop"


class Line(BaseModel):
    sku: str
    quantity: int = Field(gt=0)


class Order(BaseModel):
    orderId: str
    lines: list[Line] = Field(validation_alias=AliasChoices("lines", "line"))
    note: str | None = None
    priority: int = 0


def _element(xml: str) -> etree._Element:
    return etree.fromstring(xml.encode())


def test_a_request_element_is_bound_by_local_names_nested_models_and_repeated_children() -> None:
    element = _element(
        f'<s:order xmlns:s="{NS}" xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance" priority="3">'
        "<s:orderId>O-1</s:orderId><s:line><s:sku>A</s:sku><s:quantity>2</s:quantity></s:line>"
        '<s:note xsi:nil="true"/></s:order>'
    )
    assert element_data(element, Order) == {"priority": "3", "orderId": "O-1",
                                            "line": [{"sku": "A", "quantity": "2"}], "note": None}
    order = Body(Order, Order).from_xml(element)
    assert order == Order(orderId="O-1", lines=[Line(sku="A", quantity=2)], priority=3)


def test_a_field_error_names_the_path_as_the_sender_wrote_it() -> None:
    body = Body(Order, Order)
    with pytest.raises(InvalidBodyError) as refused:
        body.parse(f'<s:order xmlns:s="{NS}"><s:line><s:sku>A</s:sku><s:quantity>x</s:quantity></s:line></s:order>',
                   "application/xml")
    fields = {(e.field, e.type) for e in refused.value.field_errors}
    assert fields == {("orderId", "missing"), ("line.0.quantity", "int_parsing")}
    assert refused.value.code == "INVALID_BODY"
    assert "Order" in str(refused.value) and "orderId: Field required" in str(refused.value)
    with pytest.raises(InvalidBodyError) as json_refused:
        body.parse('{"orderId": "O-1", "lines": [{"sku": "A", "quantity": 0}]}', "application/json")
    assert [e.field for e in json_refused.value.field_errors] == ["lines.0.quantity"]


def test_text_that_does_not_parse_or_declares_a_doctype_is_a_validation_error() -> None:
    body = Body(Order, Order)
    for text, content_type in (("{not json", "application/json"), ("<a><b></a>", "application/xml"),
                               ('<!DOCTYPE a [<!ENTITY x "y">]><a>&x;</a>', "application/xml")):
        with pytest.raises(ValidationError):
            body.parse(text, content_type)


def test_body_takes_pydantic_models_only() -> None:
    with pytest.raises(DeploymentError, match="route shop/order: body: json must be a pydantic BaseModel"):
        route("shop", "order").json().body(dict)  # type: ignore[arg-type]
    built = route("shop", "order").json().body(Order).process(lambda exchange: None).build()
    assert built.route.body == Body(Order, Order)


async def test_accept_refuses_a_body_its_model_refuses_and_stores_nothing(store: MessageStore) -> None:
    routes = RouteRegistry([Route("shop", "order", [lambda exchange: None], body=Body(Order, Order))])
    engine = Engine(store, routes, EngineSettings(repoll_interval=None, node_id="body-test"))
    for payload, content_type in (('{"orderId": "O-1", "lines": [{"sku": "A"}]}', "application/json"),
                                  (f'<s:order xmlns:s="{NS}"><s:orderId>O-1</s:orderId></s:order>', "application/xml")):
        inbound = InboundMessage(service="shop", operation="order", payload=payload, content_type=content_type,
                                 correlation_id="c-1", source_system="test")
        with pytest.raises(InvalidBodyError) as refused:
            await engine.accept(inbound)
        assert [e.field for e in refused.value.field_errors] in (["lines.0.quantity"], ["lines"])
    assert sum(store.count_by_state().values()) == 0
    good = InboundMessage(service="shop", operation="order", payload='{"orderId": "O-1", "line": []}',
                          content_type="application/json", correlation_id="c-2", source_system="test")
    accepted = await engine.accept(good)
    assert store.get(accepted.message_id) is not None
    await engine.stop()
