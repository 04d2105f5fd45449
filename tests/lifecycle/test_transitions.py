"""Every state change writes exactly its ``message_transition`` row, in the transaction of the change.

Each lifecycle path (accept, claim, OK, PARTLY_FAILED, FAILED, POSTPONED, SKIPPED, CANCEL, restart, repair,
children) on each real database: the rows are compared whole (from, to, attempt, error code, cause, node).
"""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest
import sqlalchemy as sa
from openroute.persistence import MessageState, MessageStore, NewMessage, NodeState, StoredMessage
from openroute.persistence.models import message_transition_table

from openroute import ChildMessage, Exchange, Route
from openroute.definitions.clock import ManualClock
from openroute.definitions.errors import BusinessError, StaleMessageError, TechnicalError
from openroute.definitions.retry import RetryPolicy
from openroute.dsl import Application, route
from openroute.engine import Engine, states
from openroute.testing import RouteTestKit
from tests.lifecycle.conftest import START, EngineFactory, inbound

S = MessageState
WAIT = 20.0
ONE_MINUTE = timedelta(minutes=1)


def _path(store: MessageStore, message_id: int) -> list[tuple[Any, ...]]:
    return [
        (t["from_state"], t["to_state"], t["attempt"], t["error_code"], t["cause"], t["node_id"])
        for t in store.transitions.of(message_id)
    ]


def _route(*steps: Any, **extra: Any) -> Route:
    return Route("orders", "create", list(steps), **extra)


def _all_rows(store: MessageStore) -> int:
    with store.engine.connect() as connection:
        return connection.execute(sa.select(sa.func.count()).select_from(message_transition_table)).scalar_one()


async def test_accept_claim_ok(store: MessageStore, make_engine: EngineFactory) -> None:
    engine = make_engine(_route(lambda ex: None))
    await engine.start()
    sent = await engine.accept(inbound())
    await engine.accept(inbound())  # a duplicate is answered, not stored: no row
    await engine.wait_idle(WAIT)
    assert _path(store, sent.message_id) == [
        (None, S.NEW, 1, None, "engine", "node-1"),
        (S.NEW, S.PROCESSING, 1, None, "engine", "node-1"),
        (S.PROCESSING, S.OK, 1, None, "engine", "node-1"),
    ]
    assert [t["at"] for t in store.transitions.of(sent.message_id)] == [START] * 3
    assert _all_rows(store) == 3


async def test_partly_failed_then_failed_then_admin_restart_then_ok(
    store: MessageStore, make_engine: EngineFactory, clock: ManualClock
) -> None:
    down = {"on": True}

    def step(_exchange: Exchange) -> None:
        if down["on"]:
            raise TechnicalError("MNO down", code="MNO_DOWN")

    engine = make_engine(_route(step, retry_policy=RetryPolicy(max_attempts=2, interval=ONE_MINUTE)))
    await engine.start()
    sent = await engine.accept(inbound())
    await engine.wait_idle(WAIT)
    clock.advance(ONE_MINUTE)
    await engine.repoll_once()
    await engine.wait_idle(WAIT)
    assert store.get(sent.message_id).state is S.FAILED
    down["on"] = False
    await engine.restart(sent.message_id, cause="admin:ann")
    await engine.wait_idle(WAIT)
    assert _path(store, sent.message_id) == [
        (None, S.NEW, 1, None, "engine", "node-1"),
        (S.NEW, S.PROCESSING, 1, None, "engine", "node-1"),
        # a failed attempt is numbered as the attempt that failed (the log says the same, issue 26)
        (S.PROCESSING, S.PARTLY_FAILED, 1, "MNO_DOWN", "engine", "node-1"),
        (S.PARTLY_FAILED, S.PROCESSING, 2, None, "engine", "node-1"),
        (S.PROCESSING, S.FAILED, 2, "MNO_DOWN", "engine", "node-1"),
        (S.FAILED, S.PARTLY_FAILED, 1, None, "admin:ann", "node-1"),
        (S.PARTLY_FAILED, S.PROCESSING, 1, None, "engine", "node-1"),
        (S.PROCESSING, S.OK, 1, None, "engine", "node-1"),
    ]


