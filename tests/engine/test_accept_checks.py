"""check_inbound checks every text field of an inbound message the same way, the fast path (the texts written out
inline) and the precise one (_check_text) alike."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from openroute.definitions.errors import UnknownRouteError, ValidationError
from openroute.definitions.message import InboundMessage
from openroute.definitions.route import Route, RouteRegistry
from openroute.engine.accept import check_inbound

ROUTES = RouteRegistry([Route("svc", "op", [lambda exchange: None])])
GOOD = InboundMessage("svc", "op", "<a/>", "text/xml", "c-1", "src")
#: every text field and its column size
TEXTS = {"service": 100, "operation": 100, "correlation_id": 255, "source_system": 100, "content_type": 100,
         "process_id": 255, "object_id": 255, "entity_type": 100, "funnel_value": 255}


def _refused(name: str, value: Any) -> str:
    with pytest.raises(ValidationError) as refused:
        check_inbound(dataclasses.replace(GOOD, **{name: value}), ROUTES, 1_000_000)
    return str(refused.value)


@pytest.mark.parametrize("name", TEXTS)
def test_each_text_is_refused_with_its_own_error(name: str) -> None:
    limit = TEXTS[name]
    for bad in ("", "   ", 7, b"bytes"):
        assert _refused(name, bad) == f"{name} must be a non-empty string, got {bad!r}"
    assert _refused(name, "x" * (limit + 1)) == f"{name} is longer than {limit} characters"
    assert _refused(name, "a\x00b") == f"{name} holds a NUL character"


@pytest.mark.parametrize("name", TEXTS)
def test_a_text_at_its_limit_a_str_subclass_and_inner_spaces_pass(name: str) -> None:
    class Text(str):
        pass

    for fine in ("x" * TEXTS[name], Text("value"), " a b\t"):
        if name in ("service", "operation"):
            routes = RouteRegistry([Route(fine if name == "service" else "svc", fine if name == "operation" else "op",
                                          [lambda exchange: None])])
        else:
            routes = ROUTES
        assert check_inbound(dataclasses.replace(GOOD, **{name: fine}), routes, 1_000_000).service


def test_the_texts_that_name_the_route_are_checked_before_it_is_looked_up_the_others_after() -> None:
    with pytest.raises(ValidationError):
        check_inbound(dataclasses.replace(GOOD, service=" ", correlation_id=""), ROUTES, 1_000_000)
    with pytest.raises(UnknownRouteError):
        check_inbound(dataclasses.replace(GOOD, service="other", correlation_id=""), ROUTES, 1_000_000)
