"""Bad bindings, settings and credentials are refused when they are configured, with a clear typed error."""

from __future__ import annotations

from typing import Any

import pytest
from lxml import etree

from openroute.definitions.errors import ConfigurationError, ValidationError
from openroute.engine import Engine, EngineSettings
from openroute.inbound import (
    AdminAuth,
    AdminUser,
    ApiKey,
    BasicCredentials,
    InboundBinding,
    InboundEndpoints,
    InboundSettings,
    ParsedPayload,
    QName,
    SourceSystemAuth,
    load_auth_config,
)
from openroute.loading import load_routes
from tests.inbound.conftest import ORD, routes


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"content_type": "yaml"}, "content_type must be"),
        ({"content_type": "xml"}, "needs a request_element or a soap_action"),
        ({"content_type": "xml", "request_element": "createOrder"}, "needs a namespace"),
        ({"content_type": "json", "request_element": QName(ORD, "x")}, "only apply to XML"),
        ({"content_type": "json", "required": ["orderId"]}, "must start with '\\$'"),
        ({"content_type": "json", "required": ["$..[?"]}, "invalid JSON path"),
        ({"content_type": "xml", "soap_action": "a", "required": ["o:order["]}, "invalid XPath"),
        ({"content_type": "json", "required": "$.a"}, "sequence of expressions"),
        ({"content_type": "json", "validators": [42]}, "not callable"),
        ({"content_type": "json", "object_id": ""}, "non-empty string"),
        ({"content_type": "json", "service": ""}, "service must be"),
    ],
)
def test_bad_binding(kwargs: dict[str, Any], message: str) -> None:
    values: dict[str, Any] = {"service": "orders", "operation": "create", **kwargs}
    with pytest.raises(ConfigurationError, match=message):
        InboundBinding(**values)


def test_binding_extracts_and_reports_precisely() -> None:
    binding = InboundBinding("orders", "create", "json", required=["$.items[0].sku"], object_id="$.id",
                             funnel_value=lambda p: p.json["customer"], entity_type="$.kind")
    payload = ParsedPayload("json", "{}", json={"id": 12, "customer": "C", "kind": "order", "items": [{"sku": "A"}]})
    extracted = binding.check(payload)
    assert (extracted.object_id, extracted.entity_type, extracted.funnel_value) == ("12", "order", "C")
    with pytest.raises(ValidationError, match=r"required \$\.items\[0\]\.sku is missing"):
        binding.check(ParsedPayload("json", "{}", json={"items": []}))
    wrong = InboundBinding("orders", "create", "json", object_id=lambda p: 5)  # type: ignore[arg-type,return-value]
    with pytest.raises(ConfigurationError, match="must return a string"):
        wrong.check(ParsedPayload("json", "{}", json={}))
    xml = InboundBinding("orders", "create", "xml", request_element=f"{{{ORD}}}createOrder", namespaces={"o": ORD},
                         object_id="/o:createOrder/o:orderId", entity_type="count(o:line)")
    root = etree.fromstring(f'<o:createOrder xmlns:o="{ORD}"><o:orderId> 7 </o:orderId><o:line/><o:line/>'
                            "</o:createOrder>")
    extracted = xml.check(ParsedPayload("xml", "", xml=root))
    assert (extracted.object_id, extracted.entity_type) == ("7", "2")
    undeclared = InboundBinding("orders", "create", "xml", soap_action="a", object_id="x:id")
    with pytest.raises(ConfigurationError, match="cannot be evaluated"):
        undeclared.check(ParsedPayload("xml", "", xml=root))


@pytest.mark.parametrize(("element", "text"), [
    ("<o:id> 7 </o:id>", "7"),
    ("<o:id><![CDATA[ <7> ]]></o:id>", "<7>"),
    ("<o:id>C-<o:part>7</o:part>-<o:part>8</o:part> tail</o:id>", "C-7-8 tail"),
    ("<o:id>7<!-- a comment is no text -->8</o:id>", "78"),
    ("<o:id>  </o:id>", None),
    ("<o:id/>", None),
    ("<o:id>first</o:id><o:id>second</o:id>", "first"),
], ids=["leaf", "cdata", "mixed-content", "comment", "blank", "empty", "first-match"])
def test_an_xml_extractor_takes_the_string_value_of_the_first_element_matched(element: str, text: str | None) -> None:
    binding = InboundBinding("orders", "create", "xml", request_element=f"{{{ORD}}}createOrder",
                             namespaces={"o": ORD}, object_id="o:id")
    root = etree.fromstring(f'<o:createOrder xmlns:o="{ORD}">{element}</o:createOrder>')
    assert binding.check(ParsedPayload("xml", "", xml=root)).object_id == text