async def test_business_error_fails_at_once(store: MessageStore, make_engine: EngineFactory) -> None:
    def step(_exchange: Exchange) -> None:
        raise BusinessError("BLOCKED", "customer is blocked")

    engine = make_engine(_route(step))
    await engine.start()
    sent = await engine.accept(inbound())
    await engine.wait_idle(WAIT)
    assert _path(store, sent.message_id)[-1] == (S.PROCESSING, S.FAILED, 1, "BLOCKED", "engine", "node-1")
    assert len(_path(store, sent.message_id)) == 3


async def test_postponed_then_cancelled_by_an_operator(store: MessageStore, make_engine: EngineFactory) -> None:
    engine = make_engine(_route(lambda ex: ex.postpone(timedelta(minutes=5))))
    await engine.start()
    sent = await engine.accept(inbound())
    await engine.wait_idle(WAIT)
    await engine.cancel(sent.message_id, cause="admin:bob")
    assert _path(store, sent.message_id) == [
        (None, S.NEW, 1, None, "engine", "node-1"),
        (S.NEW, S.PROCESSING, 1, None, "engine", "node-1"),
        (S.PROCESSING, S.POSTPONED, 1, None, "engine", "node-1"),
        (S.POSTPONED, S.CANCEL, 1, "CANCELLED", "admin:bob", "node-1"),
    ]


async def _started_beside_a_dead_node(
    store: MessageStore, make_engine: EngineFactory, clock: ManualClock
) -> tuple[Engine, StoredMessage]:
    """A started engine (lease 5 min) and a message that the node ``dead-node`` claimed and never finished."""
    engine = make_engine(_route(lambda ex: None), processing_lease=timedelta(minutes=5))
    message = store.insert_message(
        NewMessage("orders", "create", "{}", "application/json", "c-dead", "crm", receive_ts=START), node_id="dead-node"
    ).message
    states.claim(store, [message], "dead-node", clock.now())
    await engine.start()
    return engine, message


async def test_repair_of_a_dead_node_is_recorded_as_repair(
    store: MessageStore, make_engine: EngineFactory, clock: ManualClock
) -> None:
    engine, message = await _started_beside_a_dead_node(store, make_engine, clock)
    clock.advance(timedelta(minutes=5))
    await engine.repoll_once()
    await engine.wait_idle(WAIT)
    assert _path(store, message.id) == [
        (None, S.NEW, 1, None, "engine", "dead-node"),
        (S.NEW, S.PROCESSING, 1, None, "engine", "dead-node"),
        (S.PROCESSING, S.PARTLY_FAILED, 1, "PROCESSING_ABANDONED", "repair", "node-1"),
        (S.PARTLY_FAILED, S.PROCESSING, 2, None, "engine", "node-1"),
        (S.PROCESSING, S.OK, 2, None, "engine", "node-1"),
    ]


async def test_a_stopped_node_repairs_no_stuck_message_until_it_runs_again(
    store: MessageStore, make_engine: EngineFactory, clock: ManualClock
) -> None:
    engine, message = await _started_beside_a_dead_node(store, make_engine, clock)
    await engine.set_node_state(engine.node_id, NodeState.STOPPED)
    clock.advance(timedelta(minutes=5))
    await engine.repoll_once()
    assert store.get(message.id).state is S.PROCESSING  # "STOPPED: pick up no work", a repair included
    await engine.set_node_state(engine.node_id, NodeState.RUN)
    await engine.repoll_once()
    await engine.wait_idle(WAIT)
    assert store.get(message.id).state is S.OK


