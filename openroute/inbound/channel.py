"""Routes fed by broker channels: each delivery is checked and stored like an HTTP request, then acknowledged.

A route declares ``.from_channel("crm-in")`` (:class:`~openroute.definitions.binding.ChannelBinding`); the configuration
binds the channel to a connector of the messaging layer (``openroute.messaging.incoming.crm-in.connector = "amqp"``, or
``in-memory`` for tests and the demo). :class:`ChannelInbound` consumes those channels with manual
acknowledgment, in front of :meth:`Engine.accept <openroute.engine.Engine.accept>`:

* persist, then acknowledge: a delivery is acked only after the commit that stored it NEW (a duplicate, same
  source system + correlation id, is acked without a second row);
* a delivery that does not validate goes to the channel's ``dead-letter-channel`` with the reason in the
  ``x-openroute-reason`` header, and is acked once that publish is confirmed (without a dead-letter channel it is
  rejected without requeue: the queue's own dead-letter exchange, if any, gets it); never requeued forever;
* a store that fails (or a drained node) nacks the delivery for redelivery and pauses every channel of the node,
  with a growing back-off, until an accept succeeds again;
* the broker prefetch follows the engine's capacity: each channel runs at most ``queue_size + concurrency`` accepts
  at once (attribute ``concurrency`` overrides); :meth:`Engine.accept` stores and returns, a backlog waits in the store.

See docs/channels.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from lxml import etree

from openroute.auth.errors import BodyTooLargeError, MalformedPayloadError, status_and_code
from openroute.definitions.binding import ChannelBinding, ParsedPayload
from openroute.definitions.errors import ConfigurationError, DeploymentError, ValidationError
from openroute.definitions.message import InboundMessage
from openroute.definitions.route import Route
from openroute.engine import AcceptResult, Engine
from openroute.inbound.app import InboundSettings
from openroute.inbound.asyncapi import DescribedChannel
from openroute.inbound.channel_options import ChannelOptions
from openroute.inbound.deliveries import ChannelReport, ChannelStats, DeliveryOutcome
from openroute.inbound.parsing import checked_message, parse_json, parse_timestamp, parse_xml
from openroute.messaging import Acknowledgment, Emitter, Message, MessagingApp, MessagingConfig, OnOverflow
from openroute.messaging.amqp import AmqpIncomingMetadata, AmqpOutgoingMetadata, AmqpSource
from openroute.messaging.config import ChannelConfig, select_channels
from openroute.messaging.errors import RedeliverError
from openroute.runtime import tracing

__all__ = [
    "CODE_HEADER",
    "REASON_HEADER",
    "ChannelDelivery",
    "ChannelInbound",
    "ChannelOptions",
    "ChannelReport",
    "ChannelStats",
    "DeliveryOutcome",
]

log = logging.getLogger("openroute.inbound.channel")

#: headers of a dead-lettered delivery: why it was refused (one line) and the error code (as an HTTP answer has)
REASON_HEADER = "x-openroute-reason"
CODE_HEADER = "x-openroute-error"
#: the connector name ``in-memory`` (as the issue and docs spell it) is the messaging layer's ``memory`` connector
IN_MEMORY = "in-memory"


@dataclass(frozen=True)
class ChannelDelivery:
    """Metadata of a delivery from a connector without broker properties (the in-memory connector): its headers,
    message id and content type, as :class:`~openroute.messaging.amqp.AmqpIncomingMetadata` has them."""

    headers: Mapping[str, Any] = field(default_factory=dict, hash=False)
    message_id: str | None = None
    content_type: str | None = None
    correlation_id: str | None = None


@dataclass
class _Channel:
    binding: ChannelBinding
    options: ChannelOptions
    connector: str
    config: ChannelConfig
    #: the binding's route, resolved once here (the accept looks it up for each message: the channel does not)
    route: Route
    stats: ChannelStats = field(default_factory=ChannelStats)


class ChannelInbound:
    """The broker channels of ``channels`` in front of ``engine``, on connectors configured by ``config``
    (``openroute.messaging.*`` keys, or a :class:`MessagingConfig`).

    Every channel must be bound to a connector (``openroute.messaging.incoming.<channel>.connector``); a
    ``dead-letter-channel`` names an outgoing channel of the same configuration. Problems are one
    :class:`DeploymentError` listing them all, raised by the constructor (configuration) or :meth:`start`
    (connections).
    """

    # C901 over 12: checks every channel attribute of the configuration and reports all problems at once
    def __init__(  # noqa: C901
        self,
        engine: Engine,
        channels: Iterable[ChannelBinding],
        config: Mapping[str, Any] | MessagingConfig | None = None,
        *,
        settings: InboundSettings | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        self.engine = engine
        self.settings = settings or InboundSettings()
        bindings = list(channels)
        problems: list[str] = []
        for binding in bindings:
            if not isinstance(binding, ChannelBinding):
                raise ConfigurationError(f"expected a ChannelBinding, got {binding!r}")
        if isinstance(config, MessagingConfig):
            self.app = MessagingApp(config)
        else:
            # only this node's route channels and their dead-letter channels (the file may hold the outbox's too)
            given = dict(config or {})
            scope = MessagingConfig(given, environ={})
            dead = {str(scope.channel("incoming", b.channel).get("dead-letter-channel")) for b in bindings}
            raw = select_channels(given, [b.channel for b in bindings], dead)
            for binding in bindings:
                # the raw body is stored and checked (a decoding source would refuse a malformed body silently)
                raw[f'openroute.messaging.incoming."{binding.channel}".decode'] = False
            self.app = MessagingApp(raw, environ=environ)
        self.app.register_connector(IN_MEMORY, self.app.connector("memory"))
        self._channels: dict[str, _Channel] = {}
        self._dead_letters: dict[str, Emitter[Any]] = {}
        known = ("memory", "amqp", IN_MEMORY)
        for binding in bindings:
            if binding.key not in engine.routes:
                problems.append(f"channel '{binding.channel}' feeds {binding.service}/{binding.operation}, which "
                                "has no route in the engine")
                continue
            if binding.channel in self._channels:
                problems.append(f"channel '{binding.channel}' feeds two routes")
                continue
            config_of = self.app.config.channel("incoming", binding.channel, known)
            if config_of.connector is None and binding.optional:
                log.info("channel %s of route %s/%s is not bound to a connector: not consumed (set "
                         "openroute.messaging.incoming.%s.connector to feed the route from it)", binding.channel,
                         binding.service, binding.operation, binding.channel)
                continue
            if config_of.connector is None:
                problems.append(f"channel '{binding.channel}' of route {binding.service}/{binding.operation} has no "
                                f"connector: set openroute.messaging.incoming.{binding.channel}.connector "
                                f"(\"amqp\" or \"{IN_MEMORY}\")")
                continue
            try:
                options = ChannelOptions.of(config_of)
            except DeploymentError as error:
                problems.extend(error.problems)
                continue
            self._channels[binding.channel] = _Channel(binding, options, config_of.connector, config_of,
                                                       engine.routes.get(binding.service, binding.operation))
            if options.dead_letter_channel and options.dead_letter_channel not in self._dead_letters:
                self._dead_letters[options.dead_letter_channel] = self.app.emitter(
                    options.dead_letter_channel, overflow=OnOverflow.UNBOUNDED_BUFFER)
            capacity = engine.settings.queue_size + engine.settings.concurrency
            self.app.incoming(binding.channel, acknowledgment=Acknowledgment.MANUAL,
                              concurrency=options.concurrency or capacity)(self._consumer(binding.channel))
        if problems:
            raise DeploymentError(problems)
        self._stopping = asyncio.Event()
        #: when :meth:`start` last ran (the counters count from then)
        self.started_at: datetime | None = None
        self._resume_at = 0.0
        self._delay = 0.0
        self._running = False

    @property
    def channels(self) -> list[str]:
        """The channel names served."""
        return list(self._channels)

    def stats(self, channel: str) -> ChannelStats:
        """The counters of ``channel``; KeyError for a channel not served."""
        return self._channels[channel].stats

    def deliveries(self) -> dict[str, dict[str, int]]:
        """``{channel: {outcome: count}}`` of every channel served, since the node started it (``/metrics``)."""
        return {name: {outcome.value: count for outcome, count in channel.stats.by_outcome().items()}
                for name, channel in self._channels.items()}

    def described(self) -> list[DescribedChannel]:
        """Every channel served, with its configuration and its dead-letter channel's: what the AsyncAPI document
        (:mod:`openroute.inbound.asyncapi`, ``GET /api/asyncapi.json``) is made of."""
        known = ("memory", "amqp", IN_MEMORY)
        return [
            DescribedChannel(c.binding, c.config, c.options,
                             dead_letter=None if c.options.dead_letter_channel is None
                             else self.app.config.channel("outgoing", c.options.dead_letter_channel, known))
            for c in self._channels.values()
        ]

    def reports(self) -> list[ChannelReport]:
        """Every channel served, by name, with its route, connector, state and counters (the console's)."""
        states = self.health()
        return [ChannelReport(name, c.binding.service, c.binding.operation, c.connector,
                              c.options.dead_letter_channel, states[name], c.stats)
                for name, c in sorted(self._channels.items())]

    async def start(self) -> None:
        """Connect and start consuming (the engine must run). Raises :class:`DeploymentError` when a broker cannot
        be reached or a channel is misconfigured."""
        self._stopping.clear()
        await self.app.start()
        self._running = True
        self.started_at = self.engine.clock.now()
        for name, channel in self._channels.items():
            log.info("channel %s (%s) feeds route %s/%s", name, channel.connector, channel.binding.service,
                     channel.binding.operation)

    async def stop(self, timeout: float = 10.0) -> None:
        """Stop consuming, let accepts in flight commit and ack (up to ``timeout`` seconds), close the
        connections: what was not acked goes back to its queue for redelivery (nothing acked is missing)."""
        self._stopping.set()
        self._running = False
        await self.app.stop(timeout=timeout)

    def health(self) -> dict[str, str]:
        """``{channel: "connected" | "disconnected" | "stopped"}`` for ``/health``."""
        sources: dict[str, AmqpSource] = {}
        with contextlib.suppress(KeyError):
            sources = {s.name: s for s in self.app.connector("amqp").sources}
        states: dict[str, str] = {}
        for name in self._channels:
            if not self._running:
                states[name] = "stopped"
            elif name in sources:
                states[name] = "connected" if sources[name].connected else "disconnected"
            else:
                states[name] = "connected"
        return states

    # -- one delivery ----------------------------------------------------------------------------------------
    def _consumer(self, name: str) -> Any:
        channel = self._channels[name]

        async def consume(message: Message[Any]) -> None:
            await self._deliver(channel, message)

        consume.__name__ = consume.__qualname__ = f"channel:{name}"
        return consume

    async def _deliver(self, channel: _Channel, message: Message[Any]) -> None:
        # the common case (no pause, not stopping): two attribute reads, no clock
        if (self._resume_at or self._stopping.is_set()) and not await self._may_take():
            await message.nack(RedeliverError("the node is stopping"))
            return
        body, meta = _body_and_meta(message)
        try:
            inbound = self._inbound(channel, body, meta)
            result: AcceptResult = await self.engine.accept(inbound)
        except Exception as error:
            status, code = status_and_code(error)
            if 400 <= status < 500:
                await self._refuse(channel, message, body, meta, code, error)
            else:
                await self._redeliver(channel, message, code, error)
            return
        self._delay = 0.0
        if result.duplicate:
            channel.stats.duplicates += 1
        else:
            channel.stats.accepted += 1
        try:
            await message.ack()
        except Exception as error:  # the connection went: the broker redelivers it, acked then as a duplicate
            log.info("channel %s: ack of stored message %s lost (%s); its redelivery will be acked as a duplicate",
                     channel.binding.channel, result.message_id, _one_line(error))

    async def _may_take(self) -> bool:
        """Whether a delivery may be accepted now, after waiting out a back-off (False: the node stops)."""
        if self._stopping.is_set():
            return False
        if self._resume_at <= asyncio.get_running_loop().time():
            self._resume_at = 0.0  # the pause is over: the next deliveries skip the clock
            return True
        return await self._wait_resume()

    async def _wait_resume(self) -> bool:
        """Wait out a back-off after a store failure; False when the node stops meanwhile."""
        loop = asyncio.get_running_loop()
        while (wait := self._resume_at - loop.time()) > 0:
            if self._stopping.is_set():
                return False
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), wait)
        return not self._stopping.is_set()

    async def _redeliver(self, channel: _Channel, message: Message[Any], code: str, error: BaseException) -> None:
        """The store failed (or the node does not accept now): pause, then give the delivery back."""
        options = channel.options
        loop = asyncio.get_running_loop()
        if loop.time() >= self._resume_at:  # deliveries failing in the same pause count once
            self._delay = min(max(self._delay * 2, options.backoff), options.max_backoff)
            self._resume_at = loop.time() + self._delay
        channel.stats.requeued += 1
        log.warning("channel %s: delivery not stored (%s: %s), given back for redelivery; channels pause %.1f s",
                    channel.binding.channel, code, _one_line(error), self._delay)
        await self._wait_resume()
        await message.nack(RedeliverError(f"{code}: {_one_line(error)}"))

    async def _refuse(self, channel: _Channel, message: Message[Any], body: bytes, meta: _Delivered,
                      code: str, error: BaseException) -> None:
        """A delivery that can never be stored: to the dead-letter channel with its reason, then acked."""
        reason = _one_line(error)
        target = channel.options.dead_letter_channel
        name = channel.binding.channel
        if target is None:
            channel.stats.rejected += 1
            channel.stats.refused(self.engine.clock.now(), code, reason)
            log.warning("channel %s: delivery %s rejected without requeue (%s: %s); no dead-letter-channel is set",
                        name, meta.message_id or "-", code, reason)
            await message.nack(ValidationError(f"{code}: {reason}"))
            return
        headers = {**meta.headers, REASON_HEADER: reason, CODE_HEADER: code, "x-openroute-channel": name}
        outgoing = AmqpOutgoingMetadata(headers=headers, message_id=meta.message_id,
                                        correlation_id=meta.correlation_id,
                                        content_type=meta.content_type or "application/octet-stream")
        try:
            sent = self._dead_letters[target].send(Message(body, (outgoing,)))
            await (sent if isinstance(sent, asyncio.Future) else asyncio.wrap_future(sent))
        except Exception as failure:
            await self._redeliver(channel, message, "DEAD_LETTER_FAILED", failure)
            return
        channel.stats.dead_lettered += 1
        channel.stats.refused(self.engine.clock.now(), code, reason)
        log.warning("channel %s: delivery %s sent to %s (%s: %s)", name, meta.message_id or "-", target, code, reason)
        await message.ack()

    def _inbound(self, channel: _Channel, body: bytes, meta: _Delivered) -> InboundMessage:
        """The checks of an HTTP request, on a delivery: size, secure parse, trace, binding checks, extraction."""
        binding, options = channel.binding, channel.options
        limit = self.settings.max_body_bytes
        if len(body) > limit:
            raise BodyTooLargeError(limit, len(body))
        kind = _format(meta.content_type, options.format, body)
        headers = {str(k).lower(): v for k, v in meta.headers.items()} if meta.headers else {}
        inbound_binding = binding.xml if kind == "xml" else binding.json
        if inbound_binding is None:
            declared = "its SOAP request (.soap(...)) and not .json()" if kind == "json" else \
                "no SOAP request element (.soap(...)): JSON bodies only"
            raise MalformedPayloadError(f"route {binding.service}/{binding.operation} takes no {kind.upper()} body "
                                        f"from a channel: it declares {declared}")
        if kind == "xml":
            root = parse_xml(body, self.settings.max_depth)
            expected = inbound_binding.request_element
            if expected is not None and root.tag != etree.QName(expected).text:
                raise MalformedPayloadError(f"expected element {etree.QName(expected).text}, got {root.tag}")
            payload = ParsedPayload("xml", etree.tostring(root, encoding="unicode"), xml=root)
            content_type = "application/xml"
        else:
            text, document = parse_json(body, self.settings.max_depth)
            payload = ParsedPayload("json", text, json=document)
            content_type = "application/json"
        if options.correlation_header is not None:
            correlation = _header_text(headers, options.correlation_header)
            where = f"header {options.correlation_header}"
        else:
            correlation = meta.message_id
            where = "the broker message id"
        if not correlation:
            raise ValidationError(f"the correlation id is missing ({where}): without it a redelivery cannot be "
                                  "told from a new message")
        source = _header_text(headers, options.source_system_header) or options.source_system
        if not source:
            raise ValidationError(f"the source system is missing (header {options.source_system_header}, or the "
                                  "channel's source-system attribute)")
        stored_headers = {"endpoint": "channel", "channel": binding.channel}
        if meta.message_id:
            stored_headers["messageId"] = meta.message_id[:255]
        return checked_message(
            inbound_binding, channel.route, payload, content_type=content_type, correlation_id=correlation,
            source_system=source, process_id=_header_text(headers, options.process_header),
            message_timestamp=parse_timestamp(_header_text(headers, options.timestamp_header)),
            headers=stored_headers,
            traceparent=_header_text(headers, tracing.TRACEPARENT) if tracing.ENABLED else None,
        )