_DOCUMENTS = [
    {"id": 12, "customer": {"id": "C-1", "tier": None}, "items": [{"sku": "A"}], "x y": "spaced", "*": "star"},
    {"id": None, "customer": "C-2", "items": {"sku": "B"}},
    {"customer": ["C-3"], "items": []},
    {"customer": {"id": {"deep": [1, 2]}}, "id": False, "": "empty name"},
    {},
]


@pytest.mark.parametrize("expression", [
    "$", "$.id", "$.customer", "$.customer.id", "$.customer.tier", "$.customer.id.deep", "$.items.sku",
    '$."x y"', "$.missing.id", "$.items[0].sku", "$.*", "$.customer.*",
])
def test_member_paths_find_what_jsonpath_finds(expression: str) -> None:
    """Plain member paths are looked up without jsonpath_ng's match objects: same matches, every other path
    (indexes, wildcards) still goes through jsonpath_ng."""
    from jsonpath_ng.parser import parse

    from openroute.definitions.binding import _compile, _member_chain

    evaluate = _compile(expression, "json", {}, "test")
    path = parse(expression)
    plain = "[" not in expression and "*" not in expression
    assert (_member_chain(path) is not None) == plain  # the plain ones take the lookup
    for document in _DOCUMENTS:
        assert evaluate(document) == [match.value for match in path.find(document)], document


_XML_DOCUMENTS = [
    b'<o:r xmlns:o="urn:o"><o:a>1</o:a><o:b><o:c>2</o:c><o:c>3</o:c></o:b><o:b><o:c>4</o:c></o:b><a>5</a></o:r>',
    b'<o:r xmlns:o="urn:o" xmlns:p="urn:o"><p:a>6</p:a><!-- c --><o:a><o:a/></o:a><?pi x?><x:a xmlns:x="urn:x"/></o:r>',
    b'<r><a>7</a><b><c>8</c></b><o:a xmlns:o="urn:o">9</o:a></r>',
    b'<o:r xmlns:o="urn:o"/>',
]


@pytest.mark.parametrize("expression", ["o:a", "a", "o:b/o:c", "b/c", "o:a/o:a", "o:b/o:missing", "o:a/text()",
                                        "o:b[1]/o:c", "//o:c", "o:*", "q:a", "o:c.d", "o:b/o:c/o:d"])
def test_child_paths_find_what_xpath_finds(expression: str) -> None:
    """XPaths of child steps by name are walked in Python (libxml2's XPath releases the GIL twice per evaluation):
    same matches in the same order; every other XPath, and an undeclared prefix, still goes through libxml2."""
    from lxml import etree

    from openroute.definitions.binding import _child_tags, _ChildWalk, _compile

    namespaces = {"o": "urn:o"}
    evaluate = _compile(expression, "xml", namespaces, "test")
    walked = _child_tags(expression, namespaces) is not None
    assert walked == (expression in {"o:a", "a", "o:b/o:c", "b/c", "o:a/o:a", "o:b/o:missing", "o:c.d",
                                     "o:b/o:c/o:d"})
    xpath = etree.XPath(expression, namespaces=namespaces)
    for document in _XML_DOCUMENTS:
        root = etree.fromstring(document)
        if expression.startswith("q:"):
            with pytest.raises(ConfigurationError, match="cannot be evaluated"):
                evaluate(root)
            continue
        expected = xpath(root)
        assert evaluate(root) == (expected if isinstance(expected, list) else [expected]), document
        if walked:  # a binding walks a payload over child lists its walks share: the same matches, twice over
            assert isinstance(evaluate, _ChildWalk)
            payload = ParsedPayload("xml", document.decode(), xml=root)
            assert evaluate.in_payload(payload) == evaluate(root) == evaluate.in_payload(payload), document