async def test_lost_or_illegal_transition_writes_no_row(store: MessageStore, clock: ManualClock) -> None:
    message = store.insert_message(
        NewMessage("orders", "create", "{}", "application/json", "c-1", "crm", receive_ts=START)
    ).message
    [claimed] = states.claim(store, [message], "n1", clock.now())
    assert states.claim(store, [message], "n2", clock.now()) == []  # lost the race: nothing recorded
    with pytest.raises(StaleMessageError):
        states.transition(store, message, S.CANCEL, clock.now())
    done = states.transition(store, claimed, S.OK, clock.now(), cause="reprocess:job-1")
    assert done.state is S.OK
    assert _path(store, message.id) == [
        (None, S.NEW, 1, None, "engine", None),
        (S.NEW, S.PROCESSING, 1, None, "engine", "n1"),
        (S.PROCESSING, S.OK, 1, None, "reprocess:job-1", "n1"),
    ]


async def test_a_grouped_batch_writes_one_row_per_change(store: MessageStore, make_engine: EngineFactory) -> None:
    engine = make_engine(_route(lambda ex: None), write_batch=64)
    await engine.start()
    sent = [await engine.accept(inbound(f"c-{n}")) for n in range(40)]
    await engine.wait_idle(WAIT)
    for result in sent:
        assert [row[:2] for row in _path(store, result.message_id)] == [
            (None, S.NEW), (S.NEW, S.PROCESSING), (S.PROCESSING, S.OK)
        ]
    assert _all_rows(store) == 120


async def test_obsolete_skip_and_split_children(database_url: str, route_test_kit: Any) -> None:
    def lines(exchange: Exchange) -> list[ChildMessage]:
        order = json.loads(exchange.payload)
        return [ChildMessage(payload=json.dumps(line), operation="createOrderLine", key=str(line["no"]))
                for line in order["lines"]]

    def customer(exchange: Exchange) -> None:
        if exchange.message.correlation_id == "MSG1" and exchange.message.failed_count == 0:
            raise TechnicalError("MNO down", code="MNO_DOWN")

    app = Application(
        route("crm", "setCustomer").json().object_id(json="$.customer").entity_type("customer")
        .obsolete_check().retry(max_attempts=5, interval=ONE_MINUTE).process(customer),
        route("shop", "createOrder").json().split(lines, into="createOrderLine"),
        route("shop", "createOrderLine").json().process(lambda ex: None),
    )
    kit: RouteTestKit = await route_test_kit(app, database_url=database_url)
    older = await kit.send_json("crm", "setCustomer", {"customer": "C-1"}, correlation_id="MSG1")
    await kit.settle()
    kit.clock.advance(timedelta(seconds=1))
    newer = await kit.send_json("crm", "setCustomer", {"customer": "C-1"}, correlation_id="MSG2")
    await kit.settle()
    await kit.advance(ONE_MINUTE)
    kit.assert_state(older.message_id, S.SKIPPED)
    store = kit.engine.store
    assert [row[:4] for row in _path(store, older.message_id)] == [
        (None, S.NEW, 1, None),
        (S.NEW, S.PROCESSING, 1, None),
        (S.PROCESSING, S.PARTLY_FAILED, 1, "MNO_DOWN"),
        (S.PARTLY_FAILED, S.PROCESSING, 2, None),
        (S.PROCESSING, S.SKIPPED, 2, "OBSOLETE"),
    ]
    assert [row[1] for row in _path(store, newer.message_id)] == [S.NEW, S.PROCESSING, S.OK]

    order = await kit.send_json("shop", "createOrder", {"lines": [{"no": 1}, {"no": 2}]}, correlation_id="O-1")
    await kit.settle()
    kit.assert_state(order.message_id, S.OK)
    assert [row[:2] for row in _path(store, order.message_id)] == [
        (None, S.NEW), (S.NEW, S.PROCESSING), (S.PROCESSING, S.WAITING_FOR_CHILDREN), (S.WAITING_FOR_CHILDREN, S.OK)
    ]
    for child in kit.children(order.message_id):
        assert [row[:2] for row in _path(store, child.id)] == [
            (None, S.NEW), (S.NEW, S.PROCESSING), (S.PROCESSING, S.OK)
        ]
