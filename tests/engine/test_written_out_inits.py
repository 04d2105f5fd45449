"""The frozen dataclasses built once per message write their ``__init__`` out (see the comments there): each must
stay the one the dataclass would generate, field for field."""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any

import pytest
from openroute.persistence import MessageState

from openroute.definitions.message import InboundMessage
from openroute.engine.accept import AcceptResult
from openroute.engine.outcome import Decision

WRITTEN_OUT = [InboundMessage, AcceptResult, Decision]


@pytest.mark.parametrize("cls", WRITTEN_OUT)
def test_the_parameters_are_the_fields_in_order_with_their_defaults(cls: Any) -> None:
    parameters = list(inspect.signature(cls).parameters.values())
    fields = [f for f in dataclasses.fields(cls) if f.init]
    assert [p.name for p in parameters] == [f.name for f in fields]
    for parameter, field in zip(parameters, fields, strict=True):
        if field.default is not dataclasses.MISSING:
            assert parameter.default == field.default, field.name
        elif field.default_factory is not dataclasses.MISSING:
            assert parameter.default == field.default_factory(), field.name  # an empty mapping
        else:
            assert parameter.default is inspect.Parameter.empty, field.name


def test_an_inbound_message_is_what_the_fields_say_and_stays_frozen() -> None:
    message = InboundMessage("svc", "op", "<a/>", "text/xml", "c-1", "src", object_id="7", body={"a": 1})
    assert (message.service, message.operation, message.payload, message.content_type, message.correlation_id,
            message.source_system, message.object_id, message.body) == ("svc", "op", "<a/>", "text/xml", "c-1", "src",
                                                                        "7", {"a": 1})
    assert message.headers == {} and message.process_id is None and message.traceparent is None
    assert message == InboundMessage("svc", "op", "<a/>", "text/xml", "c-1", "src", object_id="7")  # body: no compare
    assert dataclasses.replace(message, headers={"h": "v"}).headers == {"h": "v"}
    with pytest.raises(dataclasses.FrozenInstanceError):
        message.service = "other"  # type: ignore[misc]


def test_each_message_without_headers_gets_a_dict_of_its_own() -> None:
    first, second = (InboundMessage("s", "o", "p", "t", f"c-{i}", "src") for i in range(2))
    assert type(first.headers) is dict and first.headers is not second.headers
    assert InboundMessage("s", "o", "p", "t", "c", "src", headers=None).headers is None  # type: ignore[arg-type]  # check_inbound refuses it, as before


def test_an_accept_result_and_a_decision_are_what_their_fields_say() -> None:
    result = AcceptResult(3, "c-3", False, MessageState.NEW)
    assert (result.message_id, result.correlation_id, result.duplicate, result.state) == (3, "c-3", False,
                                                                                         MessageState.NEW)
    assert result == AcceptResult(message_id=3, correlation_id="c-3", duplicate=False, state=MessageState.NEW)
    decision = Decision(MessageState.OK)
    assert decision.changes == {} and decision.changes is not Decision(MessageState.OK).changes
    assert Decision(MessageState.FAILED, {"a": 1}) == Decision(target=MessageState.FAILED, changes={"a": 1})
    for frozen in (result, decision):
        with pytest.raises(dataclasses.FrozenInstanceError):
            frozen.state = MessageState.OK  # type: ignore[attr-defined,misc]
