"""The patterns with plain Route objects on the engine (no DSL), on each real database; bad definitions and calls."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from openroute.persistence import MessageState, MessageStore

from openroute import ChildMessage, ConfigurationError, Exchange, RetryPolicy, Route, RouteRegistry
from openroute.definitions.clock import ManualClock
from openroute.definitions.message import InboundMessage
from openroute.engine import Engine, EngineSettings
from tests.patterns.steps import failing_first_attempt_of

S = MessageState
WAIT = 10.0
MINUTE = timedelta(minutes=1)
RETRY = RetryPolicy(max_attempts=3, interval=MINUTE, backoff=1.0)


@pytest.fixture
async def run(database_url: str) -> AsyncIterator[Callable[..., Any]]:
    """Start an engine with the given routes on a fresh store and a manual clock."""
    engines: list[Engine] = []
    stores: list[MessageStore] = []

    async def start(*routes: Route) -> Engine:
        store = MessageStore(database_url)
        store.create_schema()
        stores.append(store)
        clock = ManualClock(datetime(2030, 1, 1, tzinfo=UTC))
        engine = Engine(store, RouteRegistry(list(routes)), EngineSettings(repoll_interval=None), clock=clock)
        engines.append(engine)
        await engine.start()
        return engine

    yield start
    for engine in engines:
        await engine.stop()
    for store in stores:
        store.dispose()


def inbound(operation: str, key: str, **extra: Any) -> InboundMessage:
    return InboundMessage(service="crm", operation=operation, payload=json.dumps(extra.pop("body", {})),
                          content_type="application/json", correlation_id=key, source_system="crm", **extra)


async def send(engine: Engine, operation: str, key: str, **extra: Any) -> int:
    message_id = (await engine.accept(inbound(operation, key, **extra))).message_id
    await engine.wait_idle(WAIT)
    return message_id


def state(engine: Engine, message_id: int) -> MessageState:
    message = engine.store.get(message_id)
    assert message is not None
    return message.state


async def test_the_entity_type_defaults_to_the_operation_and_makes_a_plain_route_obsolete(run: Any) -> None:
    ran: list[str] = []
    step = failing_first_attempt_of("old", RuntimeError("remote down"), ran)

    engine = await run(Route("crm", "setCustomer", [step], retry_policy=RETRY, obsolete_check=True))
    old = await send(engine, "setCustomer", "old", object_id="C-1")
    engine.clock.advance(timedelta(seconds=1))  # type: ignore[attr-defined]
    new = await send(engine, "setCustomer", "new", object_id="C-1")
    plain = await send(engine, "setCustomer", "plain")
    stored = engine.store.get(old)
    assert stored is not None and stored.entity_type == "setCustomer"
    assert engine.store.get(plain).entity_type is None  # type: ignore[union-attr]  # no object id: no entity
    assert (state(engine, old), state(engine, new)) == (S.PARTLY_FAILED, S.OK)
    engine.clock.advance(MINUTE)  # type: ignore[attr-defined]
    await engine.repoll_once()
    await engine.wait_idle(WAIT)
    assert state(engine, old) is S.SKIPPED and ran == ["old", "new", "plain"]


async def test_children_get_an_entity_and_an_undeclared_child_route_is_refused(run: Any) -> None:
    async def split(exchange: Exchange) -> None:
        await exchange.split([ChildMessage('{"line": 1}', "line", object_id="L-1"),
                              ChildMessage('{"line": 2}', "line")])

    async def bad_split(exchange: Exchange) -> None:
        await exchange.split([ChildMessage("{}", "order")])  # a registered route, not among child_routes

    async def not_children(exchange: Exchange) -> None:
        await exchange.split(["{}"])  # type: ignore[list-item]

    engine = await run(
        Route("crm", "order", [split], child_routes=(("crm", "line"),)),
        Route("crm", "bad", [bad_split], retry_policy=RETRY, child_routes=(("crm", "line"),)),
        Route("crm", "worse", [not_children], retry_policy=RETRY, child_routes=(("crm", "line"),)),
        Route("crm", "line", [lambda exchange: None]),
    )
    order = await send(engine, "order", "O-1")
    assert state(engine, order) is S.OK
    children = engine.store.children_of(order)
    assert [(c.correlation_id, c.object_id, c.entity_type) for c in children] == [
        ("O-1:1", "L-1", "line"), ("O-1:2", None, None)]
    for operation in ("bad", "worse"):
        refused = await send(engine, operation, operation)
        message = engine.store.get(refused)
        assert message is not None and message.state is S.PARTLY_FAILED
        assert message.last_error_code == ("ConfigurationError" if operation == "bad" else "TypeError")
        assert engine.store.children_of(refused) == []


async def test_bad_ext_calls_are_technical_errors_of_the_attempt(run: Any) -> None:
    async def bad_scope(exchange: Exchange) -> None:
        await exchange.ext_call("k", print, scope="world")  # type: ignore[arg-type]

    async def bad_key(exchange: Exchange) -> None:
        await exchange.ext_call("", print, scope="entity")

    engine = await run(Route("crm", "scope", [bad_scope], retry_policy=RETRY),
                       Route("crm", "key", [bad_key], retry_policy=RETRY))
    for operation, text in (("scope", "scope must be"), ("key", "call key must be")):
        message = engine.store.get(await send(engine, operation, operation, object_id="C-1"))
        assert message is not None and message.state is S.PARTLY_FAILED
        assert message.last_error_code == "ValueError" and text in (message.last_error_text or "")


@pytest.mark.parametrize(
    ("options", "reason"),
    [
        ({"ext_call_scope": "world"}, "ext_call_scope must be"),
        ({"business_exceptions": ("KeyError",)}, "business_exceptions must be exception classes"),
        ({"child_routes": (("crm",),)}, "child_routes must be"),
        ({"child_routes": (("crm", ""),)}, "child_routes must be"),
        ({"interceptors": (object(),)}, "is not a MessageInterceptor"),
        ({"interceptors": "audit"}, "interceptors must be a sequence"),
    ],
)
def test_bad_pattern_options_are_configuration_errors(options: dict[str, Any], reason: str) -> None:
    with pytest.raises(ConfigurationError, match=reason):
        Route("crm", "o", [print], **options)


def test_a_child_message_needs_text_and_an_operation() -> None:
    with pytest.raises(TypeError, match="must be text"):
        ChildMessage(b"{}", "line")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="needs an operation"):
        ChildMessage("{}", "")
