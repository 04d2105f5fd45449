"""The route DSL: each clause, what it builds, and every kind of bad definition."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from lxml import etree

from openroute.dsl import Application, RouteBuilder, route, steps
from openroute.errors import DeploymentError, ValidationError
from openroute.inbound.binding import ParsedPayload
from openroute.interceptors import MessageInterceptor
from openroute.retry import RetryPolicy
from openroute.route import Exchange
from openroute.testing import CallRecorder, RouteTestKit
from persistence import MessageState

NS = "http://openroute.dev/test"


def _xml(text: str) -> ParsedPayload:
    return ParsedPayload("xml", text, xml=etree.fromstring(text))


def test_builder_is_immutable_and_builds_route_and_bindings() -> None:
    base = route("crm", "setCustomer")
    with_json = base.json()
    assert base is not with_json and base.accepts_json is False
    definition = (
        with_json.soap(f"{{{NS}}}setCustomerRequest", action="urn:set", namespaces={"t": NS})
        .require("t:id", json="$.id")
        .object_id("t:id", json="$.id").entity_type("customer").funnel("t:id", json="$.id", guaranteed_order=True)
        .retry(max_attempts=3, interval=timedelta(seconds=5)).obsolete_check()
        .on_business_error("continue", KeyError).ext_call_scope("entity")
        .process(lambda ex: None).build()
    )
    built = definition.route
    assert built.key == ("crm", "setCustomer")
    assert built.retry_policy == RetryPolicy(max_attempts=3, interval=timedelta(seconds=5))
    assert (built.obsolete_check, built.guaranteed_order, built.continue_on_business_error) == (True, True, True)
    assert built.business_exceptions == (KeyError,) and built.ext_call_scope == "entity"
    xml, json_binding = definition.bindings
    assert (xml.content_type, str(xml.request_element), xml.soap_action) == ("xml", f"{{{NS}}}setCustomerRequest",
                                                                              "urn:set")
    extracted = xml.check(_xml(f'<t:setCustomerRequest xmlns:t="{NS}"><t:id>C-1</t:id></t:setCustomerRequest>'))
    assert (extracted.object_id, extracted.entity_type, extracted.funnel_value) == ("C-1", "customer", "C-1")
    extracted = json_binding.check(ParsedPayload("json", '{"id": "C-2"}', json={"id": "C-2"}))
    assert (extracted.object_id, extracted.entity_type, extracted.funnel_value) == ("C-2", "customer", "C-2")
    with pytest.raises(ValidationError, match=r"required \$.id is missing"):
        json_binding.check(ParsedPayload("json", "{}", json={}))


def test_defaults_serve_both_endpoints_and_entity_type_is_the_operation() -> None:
    definition = route("shop", "createOrder").process(lambda ex: None).build()
    kinds = [b.content_type for b in definition.bindings]
    assert kinds == ["xml", "json"]
    assert str(definition.bindings[0].request_element) == "{urn:openroute:service:shop}createOrder"
    only_json = route("shop", "createOrder").json().process(lambda ex: None).build()
    assert [b.content_type for b in only_json.bindings] == ["json"]
    assert only_json.bindings[0].check(ParsedPayload("json", "{}", json={})).entity_type == "createOrder"


def test_custom_validators_and_callable_extractors() -> None:
    def no_test_customers(payload: ParsedPayload) -> None:
        if payload.json.get("id", "").startswith("TEST"):
            raise ValidationError("test customers are refused")

    definition = (route("crm", "set").json().validate(no_test_customers)
                  .object_id(lambda p: p.json["id"].upper()).process(lambda ex: None).build())
    binding = definition.bindings[0]
    assert binding.check(ParsedPayload("json", "", json={"id": "c-1"})).object_id == "C-1"
    with pytest.raises(ValidationError, match="test customers"):
        binding.check(ParsedPayload("json", "", json={"id": "TEST-1"}))


async def test_sub_routes_ext_calls_and_splits_run_through_the_engine() -> None:
    billing = CallRecorder(result={"account": "A-1"})
    enrich = steps().process(lambda ex: ex.custom_data.update(enriched=True), name="enrich")
    app = Application(
        route("shop", "createOrder").json().call(enrich).ext_call("billing", billing)
        .split(lambda ex: [{"n": 1}, "plain"], into="line"),
        route("shop", "line").process(lambda ex: None),
    )
    assert app.routes.get("shop", "createOrder").child_routes == (("shop", "line"),)
    names = [s.__name__ for s in app.routes.get("shop", "createOrder").steps]
    assert names == ["enrich", "ext_call:billing", "split:line"]
    async with RouteTestKit(app) as kit:
        sent = await kit.send_json("shop", "createOrder", {"id": 1})
        await kit.settle()
        done = kit.assert_state(sent.message_id, MessageState.OK)
        assert done.custom_data == {"enriched": True} and billing.calls == 1
        assert [(c.payload, c.content_type) for c in kit.children(sent.message_id)] == [
            ('{"n": 1}', "application/json"), ("plain", "application/json")]


class Passing(MessageInterceptor):
    pass


@pytest.mark.parametrize(
    ("make", "reason"),
    [
        (lambda: route("", "op"), "service must be a non-empty string"),
        (lambda: route("s", "x" * 101), "operation must be a non-empty string"),
        (lambda: route("s", "o").build(), "route s/o has no processing steps"),
        (lambda: route("s", "o").process("not callable"), "is not callable"),  # type: ignore[arg-type]
        (lambda: route("s", "o").ext_call("", print), "the key must be a non-empty string"),
        (lambda: route("s", "o").ext_call("k", print, scope="world"), "scope must be"),  # type: ignore[arg-type]
        (lambda: route("s", "o").split(print, into=("s",)), "into must be"),  # type: ignore[arg-type]
        (lambda: route("s", "o").call(route("s", "p")), "expected a sub-route"),
        (lambda: route("s", "o").retry(max_attempts=0), "bad retry policy"),
        (lambda: route("s", "o").retry(RetryPolicy(), max_attempts=2), "not both"),
        (lambda: route("s", "o").on_business_error("ignore"), "must be 'continue' or 'fail'"),  # type: ignore[arg-type]
        (lambda: route("s", "o").on_business_error("fail", "KeyError"), "exception classes"),  # type: ignore[arg-type]
        (lambda: route("s", "o").intercept(object()), "is not a MessageInterceptor"),  # type: ignore[arg-type]
        (lambda: route("s", "o").validate(42), "is not callable"),  # type: ignore[arg-type]
        (lambda: route("s", "o").ext_call_scope("x"), "ext_call_scope must be"),  # type: ignore[arg-type]
        (lambda: route("s", "o").soap("no-namespace").process(print).build(), "request_element needs a namespace"),
        (lambda: route("s", "o").require("t:missing[").process(print).build(), "invalid XPath"),
        (lambda: route("s", "o").json().require(json="id").process(print).build(), "must start with '[$]'"),
    ],
)
def test_bad_definitions_are_deployment_errors(make: Any, reason: str) -> None:
    with pytest.raises(DeploymentError, match=reason):
        make()


def test_application_lists_every_problem() -> None:
    one = route("crm", "set").process(print)
    with pytest.raises(DeploymentError) as raised:
        Application(
            one,
            one,  # the same route twice
            route("crm", "other").soap(f"{{{NS}}}req").process(print),
            route("crm", "third").soap(f"{{{NS}}}req").process(print),  # same SOAP element
            route("crm", "split").split(lambda ex: [], into="nowhere"),  # split into no route
            route("crm", "empty"),  # no steps
            "not a route",  # type: ignore[arg-type]
        )
    problems = raised.value.problems
    assert any("crm/set is already registered" in p for p in problems)
    assert any("is bound to both crm/other and crm/third" in p for p in problems)
    assert any("splits into crm/nowhere, which has no route" in p for p in problems)
    assert any("route crm/empty has no processing steps" in p for p in problems)
    assert any("expected a route builder or definition" in p for p in problems)
    assert len(problems) == 5


def test_intercept_and_repr() -> None:
    interceptor = Passing()
    app = Application(route("crm", "ping").intercept(interceptor).process(print))
    assert app.routes.get("crm", "ping").interceptors == (interceptor,)
    assert repr(app) == "Application(crm/ping)"
    assert isinstance(route("a", "b"), RouteBuilder)


async def test_the_kit_fails_a_test_when_a_state_is_not_reached() -> None:
    def refuse(exchange: Exchange) -> None:
        raise ValidationError("never")

    async with RouteTestKit(Application(route("crm", "x").json().process(refuse))) as kit:
        sent = await kit.send_json("crm", "x", {"a": 1})
        await kit.settle()
        with pytest.raises(AssertionError, match=r"is FAILED, expected OK \(last error VALIDATION_ERROR: never\)"):
            kit.assert_state(sent.message_id, MessageState.OK)
        with pytest.raises(AssertionError, match="no message 999"):
            kit.message(999)
        refused = await kit.send_json("crm", "x", "not json")
        assert refused.status_code == 400 and refused.message_id is None
        duplicate = await kit.send_json("crm", "x", {"a": 1}, correlation_id=kit.message(sent.message_id)
                                        .correlation_id)
        assert duplicate.duplicate and duplicate.message_id == sent.message_id
