"""The route DSL: each clause, what it builds, and every kind of bad definition."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from lxml import etree
from openroute.persistence import MessageState

from openroute import Application, DeploymentError, Exchange, RetryPolicy, RouteBuilder, ValidationError, route, steps
from openroute.definitions.binding import ParsedPayload
from openroute.definitions.interceptors import MessageInterceptor
from openroute.testing import CallRecorder, RouteTestKit

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
        (lambda: route("", "op"), "route service must be a non-empty string"),
        (lambda: route("s", "x" * 101), "route operation must be a non-empty string"),
        (lambda: route("s", 7), "route operation must be a non-empty string"),  # type: ignore[arg-type]
        (lambda: route("s", "o").build(), "route s/o has no processing steps"),
        (lambda: route("s", "o").process("not callable"), "route s/o: process: 'not callable' is not callable"),  # type: ignore[arg-type]
        (lambda: route("s", "o").ext_call("", print), "route s/o: ext_call: the key must be a non-empty string"),
        (lambda: route("s", "o").ext_call("k" * 256, print), "route s/o: ext_call: the key must be"),
        (lambda: route("s", "o").ext_call("k", 42), "route s/o: ext_call 'k': 42 is not callable"),  # type: ignore[arg-type]
        (lambda: route("s", "o").ext_call("k", print, scope="world"), "route s/o: ext_call 'k': scope must be"),  # type: ignore[arg-type]
        (lambda: route("s", "o").split(42, into="x"), "route s/o: split: 42 is not callable"),  # type: ignore[arg-type]
        (lambda: route("s", "o").split(print, into=("s",)), "route s/o: split: into must be"),  # type: ignore[arg-type]
        (lambda: route("s", "o").split(print, into=""), "route s/o: split: into must be"),
        (lambda: route("s", "o").call(route("s", "p")), "route s/o: call: expected a sub-route"),
        (lambda: route("s", "o").call(print), "route s/o: call: expected a sub-route"),  # type: ignore[arg-type]
        (lambda: steps().process(42), "sub-route: process: 42 is not callable"),  # type: ignore[arg-type]
        (lambda: steps().split(print, into=("a", "")), "sub-route: split: into must be"),
        (lambda: route("s", "o").retry(max_attempts=0), "route s/o: bad retry policy"),
        (lambda: route("s", "o").retry(speed=2), "route s/o: bad retry policy"),
        (lambda: route("s", "o").retry(RetryPolicy(), max_attempts=2), "route s/o: retry: .* not both"),
        (lambda: route("s", "o").retry("fast"), "route s/o: retry needs a RetryPolicy"),  # type: ignore[arg-type]
        (lambda: route("s", "o").on_business_error("ignore"), "route s/o: on_business_error: action must be"),  # type: ignore[arg-type]
        (lambda: route("s", "o").on_business_error("fail", "KeyError"), "route s/o: .*exception classes"),  # type: ignore[arg-type]
        (lambda: route("s", "o").intercept(object()), "route s/o: intercept: .* is not a MessageInterceptor"),  # type: ignore[arg-type]
        (lambda: route("s", "o").validate(42), "route s/o: validator 42 is not callable"),  # type: ignore[arg-type]
        (lambda: route("s", "o").ext_call_scope("x"), "route s/o: ext_call_scope must be"),  # type: ignore[arg-type]
        (lambda: route("s", "o").object_id(), "route s/o: object_id needs"),
        (lambda: route("s", "o").entity_type(), "route s/o: entity_type needs a value"),
        (lambda: route("s", "o").funnel(), "route s/o: funnel needs"),
        (lambda: route("s", "o").soap(""), "route s/o: soap: invalid element ''"),
        (lambda: route("s", "o").soap(action=""), "route s/o: soap: action must be a non-empty string"),
        (lambda: route("s", "o").soap(f"{{{NS}}}r", namespaces={"": NS}), "route s/o: soap: namespace prefix ''"),
        (lambda: route("s", "o").soap(f"{{{NS}}}r", namespaces={"t": ""}), "route s/o: soap: namespace 't' needs"),
        (lambda: route("s", "o").soap("no-namespace").process(print).build(),
         "route s/o: .*request_element needs a namespace"),
        (lambda: route("s", "o").require("t:missing[").process(print).build(), "route s/o: .*invalid XPath"),
        (lambda: route("s", "o").soap(f"{{{NS}}}r").object_id("x:id").process(print).build(),
         "route s/o: XPath 'x:id' cannot be evaluated: Undefined namespace prefix"),
        (lambda: route("s", "o").soap(f"{{{NS}}}r").funnel("nothing-like-this(1)").process(print).build(),
         "route s/o: XPath 'nothing-like-this[(]1[)]' cannot be evaluated: Unregistered function"),
        (lambda: route("s", "o").entity_type("a b").process(print).build(), "route s/o: .*entity_type: invalid XPath"),
        (lambda: route("s", "o").json().require(json="id").process(print).build(),
         "route s/o: .*must start with '[$]'"),
        (lambda: route("s", "o").json().object_id(json="$..[bad").process(print).build(),
         "route s/o: .*object_id: invalid JSON path"),
        (lambda: route("s", "o").on_error(retry=False), "route s/o: on_error needs at least one error"),
        (lambda: route("s", "o").on_error("TIMEOUT"), "route s/o: on_error: say what happens with exactly one"),
        (lambda: route("s", "o").on_error("TIMEOUT", retry=False, fail=True), "route s/o: on_error: say what"),
        (lambda: route("s", "o").on_error("TIMEOUT", retry=3), "route s/o: on_error: retry must be"),  # type: ignore[arg-type]
        (lambda: route("s", "o").on_error("TIMEOUT", fail="yes"), "route s/o: on_error: fail must be"),  # type: ignore[arg-type]
        (lambda: route("s", "o").on_error("", retry=False), "route s/o: on_error: an error code must be"),
        (lambda: route("s", "o").on_error(42, retry=False), "route s/o: on_error: 42 is neither"),  # type: ignore[arg-type]
        (lambda: route("s", "o").on_error("CIRCUIT_OPEN", retry=True), "route s/o: on_error: CIRCUIT_OPEN is decided"),
        (lambda: route("s", "o").on_error(ValidationError, fail=True),
         "route s/o: on_error: ValidationError is decided by the engine"),
        (lambda: route("s", "o").on_error("TIMEOUT", retry=True).on_error("TIMEOUT", retry=False),
         "route s/o: on_error: TIMEOUT is named twice"),
        (lambda: route("s", "o").on_business_error("fail", KeyError).on_error(KeyError, retry=True),
         "route s/o: on_error: KeyError is also a business exception"),
        (lambda: route("s", "o").on_error(KeyError, retry=True).on_business_error("fail", KeyError)
         .process(print).build(), "route s/o: on_error: KeyError is also a business exception"),
    ],
)
def test_bad_definitions_are_deployment_errors_naming_the_route(make: Any, reason: str) -> None:
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


def test_application_refuses_one_soap_action_on_two_routes_and_a_route_given_twice_as_definition() -> None:
    definition = route("crm", "a").soap(f"{{{NS}}}a").json().process(print).build()
    with pytest.raises(DeploymentError) as raised:
        Application(
            definition,
            route("crm", "a").json().process(print),  # same service+operation, so the same JSON path
            route("crm", "b").soap(action="urn:same").process(print),
            route("crm", "c").soap(action="urn:same").process(print),
        )
    assert raised.value.problems == [
        "a route for crm/a is already registered",
        "SOAPAction crm urn:same is bound to both crm/b and crm/c",
    ]
    other_service = Application(route("crm", "b").soap(action="urn:same").process(print),
                                route("billing", "b").soap(action="urn:same").process(print))
    assert len(other_service.bindings) == 2  # a SOAPAction is unique per service endpoint


def test_a_sub_route_never_called_is_fine_and_a_split_in_a_sub_route_is_checked() -> None:
    unused = steps().split(lambda ex: [], into="nowhere")
    assert unused.child_routes == (("", "nowhere"),)
    Application(route("crm", "a").process(print))  # the unused sub-route is no problem
    with pytest.raises(DeploymentError, match="route crm/a splits into crm/nowhere, which has no route"):
        Application(route("crm", "a").call(unused))
    app = Application(route("crm", "a").call(unused), route("crm", "nowhere").process(print))
    assert app.routes.get("crm", "a").child_routes == (("crm", "nowhere"),)
    across = Application(route("crm", "a").split(lambda ex: [], into=("billing", "line")),
                         route("billing", "line").process(print))
    assert across.routes.get("crm", "a").child_routes == (("billing", "line"),)


def test_entity_type_and_funnel_forms() -> None:
    definition = (
        route("crm", "set").soap(f"{{{NS}}}set", namespaces={"t": NS}).json()
        .entity_type("t:kind", json="$.kind").funnel(json="$.region")
        .process(print).build()
    )
    xml, json_binding = definition.bindings
    extracted = xml.check(_xml(f'<t:set xmlns:t="{NS}"><t:kind>customer</t:kind></t:set>'))
    assert (extracted.entity_type, extracted.funnel_value) == ("customer", None)  # funnel given for JSON only
    extracted = json_binding.check(ParsedPayload("json", "", json={"kind": "account", "region": "north"}))
    assert (extracted.entity_type, extracted.funnel_value) == ("account", "north")
    by_callable = route("crm", "set").json().entity_type(lambda p: p.json["k"].lower()).process(print).build()
    assert by_callable.bindings[0].check(ParsedPayload("json", "", json={"k": "X"})).entity_type == "x"
    # guaranteed order set before or after the funnel clause is kept; funnel(guaranteed_order=False) turns it off
    assert route("c", "s").guaranteed_order().funnel(json="$.a").process(print).build().route.guaranteed_order
    assert route("c", "s").funnel(json="$.a").guaranteed_order().process(print).build().route.guaranteed_order
    off = route("c", "s").guaranteed_order().funnel(json="$.a", guaranteed_order=False).process(print).build()
    assert off.route.guaranteed_order is False


async def test_async_process_steps_named_steps_and_ext_call_scope_per_step() -> None:
    seen: list[str] = []

    async def load(exchange: Exchange) -> str:
        seen.append("load")
        return "loaded"

    provision = CallRecorder(result={"n": 1})
    app = Application(
        route("crm", "set").json().object_id(json="$.id").ext_call_scope("entity")
        .process(load).process(lambda ex: seen.append(ex.metadata["ext_calls"]["p"]["n"]), name="after")
        .ext_call("once", CallRecorder(), scope="message")
    )
    assert [s.__name__ for s in app.routes.get("crm", "set").steps] == ["load", "after", "ext_call:once"]
    shared = Application(
        route("crm", "set").json().object_id(json="$.id").ext_call_scope("entity").ext_call("p", provision)
        .process(load).process(lambda ex: seen.append(ex.metadata["ext_calls"]["p"]["n"]), name="after")
    )
    async with RouteTestKit(shared) as kit:
        first = await kit.send("crm", "set", {"id": "C-1"})
        await kit.settle()  # one after the other: concurrent ones would meet the call in progress (retried)
        second = await kit.send("crm", "set", {"id": "C-1", "again": True})
        await kit.settle()
        kit.assert_state(first.message_id, "OK")
        kit.assert_state(second.message_id, "OK")
    assert provision.calls == 1 and seen == ["load", 1, "load", 1]  # entity scope: the second reuses the result
    assert app.routes.get("crm", "set").ext_call_scope == "entity"


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


def test_the_builder_names_its_options_like_the_route_fields_it_fills() -> None:
    import dataclasses

    from openroute import ExtCallScope, Route

    builder = (route("crm", "setCustomer").obsolete_check().guaranteed_order().ext_call_scope("entity")
               .retry(max_attempts=2).on_business_error("continue", KeyError).on_error("TIMEOUT", retry=False)
               .process(lambda exchange: None))
    assert set(builder.route_fields) <= {f.name for f in dataclasses.fields(Route)}
    built = builder.build().route
    for name, value in builder.route_fields.items():
        assert getattr(built, name) == value, name
    assert built.ext_call_scope is ExtCallScope.ENTITY


def test_on_error_reads_as_a_sentence_and_fills_the_routes_error_policies() -> None:
    from openroute.definitions.retry import ErrorAction, ErrorPolicy

    class AccountClosed(Exception):
        pass

    ten_times = RetryPolicy(max_attempts=10, interval=timedelta(seconds=10))
    built = (route("billing", "charge").json()
             .retry(max_attempts=5, interval=timedelta(seconds=30))
             .on_error("TIMEOUT", "HTTP_5*", retry=ten_times)
             .on_error("HTTP_423", retry=True)
             .on_error(KeyError, "HTTP_404", retry=False)
             .on_error(AccountClosed, fail=True)
             .process(print).build().route)
    assert built.retry_policy == RetryPolicy(max_attempts=5, interval=timedelta(seconds=30))  # stays the default
    assert built.error_policies == (
        ErrorPolicy(("TIMEOUT", "HTTP_5*"), (), ErrorAction.RETRY, ten_times),
        ErrorPolicy(("HTTP_423",), (), ErrorAction.RETRY, None),
        ErrorPolicy(("HTTP_404",), (KeyError,), ErrorAction.NEVER_RETRY, None),
        ErrorPolicy((), (AccountClosed,), ErrorAction.FAIL, None),
    )
    assert built.error_policies[2].names == ("HTTP_404", "KeyError")


def test_every_clause_returns_the_builders_own_type() -> None:
    import dataclasses
    from typing import Self

    @dataclasses.dataclass(frozen=True)
    class AuditedBuilder(RouteBuilder):
        def audited(self) -> Self:
            return self.process(lambda exchange: None, name="audit")

    start = AuditedBuilder(service="crm", operation="setCustomer")
    chained = (start.json().retry(max_attempts=2).on_error("TIMEOUT", retry=False).obsolete_check().audited()
               .ext_call("billing", lambda e: None))
    assert type(chained) is AuditedBuilder
    assert [getattr(step, "__name__", "") for step in chained.chain] == ["audit", "ext_call:billing"]