async def test_bad_endpoint_configuration(sqlite_url: str) -> None:
    engine = Engine(sqlite_url, routes(), EngineSettings(repoll_interval=None))
    try:
        json_binding = InboundBinding("orders", "create", "json")
        with pytest.raises(ConfigurationError, match="has no route"):
            InboundEndpoints(engine, [InboundBinding("billing", "charge", "json")])
        with pytest.raises(ConfigurationError, match="two JSON bindings"):
            InboundEndpoints(engine, [json_binding, json_binding])
        element = QName(ORD, "createOrder")
        with pytest.raises(ConfigurationError, match="bound twice"):
            InboundEndpoints(engine, [InboundBinding("orders", "create", "xml", request_element=element),
                                      InboundBinding("orders", "cancel", "xml", request_element=element)])
        with pytest.raises(ConfigurationError, match="expected an InboundBinding"):
            InboundEndpoints(engine, ["orders/create"])  # type: ignore[list-item]
    finally:
        await engine.stop()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"max_body_bytes": 0}, "max_body_bytes"), ({"max_depth": 1}, "max_depth"),
     ({"soap_prefix": "soap"}, "soap_prefix"), ({"json_prefix": "/api/"}, "json_prefix")],
)
def test_bad_settings(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        InboundSettings(**kwargs)


@pytest.mark.parametrize(
    ("systems", "message"),
    [
        ({}, "at least one system"),
        ({"CRM": ApiKey("short")}, "at least 16"),
        ({"CRM": BasicCredentials("a:b", "pw")}, "no ':'"),
        ({"CRM": BasicCredentials("crm", "a"), "ERP": BasicCredentials("crm", "b")}, "two source systems"),
        ({"CRM": ApiKey("k" * 16), "ERP": ApiKey("k" * 16)}, "configured twice"),
        ({"CRM": []}, "no credentials"),
        ({"CRM": ["password"]}, "expected BasicCredentials or ApiKey"),
    ],
)
def test_bad_source_system_credentials(systems: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        SourceSystemAuth(systems)


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ([], "JSON object"),
        ({"users": {}}, "unknown authentication settings"),
        ({"sourceSystems": {"CRM": {"token": "x"}}}, "give 'basic' and/or 'apiKey'"),
        ({"sourceSystems": {"CRM": {"basic": {"username": "crm"}}}}, "basic needs username and password"),
        ({"admins": [{"username": "ops"}]}, "lacks 'password'"),
        ({"admins": {"ops": "pw"}}, "list of"),
    ],
)
def test_bad_auth_config(config: Any, message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        load_auth_config(config)


def test_auth_config_and_admin_users() -> None:
    inbound, admin = load_auth_config({"sourceSystems": {"ERP": {"apiKey": "k" * 20}},
                                       "admins": [{"username": "ops", "password": "pw"}]})
    assert inbound is not None and inbound.systems == {"ERP"}
    assert inbound.authenticate({"authorization": "ApiKey " + "k" * 20}) == "ERP"
    assert admin is not None
    with pytest.raises(ConfigurationError, match="configured twice"):
        AdminAuth([AdminUser("ops", "a"), AdminUser("ops", "b")])


@pytest.mark.parametrize(
    ("spec", "message"),
    [("routes", "module:attribute"), ("no_such_mod:registry", "cannot import"),
     ("tests.inbound.sample_routes:nothing", "has no attribute"), ("tests.inbound.conftest:ORD", "neither")],
)
def test_bad_routes_spec(spec: str, message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        load_routes(spec)


def test_routes_spec_forms() -> None:
    registry, bindings = load_routes("tests.inbound.sample_routes:registry")
    assert len(registry) == 1 and bindings is None
    registry, bindings = load_routes("tests.inbound.conftest:routes")  # a callable returning a registry
    assert len(registry) == 2 and bindings is None


def test_request_headers_are_read_once_the_first_of_repeated_names_counting() -> None:
    """What Starlette's ``Headers.get`` gives, from one pass: lower-case names, the first of a repeated header."""
    from starlette.datastructures import Headers

    from openroute.inbound.app import _header_values

    raw = [(b"content-type", b"text/xml"), (b"x-correlation-id", b"first"), (b"X-Source-System", b"CRM"),
           (b"x-correlation-id", b"second"), (b"x-note", "caf\u00e9".encode("latin-1"))]
    values = _header_values({"headers": raw})
    assert values == {"content-type": "text/xml", "x-correlation-id": "first", "x-source-system": "CRM",
                      "x-note": "caf\u00e9"}
    starlette = Headers(raw=[(name.lower(), value) for name, value in raw])
    assert all(starlette.get(name) == value for name, value in values.items())