#: what a delivery's metadata tells (both have headers, message_id, content_type and correlation_id)
_Delivered = ChannelDelivery | AmqpIncomingMetadata


def _body_and_meta(message: Message[Any]) -> tuple[bytes, _Delivered]:
    meta: _Delivered | None = message.get_metadata(AmqpIncomingMetadata)  # read as it is, not copied
    if meta is None:
        meta = message.get_metadata(ChannelDelivery) or ChannelDelivery()
    payload = message.payload
    if isinstance(payload, bytes | bytearray | memoryview):
        return bytes(payload), meta
    if isinstance(payload, str):
        return payload.encode("utf-8"), meta
    import json

    try:
        return json.dumps(payload).encode("utf-8"), meta
    except (TypeError, ValueError):
        return repr(payload).encode("utf-8", "replace"), meta


def _format(content_type: str | None, configured: str, body: bytes) -> str:
    media = (content_type or "").split(";")[0].strip().lower()
    if media == "application/json" or media.endswith("+json"):
        return "json"
    if media in ("application/xml", "text/xml") or media.endswith("+xml"):
        return "xml"
    if configured != "auto":
        return configured
    return "xml" if body.lstrip()[:1] == b"<" else "json"


def _header_text(headers: Mapping[str, Any], name: str) -> str | None:
    """The text of the header ``name`` (None when absent or blank). The headers the channel reads are text: an AMQP
    string (or UTF-8 bytes); any other type (a number, a table, a list) is a ValidationError, so the delivery goes to
    the dead-letter channel with the reason instead of being stored with its ``str()``."""
    value = headers.get(name)
    if value is None:
        return None
    if isinstance(value, bytes | bytearray):
        try:
            value = bytes(value).decode("utf-8")
        except UnicodeDecodeError:
            raise ValidationError(f"header {name} is not UTF-8 text") from None
    if not isinstance(value, str):
        raise ValidationError(f"header {name} must be a string, got {type(value).__name__} {_one_line_value(value)}")
    return value.strip() or None


def _one_line_value(value: Any) -> str:
    text = " ".join(repr(value).split())
    return text if len(text) <= 60 else text[:57] + "..."




def _one_line(error: BaseException) -> str:
    text = " ".join(str(error).split()) or type(error).__name__
    return text if len(text) <= 300 else text[:297] + "..."
