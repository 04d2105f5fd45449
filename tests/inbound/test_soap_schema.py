"""A SOAP route with an XSD (``.soap(..., schema=...)``): requests are validated against it (an invalid one is a
SOAP Fault naming the element, and nothing is stored), the served WSDL describes the request element with the
schema, and a schema that cannot be used stops the application at start (DeploymentError)."""

from __future__ import annotations

from pathlib import Path

import pytest
import zeep
from lxml import etree

from openroute.definitions.errors import ConfigurationError, DeploymentError
from openroute.dsl import Application, route
from openroute.inbound import InboundBinding, QName
from openroute.testing import CallRecorder, RouteTestKit

SCHEMAS = Path(__file__).parent / "schemas"
C = "http://example.com/crm"
XSD = "http://www.w3.org/2001/XMLSchema"
SOAP11 = "http://schemas.xmlsoap.org/soap/envelope/"
SOAP12 = "http://www.w3.org/2003/05/soap-envelope"


def application(step: CallRecorder, schema: str | Path = SCHEMAS / "customer.xsd") -> Application:
    return Application(
        route("crm", "setCustomer")
        .soap(f"{{{C}}}setCustomerRequest", namespaces={"c": C}, schema=schema)
        .json()
        .object_id("c:customerId", json="$.customerId")
        .process(step),
        route("crm", "ping").soap(f"{{{C}}}pingRequest").process(lambda exchange: None),  # no schema: open
    )


def request(body: str) -> str:
    return f'<c:setCustomerRequest xmlns:c="{C}">{body}</c:setCustomerRequest>'


@pytest.fixture
async def kit(database_url: str):
    step = CallRecorder()
    async with RouteTestKit(application(step), database_url=database_url) as test_kit:
        test_kit.step = step
        yield test_kit


async def test_a_valid_request_is_accepted_and_processed(kit: RouteTestKit) -> None:
    sent = await kit.send("crm", "setCustomer", request("<c:customerId>C-1</c:customerId><c:msisdn>420600100200"
                                                        "</c:msisdn><c:lines>2</c:lines>"))
    assert sent.accepted, sent.body
    await kit.settle()
    assert kit.assert_state(sent.message_id, "OK").object_id == "C-1"
    assert kit.step.calls == 1


@pytest.mark.parametrize(("body", "element", "problem"), [
    ("<c:customerId>C-1</c:customerId><c:msisdn>call me</c:msisdn>", "msisdn", "pattern"),
    ("<c:msisdn>420600100200</c:msisdn>", "msisdn", "Expected is ( {http://example.com/crm}customerId )"),
    ("<c:customerId>C-1</c:customerId>", "setCustomerRequest", "Missing child element"),
    ("<c:customerId>C-1</c:customerId><c:msisdn>420600100200</c:msisdn><c:extra>x</c:extra>", "extra",
     "This element is not expected"),
    ("<c:customerId>C-1</c:customerId><c:msisdn>420600100200</c:msisdn><c:lines>two</c:lines>", "lines",
     "positiveInteger"),
    ("<c:customerId>C-1</c:customerId><c:msisdn>420600100200</c:msisdn><c:lines>0</c:lines>", "lines",
     "positiveInteger"),
    ("<c:customerId></c:customerId><c:msisdn>420600100200</c:msisdn>", "customerId", "minLength"),
    ("<c:customerId>" + "C" * 21 + "</c:customerId><c:msisdn>420600100200</c:msisdn>", "customerId", "maxLength"),
    ('<c:customerId c:vip="yes">C-1</c:customerId><c:msisdn>420600100200</c:msisdn>', "customerId",
     "attribute '{http://example.com/crm}vip' is not allowed"),
    ("<customerId>C-1</customerId><c:msisdn>420600100200</c:msisdn>", "customerId",
     "Expected is ( {http://example.com/crm}customerId )"),
], ids=["pattern", "missing-first", "missing-last", "unexpected", "wrong-type", "out-of-range", "too-short",
        "too-long", "unknown-attribute", "wrong-namespace"])
async def test_an_invalid_request_is_a_client_fault_naming_the_element_and_nothing_is_stored(
    kit: RouteTestKit, body: str, element: str, problem: str,
) -> None:
    refused = await kit.send("crm", "setCustomer", request(body))
    assert (refused.accepted, refused.status_code, refused.error_code) == (False, 500, "VALIDATION_ERROR")
    assert f"Element '{{{C}}}{element}'" in refused.reason or f"Element '{element}'" in refused.reason, refused.reason
    assert problem in refused.reason and "schema customer.xsd" in refused.reason, refused.reason
    fault = etree.fromstring(refused.body.encode()).find(f".//{{{SOAP11}}}Fault")
    assert fault.findtext("faultcode").endswith("Client")
    assert kit.count_by_state() == {} and kit.step.calls == 0


