"""The contract of the channel-fed routes: an AsyncAPI 3.0 document generated from the routes and their channels.

Served beside the OpenAPI document of the JSON endpoint, without authentication::

    GET /api/asyncapi.json       one receive operation per channel feeding a route; a send operation per
                                 dead-letter channel

Each channel is described from the same definitions the node serves: its name and connector settings
(``openroute.messaging.incoming.<channel>.*``: the queue, or the exchange and routing keys, with the AMQP channel
binding), the headers it reads (source system, correlation, process id, timestamp), and the message payload: the
JSON schema of the route's body model (``.body(Model)``, pydantic's ``model_json_schema``), any JSON object for an
untyped route, the request element for an XML route. The broker appears as a server by its host, port and virtual
host only (never its credentials).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit

from lxml import etree
from pydantic import BaseModel
from pydantic.json_schema import models_json_schema
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route as HttpRoute

from openroute.definitions.binding import ChannelBinding, InboundBinding
from openroute.definitions.route import RouteRegistry
from openroute.inbound.channel_options import ChannelOptions
from openroute.inbound.openapi import package_version
from openroute.messaging.config import ChannelConfig
from openroute.runtime import tracing

__all__ = ["AsyncApiContract", "DescribedChannel", "channel_asyncapi"]

#: the version of the AMQP bindings written (``bindingVersion``)
AMQP_BINDING = "0.3.0"
#: the exchange types the AMQP binding knows (another one is left out of the binding)
_EXCHANGE_TYPES = ("topic", "direct", "fanout", "default", "headers")
#: the characters a key of the document's maps may hold (AsyncAPI 3.0's component key pattern)
_KEY = re.compile(r"[^A-Za-z0-9._-]")


@dataclass(frozen=True)
class DescribedChannel:
    """One incoming channel feeding a route, as the node serves it: what the AsyncAPI document is made of.

    ``incoming`` and ``dead_letter`` are the resolved configurations (channel attributes over the connector's) of
    the channel and of its dead-letter channel; ``options`` its route-binding attributes (the header names).
    """

    binding: ChannelBinding
    incoming: ChannelConfig
    options: ChannelOptions
    dead_letter: ChannelConfig | None = None


def channel_asyncapi(channels: Sequence[DescribedChannel], routes: RouteRegistry) -> dict[str, Any]:
    """The AsyncAPI 3.0.0 document of ``channels`` (the routes' body models found in ``routes``).

    Raises :class:`~openroute.definitions.errors.UnknownRouteError` for a channel whose route is not in ``routes``."""
    document = _Document(routes)
    for described in sorted(channels, key=lambda c: c.binding.channel):
        document.add(described)
    return document.finished()


class _Document:
    """The document being written: servers by broker, channels, operations, the body models' schemas."""

    def __init__(self, routes: RouteRegistry) -> None:
        self.routes = routes
        self.servers: dict[str, dict[str, Any]] = {}
        self.channels: dict[str, dict[str, Any]] = {}
        self.operations: dict[str, dict[str, Any]] = {}
        self.models: list[type[BaseModel]] = []
        #: the dead-letter channels written, by channel name: (key, the channels refused into it)
        self.dead_letters: dict[str, tuple[str, list[str]]] = {}

    def key(self, taken: Mapping[str, Any], name: str) -> str:
        """``name`` as a key of a map of the document (AsyncAPI's key characters), unique in ``taken``."""
        key = _KEY.sub("_", name) or "_"
        candidate, n = key, 1
        while candidate in taken:
            n += 1
            candidate = f"{key}_{n}"
        return candidate

    def server(self, config: ChannelConfig) -> str:
        """The key of the server (broker) ``config`` is on, added when new."""
        if config.connector != "amqp":
            server = {"host": "in-process", "protocol": "in-memory",
                      "description": "the node's in-memory connector (tests and the demo): sent inside the process"}
        else:
            server = _amqp_server(config)
        for key, known in self.servers.items():
            if known == server:
                return key
        key = self.key(self.servers, server["protocol"] if server["protocol"] != "amqps" else "amqp")
        self.servers[key] = server
        return key

    def add(self, described: DescribedChannel) -> None:
        binding = described.binding
        route = self.routes.get(binding.service, binding.operation)
        model = route.body.json if route.body is not None else None
        if model is not None and model not in self.models:
            self.models.append(model)
        key = self.key(self.channels, binding.channel)
        messages: dict[str, Any] = {}
        name = self.key({}, binding.operation)
        if binding.json is not None or binding.xml is None:
            messages[name] = _message(described, binding.json, model, "json")
        if binding.xml is not None:
            messages[f"{name}.xml" if messages else name] = _message(described, binding.xml, None, "xml")
        address, bindings, where = _incoming_address(described.incoming)
        channel: dict[str, Any] = {
            "address": address,
            "title": binding.channel,
            "summary": f"feeds route {binding.service}/{binding.operation}",
            "description": f"Each delivery is checked like a request of the route and stored before it is acked "
                           f"(persist, then ack); a repeated correlation id is acked as a duplicate, stored once. "
                           f"{where}",
            "servers": [{"$ref": f"#/servers/{self.server(described.incoming)}"}],
            "messages": messages,
        }
        if bindings:
            channel["bindings"] = bindings
        self.channels[key] = channel
        operation: dict[str, Any] = {
            "action": "receive",
            "channel": {"$ref": f"#/channels/{key}"},
            "title": f"{binding.service}/{binding.operation} from {binding.channel}",
            "summary": f"the node takes the deliveries of {binding.channel} into route "
                       f"{binding.service}/{binding.operation}",
            "messages": [{"$ref": f"#/channels/{key}/messages/{name}"} for name in messages],
        }
        if described.incoming.connector == "amqp":
            operation["bindings"] = {"amqp": {"ack": True, "bindingVersion": AMQP_BINDING}}
        self.operations[self.key(self.operations, f"receive.{binding.channel}")] = operation
        if described.dead_letter is not None:
            self.add_dead_letter(described.dead_letter, binding.channel)

    def add_dead_letter(self, config: ChannelConfig, refused_from: str) -> None:
        """The dead-letter channel ``config`` (once, however many channels refuse into it) and its send operation."""
        name = config.channel
        if name in self.dead_letters:
            self.dead_letters[name][1].append(refused_from)
            return
        key = self.key(self.channels, name)
        sources: list[str] = [refused_from]
        self.dead_letters[name] = (key, sources)
        address, bindings = _outgoing_address(config)
        channel: dict[str, Any] = {
            "address": address,
            "title": name,
            "summary": "deliveries of channel-fed routes that can never be stored, with the reason",
            "servers": [{"$ref": f"#/servers/{self.server(config)}"}],
            "messages": {"deadLetter": _DEAD_LETTER},
        }
        if bindings:
            channel["bindings"] = bindings
        self.channels[key] = channel
        self.operations[self.key(self.operations, f"deadLetter.{name}")] = {
            "action": "send",
            "channel": {"$ref": f"#/channels/{key}"},
            "title": f"dead letters to {name}",
            "summary": "the node publishes a delivery it refused for good (malformed, invalid, no correlation id, "
                       "too large) here, then acks it",
            "messages": [{"$ref": f"#/channels/{key}/messages/deadLetter"}],
        }

    def finished(self) -> dict[str, Any]:
        refs, definitions = models_json_schema([(model, "validation") for model in self.models],
                                               ref_template="#/components/schemas/{model}")
        schemas: dict[str, Any] = dict(definitions.get("$defs", {}))
        for channel in self.channels.values():
            for message in channel["messages"].values():
                model = message.pop("_model", None)
                if model is not None:
                    message["payload"] = dict(refs[(model, "validation")])
        for _key, sources in self.dead_letters.values():
            sources.sort()
        document: dict[str, Any] = {
            "asyncapi": "3.0.0",
            "info": {"title": "openroute channel-fed routes", "version": package_version(),
                     "description": "The broker channels this node takes messages from, one route each, and the "
                                    "dead-letter channels it refuses deliveries into. The HTTP side is described by "
                                    "the OpenAPI document (`GET /api/openapi.json`) and the WSDL of each service."},
            "defaultContentType": "application/json",
            "servers": self.servers,
            "channels": self.channels,
            "operations": self.operations,
        }
        if schemas:
            document["components"] = {"schemas": schemas}
        return document


def _amqp_server(config: ChannelConfig) -> dict[str, Any]:
    """The broker of an AMQP channel by host, port and virtual host: its URL's user and password are left out."""
    from openroute.messaging.amqp import DEFAULT_URL

    url = urlsplit(config.get_str("url", DEFAULT_URL) or DEFAULT_URL)
    secure = url.scheme == "amqps"
    try:
        port = url.port or (5671 if secure else 5672)
    except ValueError:  # a malformed port: the connector refuses it at start; the document names the host only
        port = 5671 if secure else 5672
    host = url.hostname or "localhost"
    vhost = unquote(url.path[1:]) if len(url.path) > 1 else "/"
    return {"host": f"[{host}]:{port}" if ":" in host else f"{host}:{port}", "protocol": "amqps" if secure else "amqp",
            "protocolVersion": "0.9.1", "pathname": vhost if vhost.startswith("/") else f"/{vhost}",
            "description": "RabbitMQ (AMQP 0-9-1); the path is the virtual host"}


def _vhost(config: ChannelConfig) -> str:
    return str(_amqp_server(config)["pathname"]) if config.connector == "amqp" else "/"


def _incoming_address(config: ChannelConfig) -> tuple[str | None, dict[str, Any], str]:
    """(address, bindings, where to publish) of an incoming channel's queue, or its exchange and routing keys."""
    if config.connector != "amqp":
        return config.channel, {}, "In-memory: a program sends to it inside the node's process."
    queue = config.get_str("queue") or config.channel
    durable = config.get_bool("durable", True)
    exchange = config.get_str("exchange")
    if not exchange:
        binding = {"is": "queue", "queue": {"name": queue, "durable": durable, "exclusive": False,
                                            "autoDelete": config.get_bool("auto-delete", False),
                                            "vhost": _vhost(config)}}
        return queue, {"amqp": {**binding, "bindingVersion": AMQP_BINDING}}, (
            f"Publish to queue {queue} (the default exchange with routing key {queue}).")
    keys = [key.strip() for key in (config.get_str("routing-keys", "#") or "#").split(",") if key.strip()]
    described: dict[str, Any] = {"name": exchange, "durable": durable, "autoDelete": False, "vhost": _vhost(config)}
    kind = (config.get_str("exchange-type", "topic") or "topic").lower()
    if kind in _EXCHANGE_TYPES:
        described["type"] = kind
    address = keys[0] if len(keys) == 1 else None  # several keys are no one address: the description names them
    return address, {"amqp": {"is": "routingKey", "exchange": described, "bindingVersion": AMQP_BINDING}}, (
        f"Publish to exchange {exchange} ({kind}) with a routing key matching {', '.join(keys)}: the node binds "
        f"its queue {queue} to it with those keys.")


def _outgoing_address(config: ChannelConfig) -> tuple[str | None, dict[str, Any]]:
    """(address, bindings) of an outgoing channel: its routing key, on its exchange or the default one."""
    if config.connector != "amqp":
        return config.channel, {}
    queue = config.get_str("queue")
    routing_key = config.get_str("routing-key") or queue or config.channel
    exchange = config.get_str("exchange")
    if exchange:
        described: dict[str, Any] = {"name": exchange, "durable": config.get_bool("durable", True),
                                     "autoDelete": False, "vhost": _vhost(config)}
        kind = (config.get_str("exchange-type", "topic") or "topic").lower()
        if kind in _EXCHANGE_TYPES:
            described["type"] = kind
        return routing_key, {"amqp": {"is": "routingKey", "exchange": described, "bindingVersion": AMQP_BINDING}}
    return routing_key, {"amqp": {"is": "queue", "bindingVersion": AMQP_BINDING, "queue": {
        "name": routing_key, "durable": config.get_bool("durable", True), "exclusive": False,
        "autoDelete": config.get_bool("auto-delete", False), "vhost": _vhost(config)}}}


def _headers(described: DescribedChannel) -> dict[str, Any]:
    """The JSON schema of the headers the channel reads (AMQP strings or UTF-8 bytes: text)."""
    options = described.options
    source = {"type": "string", "maxLength": 100, "description": "the sending system"
              + (f" (default {options.source_system}: the channel's source-system)" if options.source_system
                 else "")}
    properties: dict[str, Any] = {options.source_system_header: source}
    required = [] if options.source_system else [options.source_system_header]
    if options.correlation_header is not None:
        properties[options.correlation_header] = {
            "type": "string", "maxLength": 255,
            "description": "the sender's id of the message: a repeated one from the same source system is stored "
                           "once (acked as a duplicate)"}
        required.append(options.correlation_header)
    properties[options.process_header] = {"type": "string", "maxLength": 255,
                                          "description": "the sender's business process"}
    properties[options.timestamp_header] = {"type": "string", "format": "date-time",
                                            "description": "when the sender created the message (ISO 8601 with a "
                                                           "time zone)"}
    properties[tracing.TRACEPARENT] = {"type": "string", "description": "W3C trace context (read when tracing is "
                                                                         "on)"}
    schema: dict[str, Any] = {"type": "object", "properties": properties}
    if required:
        schema["required"] = required
    return schema


def _message(described: DescribedChannel, inbound: InboundBinding | None, model: type[BaseModel] | None,
             kind: str) -> dict[str, Any]:
    """The message a channel takes in ``kind`` (json or xml); a body model's schema is filled in at the end."""
    binding = described.binding
    route = f"{binding.service}/{binding.operation}"
    checks = f" Required: {', '.join(inbound.required)}." if inbound is not None and inbound.required else ""
    header = described.options.correlation_header
    correlation = (f"The correlation id is the header {header}." if header
                   else "The correlation id is the AMQP message_id property (required).")
    refused = (f"goes to the dead-letter channel {described.dead_letter.channel} with the reason"
               if described.dead_letter is not None else
               "is rejected without requeue (to the queue's own dead-letter exchange, if it has one)")
    message: dict[str, Any] = {
        "name": binding.operation,
        "title": f"{route} ({kind.upper()})",
        "contentType": "application/json" if kind == "json" else "application/xml",
        "description": f"A message for route {route}, checked like a request to it: a delivery that fails the "
                       f"checks {refused}, never into the store. {correlation}{checks}",
        "headers": _headers(described),
    }
    if header is not None:
        message["correlationId"] = {"location": f"$message.header#/{header}"}
    if kind == "xml":
        element = inbound.request_element if inbound is not None else None
        name = etree.QName(element).text if element is not None else "the route's request element"
        message["payload"] = {"type": "string", "description": f"an XML document whose root is {name} (no SOAP "
                              f"envelope); its XML Schema is in the WSDL: GET /soap/{binding.service}?wsdl"}
    elif model is not None:
        message["_model"] = model  # replaced by the model's schema once every model is known
        message["description"] += f" Body: {model.__name__} (schema in components)."
    else:
        message["payload"] = {"type": "object", "description": "any JSON object (the route declares no body model)"}
    return message


#: what the node publishes to a dead-letter channel
_DEAD_LETTER: dict[str, Any] = {
    "name": "deadLetter",
    "title": "a delivery refused for good",
    "description": "The delivery's body as received (its content type and message id kept), with why it was "
                   "refused; it is acked on its own channel once this publish is confirmed.",
    "headers": {
        "type": "object",
        "required": ["x-openroute-reason", "x-openroute-error", "x-openroute-channel"],
        "properties": {
            "x-openroute-reason": {"type": "string", "description": "why, in one line (the field errors of a "
                                                                    "body model)"},
            "x-openroute-error": {"type": "string", "description": "the code an HTTP client would get, e.g. "
                                                                   "MALFORMED_PAYLOAD, VALIDATION_ERROR, INVALID_BODY"},
            "x-openroute-channel": {"type": "string", "description": "the channel the delivery came from"},
        },
    },
    "payload": {"description": "the body as received"},
}


class AsyncApiContract:
    """The HTTP route of the document: ``GET {prefix}/asyncapi.json`` (no authentication, like the OpenAPI).

    ``channels`` is called once, at the first request (the channels a node serves do not change while it runs);
    ``routes`` finds their body models."""

    def __init__(self, channels: Callable[[], Sequence[DescribedChannel]], routes: RouteRegistry, *,
                 prefix: str = "/api") -> None:
        self._channels = channels
        self._routes = routes
        self.prefix = prefix
        self._document: dict[str, Any] | None = None

    def document(self) -> dict[str, Any]:
        """The AsyncAPI document (made once)."""
        if self._document is None:
            self._document = channel_asyncapi(self._channels(), self._routes)
        return self._document

    def routes(self) -> list[HttpRoute]:
        """``GET {prefix}/asyncapi.json``."""
        return [HttpRoute(f"{self.prefix}/asyncapi.json", self.asyncapi, methods=["GET"])]

    async def asyncapi(self, _request: Request) -> Response:
        """``GET {prefix}/asyncapi.json``: the document."""
        return JSONResponse(self.document())
