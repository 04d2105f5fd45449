"""A route fed by an in-memory channel: persist then ack, duplicates, dead letters, a store that is down."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
import sqlalchemy as sa
from openroute.persistence import MessageStore
from pydantic import BaseModel, Field

from openroute import route
from openroute.definitions.body import Body
from openroute.definitions.errors import DeploymentError, ValidationError
from openroute.dsl import Application
from openroute.engine import Engine, EngineSettings
from openroute.inbound.channel import CODE_HEADER, REASON_HEADER, ChannelDelivery, ChannelInbound
from openroute.messaging import Message, RedeliverError
from openroute.messaging.amqp import AmqpOutgoingMetadata


def application() -> Application:
    return Application(
        route("crm", "setCustomer").from_channel("crm-in").require(json="$.customer.id")
        .object_id(json="$.customer.id").process(lambda exchange: None)
    )


CONFIG = {
    "openroute.messaging.incoming.crm-in.connector": "in-memory",
    "openroute.messaging.incoming.crm-in.source-system": "CRM",
    "openroute.messaging.incoming.crm-in.dead-letter-channel": "crm-dlq",
    "openroute.messaging.outgoing.crm-dlq.connector": "in-memory",
}


@pytest.fixture
async def node(sqlite_url: str) -> AsyncIterator[tuple[Engine, ChannelInbound]]:
    store = MessageStore(sqlite_url)
    store.create_schema()
    app = application()
    engine = Engine(store, app.routes, EngineSettings(repoll_interval=None))
    await engine.start()
    inbound = ChannelInbound(engine, app.channels, CONFIG, environ={})
    await inbound.start()
    try:
        yield engine, inbound
    finally:
        await inbound.stop()
        await engine.stop()
        store.dispose()


def send(inbound: ChannelInbound, body: Any, message_id: str | None, **headers: str) -> Any:
    meta = ChannelDelivery(headers=headers, message_id=message_id, content_type="application/json")
    return inbound.app.connector("in-memory").source("crm-in").send(Message(body, (meta,)))


def rows(engine: Engine) -> list[Any]:
    with engine.store.engine.connect() as connection:
        return list(connection.execute(sa.text(
            "SELECT correlation_id, source_system, object_id, state FROM message ORDER BY id")))


async def test_a_delivery_is_stored_new_with_the_route_extraction_then_acked(node: Any) -> None:
    engine, inbound = node
    await asyncio.wait_for(send(inbound, json.dumps({"customer": {"id": "C1"}}), "m-1"), 10)
    stored = rows(engine)
    assert [(r.correlation_id, r.source_system, r.object_id) for r in stored] == [("m-1", "CRM", "C1")]
    assert inbound.stats("crm-in").accepted == 1
    assert inbound.health() == {"crm-in": "connected"}


async def test_a_duplicate_is_acked_without_a_second_row(node: Any) -> None:
    engine, inbound = node
    body = json.dumps({"customer": {"id": "C1"}})
    await asyncio.wait_for(send(inbound, body, "m-1"), 10)
    await asyncio.wait_for(send(inbound, body, "m-1"), 10)
    await asyncio.wait_for(send(inbound, body, "m-1", **{"x-source-system": "ERP"}), 10)  # another system's id
    assert [(r.correlation_id, r.source_system) for r in rows(engine)] == [("m-1", "CRM"), ("m-1", "ERP")]
    assert inbound.stats("crm-in").duplicates == 1


@pytest.mark.parametrize(("body", "message_id", "code", "reason"), [
    ("{not json", "m-1", "MALFORMED_PAYLOAD", "malformed JSON"),
    (json.dumps({"customer": {}}), "m-2", "VALIDATION_ERROR", "required $.customer.id"),
    (json.dumps({"customer": {"id": "C1"}}), None, "VALIDATION_ERROR", "correlation id is missing"),
    # issue 42: named what the route declares, not an element it never declared
    ("<a xmlns='urn:x'/>", "m-4", "MALFORMED_PAYLOAD",
     "route crm/setCustomer takes no XML body from a channel: it declares no SOAP request element"),
])
async def test_an_invalid_delivery_goes_to_the_dead_letter_channel_with_its_reason(
    node: Any, body: str, message_id: str | None, code: str, reason: str
) -> None:
    engine, inbound = node
    if body.startswith("<"):
        meta = ChannelDelivery(message_id=message_id, content_type="application/xml")
        outcome = inbound.app.connector("in-memory").source("crm-in").send(Message(body, (meta,)))
    else:
        outcome = send(inbound, body, message_id)
    await asyncio.wait_for(outcome, 10)  # acked: the dead-letter channel has it
    sink = inbound.app.connector("in-memory").sink("crm-dlq")
    [dead] = sink.received
    headers = dead.get_metadata(AmqpOutgoingMetadata).headers
    assert headers[CODE_HEADER] == code and reason in headers[REASON_HEADER]
    assert dead.payload == body.encode()
    assert rows(engine) == []


async def test_without_a_dead_letter_channel_an_invalid_delivery_is_rejected_and_counted(sqlite_url: str) -> None:
    """No dead-letter channel: the delivery is nacked without requeue (the queue's own dead-letter exchange, if any,
    gets it); the channel counts it as rejected, with the reason of the last one, and stores nothing."""
    store = MessageStore(sqlite_url)
    store.create_schema()
    app = application()
    engine = Engine(store, app.routes, EngineSettings(repoll_interval=None))
    config = {k: v for k, v in CONFIG.items() if "dead-letter" not in k and "crm-dlq" not in k}
    inbound = ChannelInbound(engine, app.channels, config, environ={})
    await engine.start()
    await inbound.start()
    try:
        with pytest.raises(ValidationError):
            await asyncio.wait_for(send(inbound, json.dumps({"customer": {}}), "bad-1"), 10)
        await asyncio.wait_for(send(inbound, json.dumps({"customer": {"id": "C1"}}), "m-1"), 10)
        stats = inbound.stats("crm-in")
        assert inbound.deliveries() == {"crm-in": {"accepted": 1, "duplicate": 0, "dead_lettered": 0, "rejected": 1,
                                                   "requeued": 0}}
        assert (stats.last_refused_code, stats.last_refused_reason) == (
            "VALIDATION_ERROR", "required $.customer.id is missing or empty")
        assert stats.last_refused_at is not None
        [report] = inbound.reports()
        assert (report.channel, report.service, report.operation, report.connector, report.dead_letter_channel,
                report.state) == ("crm-in", "crm", "setCustomer", "in-memory", None, "connected")
        assert [row[0] for row in rows(engine)] == ["m-1"]
    finally:
        await inbound.stop()
        await engine.stop()
        store.dispose()


async def test_a_store_that_fails_gives_the_delivery_back_and_pauses(node: Any, monkeypatch: Any) -> None:
    engine, inbound = node

    async def down(_inbound: Any) -> Any:
        raise sa.exc.OperationalError("INSERT", {}, ConnectionRefusedError("database is down"))

    monkeypatch.setattr(engine, "accept", down)
    source = inbound.app.connector("in-memory").source("crm-in")
    with pytest.raises(RedeliverError):
        await asyncio.wait_for(send(inbound, json.dumps({"customer": {"id": "C1"}}), "m-1"), 10)
    assert inbound.stats("crm-in").requeued == 1 and not source.acked
    monkeypatch.undo()
    await asyncio.wait_for(send(inbound, json.dumps({"customer": {"id": "C1"}}), "m-1"), 10)  # resumes by itself
    assert len(rows(engine)) == 1


async def test_a_channel_without_connector_is_a_deployment_error(sqlite_url: str) -> None:
    store = MessageStore(sqlite_url)
    store.create_schema()
    app = application()
    engine = Engine(store, app.routes, EngineSettings(repoll_interval=None))
    with pytest.raises(DeploymentError, match=r"crm-in.*has no connector"):
        ChannelInbound(engine, app.channels, {}, environ={})
    with pytest.raises(DeploymentError, match="requeue an invalid delivery forever"):
        ChannelInbound(engine, app.channels, {**CONFIG, "openroute.messaging.incoming.crm-in.failure-strategy":
                                              "requeue"}, environ={})
    store.dispose()


class Customer(BaseModel):
    id: str = Field(pattern=r"^C[0-9]+$")


class Order(BaseModel):
    customer: Customer
    total: int


async def test_a_typed_route_fed_by_a_channel_binds_the_parsed_document_once(
    sqlite_url: str, monkeypatch: Any
) -> None:
    """The delivery's document, parsed for the binding's checks, is bound to the route's model there: accept does not
    parse the text again (the attempt reads the stored text once, as for HTTP), the step reads the model; a body the
    model refuses goes to the dead-letter channel with its field errors and nothing is stored."""
    seen: list[Order] = []
    app = Application(
        route("shop", "order").from_channel("crm-in").body(Order).object_id(json="$.customer.id")
        .process(lambda exchange: seen.append(exchange.body_as(Order)))
    )
    store = MessageStore(sqlite_url)
    store.create_schema()
    engine = Engine(store, app.routes, EngineSettings(repoll_interval=None))
    await engine.start()
    inbound = ChannelInbound(engine, app.channels, CONFIG, environ={})
    await inbound.start()

    parsed: list[str] = []
    parse = Body.parse

    def counted(body: Body, text: str, content_type: str) -> Any:
        parsed.append(text)
        return parse(body, text, content_type)

    monkeypatch.setattr(Body, "parse", counted)
    try:
        await asyncio.wait_for(send(inbound, json.dumps({"customer": {"id": "C7"}, "total": 12}), "m-1"), 10)
        await asyncio.wait_for(send(inbound, json.dumps({"customer": {"id": "nobody"}, "total": "x"}), "m-2"), 10)
        deadline = asyncio.get_running_loop().time() + 10
        while not seen:
            assert asyncio.get_running_loop().time() < deadline, "the step did not run within 10 s"
            await asyncio.sleep(0.01)
    finally:
        await inbound.stop()
        await engine.stop()
        store.dispose()
    assert seen == [Order(customer=Customer(id="C7"), total=12)]
    assert len(parsed) == 1  # the attempt's own read of the stored text; accept bound the parsed document
    [dead] = inbound.app.connector("in-memory").sink("crm-dlq").received
    headers = dead.get_metadata(AmqpOutgoingMetadata).headers
    assert headers[CODE_HEADER] == "INVALID_BODY"
    assert "customer.id" in headers[REASON_HEADER] and "total" in headers[REASON_HEADER]
    assert [(r.correlation_id, r.object_id) for r in rows(engine)] == [("m-1", "C7")]


async def test_a_soap_only_route_fed_by_a_channel_refuses_json_naming_what_it_declares(sqlite_url: str) -> None:
    store = MessageStore(sqlite_url)
    store.create_schema()
    app = Application(route("crm", "setCustomer").from_channel("crm-in").soap("{urn:crm}setCustomerRequest")
                      .process(lambda exchange: None))
    engine = Engine(store, app.routes, EngineSettings(repoll_interval=None))
    await engine.start()
    inbound = ChannelInbound(engine, app.channels, CONFIG, environ={})
    await inbound.start()
    try:
        await asyncio.wait_for(send(inbound, json.dumps({"customer": {"id": "C1"}}), "m-1"), 10)
        xml = ChannelDelivery(message_id="m-2", content_type="application/xml")
        source = inbound.app.connector("in-memory").source("crm-in")
        await asyncio.wait_for(source.send(Message("<c:setCustomerRequest xmlns:c='urn:crm'/>", (xml,))), 10)
        [dead] = inbound.app.connector("in-memory").sink("crm-dlq").received
        reason = dead.get_metadata(AmqpOutgoingMetadata).headers[REASON_HEADER]
        assert "takes no JSON body from a channel: it declares its SOAP request (.soap(...)) and not .json()" in reason
        assert [r.correlation_id for r in rows(engine)] == ["m-2"]  # the XML body of its element is taken
    finally:
        await inbound.stop()
        await engine.stop()
        store.dispose()