async def test_soap12_invalid_request_is_a_sender_fault(kit: RouteTestKit) -> None:
    envelope = (f'<e:Envelope xmlns:e="{SOAP12}"><e:Body>{request("<c:customerId>C-1</c:customerId>")}'
                "</e:Body></e:Envelope>")
    refused = await kit.send("crm", "setCustomer", envelope)
    assert (refused.status_code, refused.error_code) == (400, "VALIDATION_ERROR")
    assert "Missing child element" in refused.reason and kit.count_by_state() == {}


async def test_the_json_endpoint_of_the_route_is_not_checked_against_the_xsd(kit: RouteTestKit) -> None:
    sent = await kit.send("crm", "setCustomer", {"customerId": "C-1", "msisdn": "call me"})
    assert sent.accepted
    await kit.settle()
    kit.assert_state(sent.message_id, "OK")


async def test_the_wsdl_describes_the_request_element_with_the_schema(kit: RouteTestKit, tmp_path: Path) -> None:
    response = await kit.client.get("/soap/crm?wsdl")
    assert response.status_code == 200
    wsdl = etree.fromstring(response.content)
    declared = {(schema.get("targetNamespace"), element.get("name")): element
                for schema in wsdl.iter(f"{{{XSD}}}schema") for element in schema.findall(f"{{{XSD}}}element")}
    assert declared[(C, "setCustomerRequest")].get("type") is None            # the schema's complex type
    assert declared[(C, "pingRequest")].get("type") == "xsd:anyType"          # no schema: open, as before
    path = tmp_path / "crm.wsdl"
    path.write_bytes(response.content)
    client = zeep.Client(str(path))                                              # a real SOAP client reads it
    element = client.get_element(f"{{{C}}}setCustomerRequest")
    assert [name for name, _ in element.type.elements] == ["customerId", "msisdn", "lines"]
    with pytest.raises(zeep.exceptions.ValidationError):                      # zeep knows the required fields
        client.create_message(client.service, "setCustomer", msisdn="420600100200")
    message = client.create_message(client.service, "setCustomer", customerId="C-2", msisdn="420600100201")
    body = etree.tostring(message.find(f"{{{SOAP11}}}Body")[0], encoding="unicode")
    sent = await kit.send("crm", "setCustomer", body)                          # what zeep sends is accepted
    assert sent.accepted, sent.reason


@pytest.mark.parametrize(("name", "problem"), [
    ("missing.xsd", "cannot be read"),
    ("malformed.xsd", "not well-formed XML"),
    ("xxe.xsd", "DOCTYPE / entity declarations are not allowed"),
    ("not-a-schema.xsd", "the root element must be"),
    ("invalid.xsd", "not a valid XML Schema"),
    ("include.xsd", "include of another schema is not supported"),
])
def test_a_schema_that_cannot_be_used_stops_the_application_at_start(name: str, problem: str) -> None:
    with pytest.raises(DeploymentError) as raised:
        application(CallRecorder(), SCHEMAS / name)
    message = str(raised.value)
    assert "route crm/setCustomer" in message and problem in message and name in message, message


def test_a_schema_that_does_not_declare_the_request_element_stops_the_application() -> None:
    with pytest.raises(DeploymentError, match=r"declares no global element \{http://example.com/other\}x"):
        Application(route("crm", "other").soap("{http://example.com/other}x", schema=SCHEMAS / "customer.xsd")
                    .process(lambda exchange: None))


def test_a_schema_needs_an_xml_binding_with_a_request_element() -> None:
    with pytest.raises(ConfigurationError, match="only applies to XML"):
        InboundBinding("crm", "setCustomer", "json", schema=SCHEMAS / "customer.xsd")
    with pytest.raises(ConfigurationError, match="needs the request_element"):
        InboundBinding("crm", "setCustomer", "xml", soap_action="crm/setCustomer", schema=SCHEMAS / "customer.xsd")
    with pytest.raises(ConfigurationError, match="path of an XSD file"):
        InboundBinding("crm", "setCustomer", "xml", request_element=QName(C, "setCustomerRequest"), schema=" ")
