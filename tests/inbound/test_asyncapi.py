"""openroute/inbound/asyncapi.py: the AsyncAPI 3.0 document of the channel-fed routes, generated from the routes and
their channels' configuration, valid against the official AsyncAPI 3.0.0 JSON Schema, served at /api/asyncapi.json.

The schema is ``schemas/3.0.0.json`` of the npm package ``@asyncapi/specs`` 6.11.1 (Apache-2.0), the one the
AsyncAPI parser validates with, kept in ``tests/inbound/schemas/asyncapi-3.0.0.json`` (the tests run offline);
``jsonschema`` validates with it. Beyond the schema, the tests check the rules the parser adds: every ``$ref``
resolves inside the document and an operation's messages are messages of its channel.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import pytest
from openroute.persistence import MessageStore
from pydantic import BaseModel, Field

from openroute import Application, Engine, EngineSettings, route
from openroute.inbound.asyncapi import channel_asyncapi
from openroute.inbound.channel import ChannelInbound
from openroute.server import create_app
from tests._support.servers import served

SCHEMA = Path(__file__).parent / "schemas" / "asyncapi-3.0.0.json"


class Line(BaseModel):
    """One order line."""

    sku: str = Field(pattern=r"^[A-Z0-9-]+$")
    quantity: int = Field(gt=0)


class Order(BaseModel):
    """An order."""

    orderId: str
    lines: list[Line]
    note: str | None = None


def application() -> Application:
    return Application(
        route("shop", "createOrder").from_channel("orders-in").json().body(Order).process(lambda exchange: None),
        route("shop", "note").from_channel("notes-in").require(json="$.note.id").process(lambda exchange: None),
        route("shop", "cancelOrder").soap("{urn:shop}cancelOrder").json().from_channel("cancel-in")
        .process(lambda exchange: None),
        route("shop", "archive").soap("{urn:shop}archive").from_channel("archive-in").process(lambda exchange: None),
        route("shop", "test").from_channel("test-in").process(lambda exchange: None),
    )


CONFIG = {
    "openroute.messaging.connector.amqp.url": "amqp://shop-user:s3cret-pw@broker.example:5673/shop",
    "openroute.messaging.incoming.orders-in.connector": "amqp",
    "openroute.messaging.incoming.orders-in.queue": "shop.orders",
    "openroute.messaging.incoming.orders-in.source-system": "WEBSHOP",
    "openroute.messaging.incoming.orders-in.dead-letter-channel": "shop-dead",
    "openroute.messaging.incoming.notes-in.connector": "amqp",
    "openroute.messaging.incoming.notes-in.queue": "shop.notes",
    "openroute.messaging.incoming.notes-in.exchange": "shop-events",
    "openroute.messaging.incoming.notes-in.routing-keys": "note.created, note.changed",
    "openroute.messaging.incoming.notes-in.correlation-header": "x-note-id",
    "openroute.messaging.incoming.notes-in.dead-letter-channel": "shop-dead",
    "openroute.messaging.incoming.cancel-in.connector": "amqp",
    "openroute.messaging.incoming.cancel-in.queue": "shop.cancel",
    "openroute.messaging.incoming.cancel-in.source-system": "WEBSHOP",
    "openroute.messaging.incoming.archive-in.connector": "in-memory",
    "openroute.messaging.incoming.archive-in.source-system": "WEBSHOP",
    "openroute.messaging.incoming.test-in.connector": "in-memory",
    "openroute.messaging.incoming.test-in.source-system": "TESTS",
    "openroute.messaging.outgoing.shop-dead.connector": "amqp",
    "openroute.messaging.outgoing.shop-dead.queue": "shop.dead",
}


@functools.cache
def validator() -> jsonschema.protocols.Validator:
    schema = json.loads(SCHEMA.read_text())
    return jsonschema.Draft7Validator(schema)


def problems(document: dict[str, Any]) -> list[str]:
    """What the official schema and the parser's rules find wrong in ``document`` (none: it is valid)."""
    found = [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator().iter_errors(document)]
    for ref in refs(document):
        try:
            resolve(document, ref)
        except KeyError:
            found.append(f"$ref {ref} does not resolve")
    for name, operation in document.get("operations", {}).items():
        channel = operation["channel"]["$ref"]
        for message in operation.get("messages", []):
            if not message["$ref"].startswith(f"{channel}/messages/"):
                found.append(f"operation {name}: message {message['$ref']} is not a message of {channel}")
    return found


