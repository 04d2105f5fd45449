"""The exchange (openroute/engine/exchange.py): what a step can ask of it without an engine."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime

import pytest
from openroute.persistence import EntityCallStatus, MessageState, StoredMessage

from openroute import ChildMessage, ConfigurationError, Exchange, ExtCallScope, Route

NOW = datetime(2026, 11, 23, 10, 0, tzinfo=UTC)


def exchange(**metadata: object) -> Exchange:
    message = StoredMessage(
        id=1, correlation_id="c", source_system="crm", process_id=None, service="crm", operation="op",
        object_id=None, entity_type=None, funnel_value=None, payload="{}", content_type="application/json",
        headers={}, state=MessageState.PROCESSING, failed_count=0, receive_ts=NOW, msg_ts=None,
        start_process_ts=NOW, last_update_ts=NOW, next_attempt_at=None, node_id="n", custom_data={},
        business_errors=[], last_error_code=None, last_error_text=None, parent_id=None, version=1,
    )
    return Exchange(message, "{}", {}, {}, metadata=dict(metadata))


def test_ext_call_result_is_typed_and_says_what_is_missing() -> None:
    ex = exchange(ext_calls={"billing": {"account": "A-1"}, "mno": "ok"})
    account = ex.ext_call_result("billing", dict)
    assert account == {"account": "A-1"}
    assert ex.ext_call_result("mno", str) == "ok"
    with pytest.raises(TypeError, match="'mno' returned str, not dict"):
        ex.ext_call_result("mno", dict)
    with pytest.raises(KeyError, match="'crm'"):
        ex.ext_call_result("crm", dict)


async def test_an_exchange_without_an_engine_refuses_store_work() -> None:
    with pytest.raises(RuntimeError, match="not attached to an engine"):
        await exchange().call_once("k", lambda: 1)
    with pytest.raises(RuntimeError, match="not attached to an engine"):
        await exchange().split([ChildMessage("{}", "child")])


def test_ext_call_scope_is_an_enum_that_keeps_its_stored_strings() -> None:
    step = [lambda exchange: None]
    assert Route("crm", "op", step).ext_call_scope is ExtCallScope.MESSAGE
    entity = Route("crm", "op", step, ext_call_scope="entity")
    assert entity.ext_call_scope is ExtCallScope.ENTITY and entity.ext_call_scope == "entity"
    with pytest.raises(ConfigurationError, match="ext_call_scope must be 'message' or 'entity', got 'global'"):
        Route("crm", "op", step, ext_call_scope="global")  # type: ignore[arg-type]
    assert EntityCallStatus("BUSY") is EntityCallStatus.BUSY and EntityCallStatus.DONE == "OK"


def test_the_fields_an_attempt_passes_by_position_and_their_defaults() -> None:
    """``Attempts.begin`` builds each exchange by position, the defaults written out: a field added or moved, or a
    default changed, must change that call too."""
    fields = [f for f in dataclasses.fields(Exchange) if f.init]
    assert [f.name for f in fields] == ["message", "payload", "headers", "custom_data", "business_errors", "no_effect",
                                        "result", "postponed_for", "metadata", "children", "route", "runtime"]
    built = exchange()
    assert (built.no_effect, built.result, built.postponed_for, built.children) == (False, None, None, [])
    assert built.metadata == {} and built.route is None and built.runtime is None
