"""Outcome events through the outbox: written in the final state's transaction, published after the commit,
deleted only once confirmed, the same event id when published again."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import pytest
import sqlalchemy as sa
from openroute.persistence import MessageState, MessageStore
from openroute.persistence import outbox as outbox_sql

from openroute.definitions.errors import BusinessError, ConfigurationError
from openroute.definitions.message import InboundMessage
from openroute.definitions.route import Route, RouteRegistry
from openroute.engine import Engine, EngineSettings
from openroute.engine.outbox import EVENT_HEADER, OutboxPublisher, OutboxSettings, OutcomeEvents, outcome_rules
from openroute.messaging.amqp import AmqpOutgoingMetadata
from tests.tcp_proxy import proxy_to


def step(exchange: Any) -> None:
    kind = json.loads(exchange.payload)["kind"]
    if kind == "fail":
        raise BusinessError("REFUSED", "the customer is blocked")
    if kind == "retry":
        raise ConnectionError("billing is down")  # PARTLY_FAILED, retried a minute later


ROUTES = RouteRegistry([Route("crm", "setCustomer", [step]), Route("crm", "quiet", [step])])
MEMORY = {"openroute.messaging.outgoing.events.connector": "in-memory"}


def message(correlation_id: str, kind: str = "ok", operation: str = "setCustomer") -> InboundMessage:
    return InboundMessage(service="crm", operation=operation, payload=json.dumps({"kind": kind}),
                          content_type="application/json", correlation_id=correlation_id, source_system="CRM")


async def until(check: Any, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.02)


def outbox_rows(store: MessageStore) -> int:
    with store.engine.connect() as connection:
        return outbox_sql.pending_count(connection)


@pytest.fixture
async def node(store: MessageStore) -> AsyncIterator[tuple[Engine, OutboxPublisher]]:
    engine = Engine(store, ROUTES, EngineSettings(repoll_interval=None, node_id="node-1"))
    publisher = OutboxPublisher(store, [OutcomeEvents("events", routes=("crm/setCustomer",))], MEMORY,
                                node_id="node-1", settings=OutboxSettings(interval=0.05), environ={})
    engine.on_final_state_in_transaction(publisher.writer())
    engine.on_final_state(publisher.on_final_state)
    await engine.start()
    await publisher.start()
    stop = asyncio.Event()
    task = asyncio.create_task(publisher.run(stop))
    try:
        yield engine, publisher
    finally:
        stop.set()
        await task
        await publisher.stop()
        await engine.stop()


async def test_every_final_state_is_published_once_with_the_documented_body(node: Any) -> None:
    engine, publisher = node
    sink = publisher.app.connector("in-memory").sink("events")
    await engine.accept(message("c-ok"))
    await engine.accept(message("c-fail", "fail"))
    await engine.accept(message("c-other-route", operation="quiet"))  # not a published route
    await engine.wait_idle(10)
    await until(lambda: len(sink.received) == 2)
    stored = await engine.accept(message("c-cancel", "retry"))
    await engine.wait_idle(10)
    await engine.cancel(stored.message_id)  # a message made final by an operator is published too
    await engine.wait_idle(10)
    await until(lambda: len(sink.received) == 3)
    events = {json.loads(m.payload)["correlationId"]: json.loads(m.payload) for m in sink.received}
    assert set(events) == {"c-ok", "c-fail", "c-cancel"}
    assert events["c-ok"]["state"] == "OK" and events["c-ok"]["errorCode"] is None
    assert events["c-fail"]["state"] == "FAILED" and events["c-fail"]["errorCode"] == "REFUSED"
    assert set(events["c-ok"]) >= {"eventId", "messageId", "correlationId", "sourceSystem", "service", "operation",
                                   "state", "errorCode", "at"}
    for received in sink.received:
        metadata = received.get_metadata(AmqpOutgoingMetadata)
        assert metadata.message_id == json.loads(received.payload)["eventId"] == metadata.headers[EVENT_HEADER]
    await until(lambda: outbox_rows(engine.store) == 0)  # deleted once confirmed


async def test_a_rolled_back_final_state_leaves_no_event(node: Any) -> None:
    engine, publisher = node

    def refuse(stored: Any, _connection: Any) -> None:  # runs after the outbox hook, in the same transaction
        if stored.correlation_id == "c-rolled-back":
            raise RuntimeError("the transaction fails after the event row was written")

    engine.on_final_state_in_transaction(refuse)
    await engine.accept(message("c-rolled-back"))
    await engine.accept(message("c-ok"))
    await engine.wait_idle(10)
    sink = publisher.app.connector("in-memory").sink("events")
    await until(lambda: len(sink.received) == 1)
    await asyncio.sleep(0.2)  # a few more publishing rounds
    assert [json.loads(m.payload)["correlationId"] for m in sink.received] == ["c-ok"]
    with engine.store.engine.connect() as connection:
        states = dict(connection.execute(sa.text("SELECT correlation_id, state FROM message")).all())
    assert states["c-rolled-back"] != MessageState.OK.value  # the change itself was rolled back
    await until(lambda: outbox_rows(engine.store) == 0)


async def test_an_event_published_but_not_marked_is_published_again_with_the_same_event_id(
    node: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine, publisher = node
    publisher.settings = OutboxSettings(interval=0.05, lease=timedelta(milliseconds=200))
    sink = publisher.app.connector("in-memory").sink("events")
    delete = outbox_sql.delete_events
    calls = {"n": 0}

    def crash_once(connection: Any, ids: Any) -> int:  # the node dies between the broker's confirm and the delete
        calls["n"] += 1
        if calls["n"] == 1:
            raise ConnectionError("the database went away")
        return delete(connection, ids)

    monkeypatch.setattr("openroute.persistence.outbox.delete_events", crash_once)
    await engine.accept(message("c-1"))
    await engine.wait_idle(10)
    await until(lambda: len(sink.received) == 2)
    first, second = (json.loads(m.payload) for m in sink.received)
    assert first == second  # at least once: the same event, the same id
    await until(lambda: outbox_rows(engine.store) == 0)


async def test_the_configuration_names_the_channels_states_and_routes() -> None:
    rules = outcome_rules({
        "openroute.messaging.outgoing.events.connector": "amqp",
        "openroute.messaging.outgoing.events.outcome-events": "final",
        "openroute.messaging.outgoing.failures.connector": "amqp",
        "openroute.messaging.outgoing.failures.outcome-events": "FAILED, CANCEL",
        "openroute.messaging.outgoing.failures.outcome-routes": "crm/*",
        "openroute.messaging.outgoing.other.connector": "amqp",
    })
    assert [(r.channel, sorted(r.states), r.routes) for r in rules] == [
        ("events", ["CANCEL", "FAILED", "OK", "SKIPPED"], ()),
        ("failures", ["CANCEL", "FAILED"], ("crm/*",)),
    ]
    with pytest.raises(ConfigurationError, match="final states"):
        outcome_rules({"openroute.messaging.outgoing.e.connector": "amqp",
                       "openroute.messaging.outgoing.e.outcome-events": "PROCESSING"})


async def test_a_database_outage_keeps_the_events_and_rolls_back_the_changes_it_interrupted(
    postgres_store: MessageStore, postgres_url: str
) -> None:
    """A real outage (a TCP proxy in front of PostgreSQL, cut and restored): events committed before it stay in the
    outbox and are published once it is back; the final states it interrupted are rolled back with their events,
    and the messages, repaired and run again, are published once each."""
    gate = asyncio.Event()

    async def held_step(exchange: Any) -> None:
        if json.loads(exchange.payload)["kind"] == "held":
            await gate.wait()  # PROCESSING while the database goes away

    routes = RouteRegistry([Route("crm", "setCustomer", [held_step])])
    held: list[int] = []

    def held_states() -> set[str]:
        with postgres_store.engine.connect() as connection:
            return set(connection.execute(sa.text("SELECT state FROM message WHERE id IN :ids").bindparams(
                sa.bindparam("ids", expanding=True)), {"ids": held}).scalars())

    with proxy_to(postgres_url) as proxy:
        store = MessageStore(proxy.url(postgres_url))
        engine = Engine(store, routes, EngineSettings(repoll_interval=timedelta(seconds=0.2), node_id="outage-node"))
        publisher = OutboxPublisher(store, [OutcomeEvents("events")], MEMORY, node_id="outage-node",
                                    settings=OutboxSettings(interval=0.05), environ={})
        engine.on_final_state_in_transaction(publisher.writer())
        engine.on_final_state(publisher.on_final_state)
        sink = publisher.app.connector("in-memory").sink("events")
        await engine.start()
        await publisher.start()
        stop = asyncio.Event()
        task = None
        try:
            for number in range(10):
                await engine.accept(message(f"before-{number}"))
            for number in range(5):
                held.append((await engine.accept(message(f"held-{number}", "held"))).message_id)
            # their claims committed (a worker counts in in_flight before its claim's commit)
            await until(lambda: held_states() == {MessageState.PROCESSING.value} and outbox_rows(postgres_store) == 10)
            proxy.cut()
            task = asyncio.create_task(publisher.run(stop))  # the publisher starts during the outage
            gate.set()  # the held messages end OK, but their transactions fail with the connection
            await engine.wait_idle(10)
            await until(lambda: publisher.stats.failed_rounds >= 2)
            assert sink.received == []
            assert outbox_rows(postgres_store) == 10  # the interrupted final states left no event
            assert held_states() == {MessageState.PROCESSING.value}  # and were rolled back themselves
            proxy.restore()
            await until(lambda: len(sink.received) == 15 and outbox_rows(postgres_store) == 0, timeout=60)
        finally:
            stop.set()
            if task is not None:
                await task
            await publisher.stop()
            await engine.stop()
            store.dispose()
    events = [json.loads(m.payload) for m in sink.received]
    assert sorted(e["correlationId"] for e in events) == sorted(
        [f"before-{n}" for n in range(10)] + [f"held-{n}" for n in range(5)])  # each message once
    assert len({e["eventId"] for e in events}) == 15 and {e["state"] for e in events} == {"OK"}


async def test_only_the_configured_states_and_routes_are_published(store: MessageStore) -> None:
    engine = Engine(store, ROUTES, EngineSettings(repoll_interval=None, node_id="node-1"))
    config = {**MEMORY, "openroute.messaging.outgoing.events.outcome-events": "FAILED",
              "openroute.messaging.outgoing.events.outcome-routes": "crm/setCustomer"}
    publisher = OutboxPublisher(store, outcome_rules(config), config, node_id="node-1", environ={})
    engine.on_final_state_in_transaction(publisher.writer())
    await engine.start()
    await publisher.start()
    try:
        for correlation_id, kind, operation in (("ok", "ok", "setCustomer"), ("failed", "fail", "setCustomer"),
                                                ("other-route", "fail", "quiet")):
            await engine.accept(message(correlation_id, kind, operation))
        await engine.wait_idle(10)
        assert outbox_rows(store) == 1  # no row at all for what is not published
        assert await publisher.publish_once() == 1
    finally:
        await publisher.stop()
        await engine.stop()
    [event] = publisher.app.connector("in-memory").sink("events").payloads
    assert (json.loads(event)["correlationId"], json.loads(event)["state"]) == ("failed", "FAILED")