def refs(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "$ref" and isinstance(value, str):
                yield value
            else:
                yield from refs(value)
    elif isinstance(node, list):
        for item in node:
            yield from refs(item)


def resolve(document: dict[str, Any], ref: str) -> Any:
    assert ref.startswith("#/"), ref
    node: Any = document
    for part in ref[2:].split("/"):
        node = node[part.replace("~1", "/").replace("~0", "~")]
    return node


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[Engine]:
    store = MessageStore(f"sqlite:///{tmp_path / 'asyncapi.db'}")
    store.create_schema()
    yield Engine(store, application().routes, EngineSettings(repoll_interval=None))
    store.dispose()


def document_of(engine: Engine) -> dict[str, Any]:
    channels = ChannelInbound(engine, application().channels, CONFIG, environ={})
    return channel_asyncapi(channels.described(), engine.routes)


def test_the_document_is_valid_asyncapi_3(engine: Engine) -> None:
    document = document_of(engine)
    assert problems(document) == []
    assert document["asyncapi"] == "3.0.0"
    assert set(document["channels"]) == {"orders-in", "notes-in", "cancel-in", "archive-in", "test-in", "shop-dead"}
    assert set(document["operations"]) == {"receive.orders-in", "receive.notes-in", "receive.cancel-in",
                                           "receive.archive-in", "receive.test-in", "deadLetter.shop-dead"}


def test_the_checks_find_what_is_wrong(engine: Engine) -> None:
    """The validation can fail: each of these breaks the document."""
    document = document_of(engine)
    no_info = {k: v for k, v in document.items() if k != "info"}
    assert any("'info' is a required property" in p for p in problems(no_info))
    wrong_binding = json.loads(json.dumps(document))
    wrong_binding["channels"]["orders-in"]["bindings"]["amqp"]["exchange"] = {"name": "x"}  # queue and exchange
    assert problems(wrong_binding)
    dangling = json.loads(json.dumps(document))
    dangling["operations"]["receive.orders-in"]["messages"] = [{"$ref": "#/channels/notes-in/messages/note"}]
    assert problems(dangling) == ["operation receive.orders-in: message #/channels/notes-in/messages/note is not a "
                                  "message of #/channels/orders-in"]
    dangling["operations"]["receive.orders-in"]["channel"] = {"$ref": "#/channels/nowhere"}
    assert "$ref #/channels/nowhere does not resolve" in problems(dangling)


def test_a_typed_route_has_its_models_schema_and_the_queue_its_binding(engine: Engine) -> None:
    document = document_of(engine)
    channel = document["channels"]["orders-in"]
    assert channel["address"] == "shop.orders" and channel["summary"] == "feeds route shop/createOrder"
    assert channel["bindings"]["amqp"] == {"is": "queue", "bindingVersion": "0.3.0", "queue": {
        "name": "shop.orders", "durable": True, "exclusive": False, "autoDelete": False, "vhost": "/shop"}}
    message = channel["messages"]["createOrder"]
    assert message["contentType"] == "application/json"
    assert message["payload"] == {"$ref": "#/components/schemas/Order"}
    schemas = document["components"]["schemas"]
    assert schemas["Order"]["required"] == ["orderId", "lines"]
    assert schemas["Order"]["properties"]["lines"]["items"] == {"$ref": "#/components/schemas/Line"}
    assert schemas["Line"]["properties"]["sku"]["pattern"] == "^[A-Z0-9-]+$"
    headers = message["headers"]
    assert "required" not in headers  # the channel names its source system: the header is optional
    assert "WEBSHOP" in headers["properties"]["x-source-system"]["description"]
    assert "AMQP message_id" in message["description"] and "correlationId" not in message
    assert "goes to the dead-letter channel shop-dead" in message["description"]
    receive = document["operations"]["receive.orders-in"]
    assert receive["action"] == "receive" and receive["channel"] == {"$ref": "#/channels/orders-in"}
    assert receive["messages"] == [{"$ref": "#/channels/orders-in/messages/createOrder"}]
    assert receive["bindings"] == {"amqp": {"ack": True, "bindingVersion": "0.3.0"}}


def test_an_exchange_bound_channel_a_correlation_header_xml_and_in_memory(engine: Engine) -> None:
    document = document_of(engine)
    notes = document["channels"]["notes-in"]
    assert notes["address"] is None  # two routing keys are no single address
    assert notes["bindings"]["amqp"]["is"] == "routingKey"
    assert notes["bindings"]["amqp"]["exchange"] == {"name": "shop-events", "type": "topic", "durable": True,
                                                     "autoDelete": False, "vhost": "/shop"}
    assert "note.created, note.changed" in notes["description"] and "shop.notes" in notes["description"]
    note = notes["messages"]["note"]
    assert note["correlationId"] == {"location": "$message.header#/x-note-id"}
    assert note["headers"]["required"] == ["x-source-system", "x-note-id"]
    assert note["payload"]["type"] == "object" and "Required: $.note.id." in note["description"]
    # a route that takes both: a JSON and an XML message on its channel, both received
    cancel = document["channels"]["cancel-in"]["messages"]
    assert {name: m["contentType"] for name, m in cancel.items()} == {"cancelOrder": "application/json",
                                                                      "cancelOrder.xml": "application/xml"}
    assert "{urn:shop}cancelOrder" in cancel["cancelOrder.xml"]["payload"]["description"]
    assert "rejected without requeue" in cancel["cancelOrder"]["description"]  # its channel has no dead-letter one
    assert len(document["operations"]["receive.cancel-in"]["messages"]) == 2
    archive = document["channels"]["archive-in"]["messages"]  # XML only
    assert list(archive) == ["archive"] and archive["archive"]["contentType"] == "application/xml"
    memory = document["channels"]["test-in"]
    assert memory["address"] == "test-in" and "bindings" not in memory
    assert memory["servers"] == [{"$ref": "#/servers/in-memory"}]
    assert "bindings" not in document["operations"]["receive.test-in"]


def test_the_dead_letter_channel_and_the_broker_without_its_credentials(engine: Engine) -> None:
    document = document_of(engine)
    dead = document["channels"]["shop-dead"]
    assert dead["address"] == "shop.dead"
    assert set(dead["messages"]["deadLetter"]["headers"]["required"]) == {
        "x-openroute-reason", "x-openroute-error", "x-openroute-channel"}
    assert document["operations"]["deadLetter.shop-dead"]["action"] == "send"
    assert document["servers"]["amqp"] == {
        "host": "broker.example:5673", "protocol": "amqp", "protocolVersion": "0.9.1", "pathname": "/shop",
        "description": "RabbitMQ (AMQP 0-9-1); the path is the virtual host"}
    text = json.dumps(document)
    assert "s3cret-pw" not in text and "shop-user" not in text


async def test_served_beside_the_openapi_without_authentication(engine: Engine) -> None:
    from openroute.inbound import AdminAuth, AdminUser

    channels = ChannelInbound(engine, application().channels, CONFIG, environ={})
    app = create_app(engine, channels=channels, manage_engine=False,
                     admin_auth=AdminAuth([AdminUser("ops", "ops-secret")]))
    async with served(app) as url, httpx.AsyncClient(base_url=url) as client:
        answer = await client.get("/api/asyncapi.json")
        assert answer.status_code == 200 and answer.headers["content-type"] == "application/json"
        assert answer.json() == json.loads(json.dumps(document_of(engine)))
        assert problems(answer.json()) == []
        assert (await client.get("/api/openapi.json")).status_code == 200
    # a node without channels serves a document without channels
    bare = create_app(engine, manage_engine=False)
    async with served(bare) as url, httpx.AsyncClient(base_url=url) as client:
        empty = (await client.get("/api/asyncapi.json")).json()
        assert empty["channels"] == {} and empty["operations"] == {} and problems(empty) == []
