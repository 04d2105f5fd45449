"""The ``amqp`` connector: RabbitMQ (AMQP 0-9-1) through aio-pika.

Incoming channel attributes (``openroute.messaging.incoming.<channel>.*``, or ``connector.amqp.*``):
``url`` (default ``amqp://guest:guest@localhost:5672/``), ``queue`` (mandatory), ``declare`` (true: declare the
queue), ``durable`` (true), ``auto-delete`` (false), ``exchange`` + ``exchange-type`` (topic) + ``routing-keys``
(comma separated, default ``#``) to bind the queue, ``dead-letter-exchange`` / ``dead-letter-routing-key``
(queue arguments), ``failure-strategy`` (``dead-letter``: nack rejects without requeue, so RabbitMQ
dead-letters the message when the queue has a dead-letter exchange; ``requeue``: nack rejects with requeue),
``prefetch`` (fixed prefetch; by default it follows downstream demand) and ``max-prefetch`` (cap, 1024),
``decode`` (true: bodies decoded by content type; false: the payload is the body's ``bytes``). A nack whose reason
is a :class:`~openroute.messaging.errors.RedeliverError` always rejects with requeue.

Outgoing channel attributes: ``url``, ``exchange`` (default: the default exchange), ``exchange-type``,
``declare``, ``routing-key`` (default: ``queue`` or the channel name), ``queue`` (declared when set),
``durable``, ``persistent`` (true), ``max-inflight`` (unconfirmed publishes in flight, 256).
A message is acked only after the broker confirmed its publish; an unroutable or refused publish nacks it.

Payloads: ``bytes`` as is, ``str`` as UTF-8 ``text/plain``, anything else as JSON. Incoming bodies are decoded
by content type (JSON, text) and stay ``bytes`` otherwise.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import aio_pika
from aio_pika.abc import AbstractChannel, AbstractConnection, AbstractExchange, AbstractIncomingMessage, AbstractQueue

from openroute.messaging._amqp_acks import Acks as _Acks
from openroute.messaging._drain import DrainLoop
from openroute.messaging.amqp_body import decode, encode
from openroute.messaging.config import ChannelConfig
from openroute.messaging.connector import IncomingConnectorFactory, OutgoingConnectorFactory
from openroute.messaging.errors import ChannelClosedError, DeploymentError, RedeliverError
from openroute.messaging.message import Message
from openroute.streams.protocol import (
    UNBOUNDED,
    Publisher,
    Subscriber,
    Subscription,
    add_demand,
    first_subscription,
    refuse_none,
)

log = logging.getLogger("openroute.messaging.amqp")

DEFAULT_URL = "amqp://guest:guest@localhost:5672/"
PERSISTENT = aio_pika.DeliveryMode.PERSISTENT
NOT_PERSISTENT = aio_pika.DeliveryMode.NOT_PERSISTENT


class _Delivery:
    """One received message: its ack / nack callbacks, the outcome its delivery task waits for, and whether it went
    downstream yet (prefetch accounting, requeue on close).

    It holds no reference to its ``Message`` (the message holds its bound callbacks), so a settled delivery is
    freed by reference counting, never left to the cycle collector.
    """

    __slots__ = ("acks", "decision", "emitted", "finished", "source", "tag")

    def __init__(self, source: AmqpSource, loop: asyncio.AbstractEventLoop, tag: int | None, acks: _Acks) -> None:
        self.source = source
        self.tag = tag
        self.acks = acks
        self.emitted = False
        self.decision: asyncio.Future[bool | None] = loop.create_future()  # None: ack, bool: reject(requeue)
        self.finished: asyncio.Future[None] = loop.create_future()

    def _settle(self, requeue: bool | None) -> asyncio.Future[None]:
        if self.emitted:
            self.source._unacked -= 1
        if not self.decision.done():
            if requeue is None and self.tag is not None:
                self.acks.ack(self.tag, self.finished)
            self.decision.set_result(requeue)
        return self.finished

    def ack(self) -> asyncio.Future[None]:
        return self._settle(None)

    def nack(self, reason: BaseException) -> asyncio.Future[None]:
        return self._settle(self.source._requeue or isinstance(reason, RedeliverError)
                            or (isinstance(reason, ChannelClosedError) and not self.emitted))


@dataclass(frozen=True)
class AmqpIncomingMetadata:
    """Where an incoming AMQP message came from."""

    exchange: str
    routing_key: str
    headers: Mapping[str, Any] = field(default_factory=dict, hash=False)
    content_type: str | None = None
    correlation_id: str | None = None
    message_id: str | None = None
    redelivered: bool = False
    delivery_tag: int | None = None

    @classmethod
    def of(cls, incoming: AbstractIncomingMessage) -> AmqpIncomingMetadata:
        """The metadata of a delivery (made once per message: without the frozen ``__setattr__`` per field)."""
        metadata = object.__new__(cls)
        metadata.__dict__.update(
            exchange=incoming.exchange or "", routing_key=incoming.routing_key or "",
            headers=dict(incoming.headers or {}), content_type=incoming.content_type,
            correlation_id=incoming.correlation_id, message_id=incoming.message_id,
            redelivered=bool(incoming.redelivered), delivery_tag=incoming.delivery_tag)
        return metadata


@dataclass(frozen=True)
class AmqpOutgoingMetadata:
    """Per-message overrides for an outgoing AMQP publish."""

    routing_key: str | None = None
    headers: Mapping[str, Any] | None = field(default=None, hash=False)
    correlation_id: str | None = None
    message_id: str | None = None
    content_type: str | None = None
    priority: int | None = None
    expiration: float | None = None


class AmqpSource(DrainLoop, Publisher[Message[Any]], Subscription):
    """Consumes one queue; the broker prefetch follows the downstream demand (unless fixed)."""

    def __init__(self, connector: AmqpConnector, config: ChannelConfig, channel: AbstractChannel,
                 queue: AbstractQueue) -> None:
        self.name = config.channel
        self._connector = connector
        self._channel = channel
        self._queue = queue
        self._requeue = self._failure_strategy(config)
        self._decode = config.get_bool("decode", True)
        self._fixed_prefetch = config.get_int("prefetch")
        self._max_prefetch: int = config.get_int("max-prefetch", 1024)  # type: ignore[assignment]
        if self._max_prefetch < 1 or (self._fixed_prefetch is not None and self._fixed_prefetch < 1):
            raise DeploymentError(f"incoming channel '{config.channel}': prefetch and max-prefetch must be positive")
        self._subscriber: Subscriber[Message[Any]] | None = None
        self._buffer: deque[tuple[_Delivery, Message[Any]]] = deque()
        self._demand = 0
        self._unacked = 0  # emitted downstream, not yet settled
        self._prefetch = 0
        self._consumer_tag: str | None = None
        self._control: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self._pending: set[asyncio.Future[bool | None]] = set()
        self._acks: _Acks | None = None
        self._cancelled = False
        self._refused: tuple[Subscriber[Message[Any]], BaseException] | None = None

    @staticmethod
    def _failure_strategy(config: ChannelConfig) -> bool:
        strategy = (config.get_str("failure-strategy", "dead-letter") or "").lower()
        if strategy not in {"dead-letter", "requeue", "reject"}:
            raise DeploymentError(f"incoming channel '{config.channel}': failure-strategy must be 'dead-letter' "
                                  f"or 'requeue', got {strategy!r}")
        return strategy == "requeue"

    @property
    def prefetch(self) -> int:
        """The prefetch count currently set on the broker channel."""
        return self._prefetch

    @property
    def connected(self) -> bool:
        """True while the broker connection is up and this source's AMQP channel is open."""
        if self._channel.is_closed:
            return False
        connection = getattr(self._channel, "_connection", None)  # aio-pika keeps its connection here
        ready = getattr(connection, "connected", None)
        return bool(ready.is_set()) if isinstance(ready, asyncio.Event) else True

    def subscribe(self, subscriber: Subscriber[Message[Any]]) -> None:
        """Take the one subscriber (rule 1.9); a second one, or one after a cancel, gets on_subscribe, on_error."""
        if subscriber is None:
            raise TypeError("subscriber must not be None")
        if self._subscriber is not None or self._cancelled:
            from openroute.streams.protocol import NOOP_SUBSCRIPTION

            subscriber.on_subscribe(NOOP_SUBSCRIPTION)
            subscriber.on_error(RuntimeError(f"amqp channel '{self.name}' supports one subscriber"))
            return
        self._subscriber = subscriber
        subscriber.on_subscribe(self)

    def request(self, n: int) -> None:
        """Add ``n`` to the demand (the prefetch follows it unless fixed); ``n <= 0`` fails the stream (rule 3.9)."""
        if self._cancelled:
            return
        if n <= 0:
            subscriber = self._subscriber
            self.cancel()
            if subscriber is not None:
                error = ValueError(f"request({n}): demand must be positive (rule 3.9)")
                if self._draining:
                    # from inside on_next: the drain loop signals it once on_next has returned (rule 1.3)
                    self._refused = (subscriber, error)
                else:
                    subscriber.on_error(error)
            return
        self._demand = add_demand(self._demand, n)
        if self._buffer:  # usually empty: a delivery goes downstream as it arrives when there is demand
            self._drain()
        self._adjust()

    def cancel(self) -> None:
        """Stop emitting (idempotent); buffered messages never emitted go back to the queue."""
        if self._cancelled:
            return
        self._cancelled = True
        self._subscriber = None
        self._wake.set()
        for _, message in self._buffer:  # never seen downstream: give them back to the queue
            message.nack(ChannelClosedError("requeue"))
        self._buffer.clear()

    def _adjust(self) -> None:
        """Let the control task raise the prefetch to cover demand, and start consuming once."""
        if self._control is None:
            self._control = asyncio.ensure_future(self._run())
            return
        if self._wanted_prefetch() > self._prefetch:
            self._wake.set()

    def _wanted_prefetch(self) -> int:
        if self._fixed_prefetch:
            return self._fixed_prefetch
        wanted = self._unacked + len(self._buffer) + self._demand
        return max(1, min(wanted, self._max_prefetch, 65535))

    async def _run(self) -> None:
        try:
            while not self._cancelled:
                wanted = self._wanted_prefetch()
                if wanted > self._prefetch or self._consumer_tag is None:
                    wanted = max(wanted, self._prefetch)
                    # channel-wide (one channel per source): RabbitMQ applies a per-consumer prefetch only to
                    # consumers started later, so raising it for demand would not reach the running consumer
                    await self._channel.set_qos(prefetch_count=wanted, global_=True)
                    self._prefetch = wanted
                    if self._consumer_tag is None:
                        self._consumer_tag = await self._queue.consume(self._on_delivery)
                    continue
                self._wake.clear()
                await self._wake.wait()
            if self._consumer_tag is not None and not self._channel.is_closed:
                await self._queue.cancel(self._consumer_tag)
        except asyncio.CancelledError:
            raise
        except Exception as error:
            log.error("amqp channel '%s' failed: %r", self.name, error)
            subscriber = self._subscriber
            self._cancelled = True
            self._subscriber = None
            if subscriber is not None:
                subscriber.on_error(error)

    async def _on_delivery(self, incoming: AbstractIncomingMessage) -> None:
        if self._cancelled:
            await incoming.reject(requeue=True)
            return
        try:
            payload = decode(incoming.body, incoming.content_type) if self._decode else incoming.body
        except (ValueError, UnicodeDecodeError) as error:
            log.warning("amqp channel '%s': undecodable body (%r), rejected", self.name, error)
            await incoming.reject(requeue=False)
            return
        metadata = AmqpIncomingMetadata.of(incoming)
        # A reject runs in this delivery's own task (aio-pika made one already); acks are sent together (_Acks).
        tag = incoming.delivery_tag
        acks = self._opened(incoming)
        delivery = _Delivery(self, asyncio.get_running_loop(), tag, acks)
        decision, finished = delivery.decision, delivery.finished
        self._buffer.append((delivery, Message(payload, (metadata,), ack=delivery.ack, nack=delivery.nack)))
        self._pending.add(decision)
        self._drain()
        try:
            requeue = await decision
        except BaseException:
            # the delivery's task was cancelled (connection lost, close): whoever settles it must not wait forever;
            # the broker redelivers it
            if tag is not None:
                acks.open.discard(tag)
            if not finished.done():
                finished.set_exception(ChannelClosedError(f"amqp channel '{self.name}': delivery abandoned"))
                finished.exception()  # retrieved: nobody may be waiting for it
            raise
        finally:
            self._pending.discard(decision)
        if requeue is None and tag is not None:
            return  # acked with its neighbours (_Acks.flush sets ``finished``)
        await self._settle_alone(incoming, requeue, finished, acks)

    async def _settle_alone(self, incoming: AbstractIncomingMessage, requeue: bool | None,
                            finished: asyncio.Future[None], acks: _Acks) -> None:
        """Write a reject (or the ack of a delivery without a tag) in the delivery's own task."""
        tag = incoming.delivery_tag
        try:
            if self._channel.is_closed:
                pass  # the broker requeues unacked deliveries of a closed channel by itself
            elif requeue is None:
                await incoming.ack()
            else:
                await incoming.reject(requeue=requeue)
        except BaseException as error:  # cancelled too (connection lost): the settler must not wait forever
            if not finished.done():
                finished.set_exception(error if isinstance(error, Exception) else ChannelClosedError(
                    f"amqp channel '{self.name}': settling the delivery was cancelled"))
                finished.exception()  # retrieved: nobody may be waiting for it
            if not isinstance(error, Exception):
                raise
            return
        finally:
            if tag is not None:
                acks.open.discard(tag)  # written (or failed): an ack with multiple may cover it now
        if not finished.done():  # a stopped consumer may have cancelled it meanwhile
            finished.set_result(None)

    def _channel_closed(self) -> bool:
        return self._channel.is_closed

    def _opened(self, incoming: AbstractIncomingMessage) -> _Acks:
        """The acks of the delivery's channel (new ones after a reconnect: tags restart), with the delivery open."""
        acks = self._acks
        if acks is None or acks.channel is not incoming.channel:
            acks = self._acks = _Acks(incoming.channel, self._channel_closed)
        if incoming.delivery_tag is not None:
            acks.open.add(incoming.delivery_tag)
        return acks

    def abandon(self) -> None:
        """Stop waiting for outcomes of unsettled deliveries (the broker requeues them on channel close)."""
        for decision in list(self._pending):
            decision.cancel()

    def _drain_once(self) -> None:
        while self._buffer and self._demand > 0 and self._subscriber is not None:
            delivery, message = self._buffer.popleft()
            delivery.emitted = True
            if self._demand < UNBOUNDED:
                self._demand -= 1
            self._unacked += 1
            self._subscriber.on_next(message)

    def _drain(self) -> None:
        super()._drain()
        refused, self._refused = self._refused, None
        if refused is not None:
            refused[0].on_error(refused[1])

    def close_task(self) -> asyncio.Task[None] | None:
        """The control task (awaited on close)."""
        return self._control


class AmqpSink(Subscriber[Message[Any]]):
    """Publishes each message with publisher confirms; acks it on confirm, nacks on refusal."""

    def __init__(self, config: ChannelConfig, exchange: AbstractExchange, routing_key: str) -> None:
        self.name = config.channel
        self._exchange = exchange
        self._routing_key = routing_key
        self._persistent = config.get_bool("persistent", True)
        self._content_type = config.get_str("content-type")
        self._max_inflight: int = config.get_int("max-inflight", 256)  # type: ignore[assignment]
        if self._max_inflight < 1:
            raise DeploymentError(f"outgoing channel '{self.name}': max-inflight must be positive")
        self._subscription: Subscription | None = None
        self._inflight = 0
        # confirmed publishes whose slots are requested again together: a request per message costs a pass
        # through every stage upstream, and the window stays max-inflight (in flight + requested + credit)
        self._credit = 0
        self._batch = max(1, self._max_inflight // 8)
        self._done = False
        self.completion: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def on_subscribe(self, subscription: Subscription) -> None:
        """Keep the first subscription (rules 2.5, 2.13) and request ``max-inflight`` messages."""
        if first_subscription(self._subscription, subscription):
            self._subscription = subscription
            subscription.request(self._max_inflight)

    def _amqp_message(self, message: Message[Any]) -> tuple[aio_pika.Message, str]:
        meta = message.get_metadata(AmqpOutgoingMetadata)
        delivery_mode = PERSISTENT if self._persistent else NOT_PERSISTENT
        if meta is None:  # the common case: the channel's settings alone
            body, content_type = encode(message.payload, self._content_type)
            return aio_pika.Message(body, content_type=content_type, delivery_mode=delivery_mode), self._routing_key
        body, content_type = encode(message.payload, meta.content_type or self._content_type)
        amqp_message = aio_pika.Message(
            body, content_type=content_type, headers=dict(meta.headers or {}),
            correlation_id=meta.correlation_id, message_id=meta.message_id, priority=meta.priority,
            expiration=meta.expiration, delivery_mode=delivery_mode)
        return amqp_message, meta.routing_key or self._routing_key

    def on_next(self, item: Message[Any]) -> None:
        """Publish ``item``: acked once the broker confirms, nacked when it refuses or it cannot be encoded."""
        refuse_none(item, "on_next")
        try:
            amqp_message, routing_key = self._amqp_message(item)
        except (TypeError, ValueError) as error:  # payload that cannot be encoded
            item.nack(error)
            self._subscription.request(1)  # type: ignore[union-attr]
            return
        self._inflight += 1
        task = asyncio.ensure_future(self._exchange.publish(amqp_message, routing_key))
        task.add_done_callback(lambda t: self._published(item, t))

    def _published(self, item: Message[Any], task: asyncio.Future[Any]) -> None:
        self._inflight -= 1
        if task.cancelled():
            item.nack(ChannelClosedError(f"outgoing channel '{self.name}': publish cancelled"))
        elif task.exception() is not None:
            item.nack(task.exception())  # type: ignore[arg-type]
        else:
            item.ack()
        if not self._done and self._subscription is not None:
            self._credit += 1
            if self._credit >= self._batch or self._inflight == 0:
                credit, self._credit = self._credit, 0
                self._subscription.request(credit)
        self._check_done()

    def _check_done(self) -> None:
        if self._done and self._inflight == 0 and not self.completion.done():
            self.completion.set_result(None)

    def on_error(self, error: BaseException) -> None:
        """Log the upstream's failure, then end as :meth:`on_complete` does (publishes in flight still confirmed)."""
        refuse_none(error, "on_error")
        log.error("outgoing amqp channel '%s' upstream failed: %r", self.name, error)
        self.on_complete()  # the messages in flight are still confirmed

    def on_complete(self) -> None:
        """No more messages: :attr:`completion` resolves once every publish in flight is settled."""
        self._done = True
        self._check_done()


class AmqpConnector(IncomingConnectorFactory, OutgoingConnectorFactory):
    """Registered as ``amqp`` on every application; one connection per URL, one AMQP channel per channel."""

    incoming_mandatory = ("queue",)

    def __init__(self) -> None:
        self._connections: dict[str, AbstractConnection] = {}
        self._lock = asyncio.Lock()
        self._sources: list[AmqpSource] = []

    @property
    def sources(self) -> list[AmqpSource]:
        """The incoming sources created so far (for inspection and metrics)."""
        return list(self._sources)

    async def connection(self, url: str) -> AbstractConnection:
        """The (robust) connection for ``url``, opened on first use."""
        async with self._lock:
            connection = self._connections.get(url)
            if connection is None or connection.is_closed:
                try:
                    connection = await aio_pika.connect_robust(url)
                except Exception as error:
                    raise DeploymentError(f"amqp: cannot connect to {_safe(url)}: {error!r}") from error
                self._connections[url] = connection
            return connection

    async def _declare_queue(self, channel: AbstractChannel, config: ChannelConfig, name: str) -> AbstractQueue:
        arguments: dict[str, Any] = {}
        if config.get("dead-letter-exchange") is not None:
            arguments["x-dead-letter-exchange"] = config.get_str("dead-letter-exchange")
        if config.get("dead-letter-routing-key") is not None:
            arguments["x-dead-letter-routing-key"] = config.get_str("dead-letter-routing-key")
        if not config.get_bool("declare", True):
            return await channel.get_queue(name, ensure=True)
        return await channel.declare_queue(
            name, durable=config.get_bool("durable", True), auto_delete=config.get_bool("auto-delete", False),
            arguments=arguments or None)

    async def create_publisher(self, config: ChannelConfig) -> AmqpSource:
        """An :class:`AmqpSource` on ``queue``; DeploymentError when the broker cannot be reached."""
        connection = await self.connection(config.get_str("url", DEFAULT_URL) or DEFAULT_URL)
        channel = await connection.channel()
        queue = await self._declare_queue(channel, config, str(config.require("queue")))
        exchange_name = config.get_str("exchange")
        if exchange_name:
            exchange = await channel.declare_exchange(
                exchange_name, config.get_str("exchange-type", "topic") or "topic",
                durable=config.get_bool("durable", True))
            for key in (config.get_str("routing-keys", "#") or "#").split(","):
                await queue.bind(exchange, routing_key=key.strip())
        source = AmqpSource(self, config, channel, queue)
        self._sources.append(source)
        return source

    async def create_subscriber(self, config: ChannelConfig) -> AmqpSink:
        """An :class:`AmqpSink` publishing with confirms to ``exchange`` (default: the default exchange) under
        ``routing-key`` (default: ``queue`` or the channel name); ``queue`` is declared when set."""
        connection = await self.connection(config.get_str("url", DEFAULT_URL) or DEFAULT_URL)
        channel = await connection.channel(publisher_confirms=True, on_return_raises=True)
        exchange_name = config.get_str("exchange") or ""
        queue_name = config.get_str("queue")
        if exchange_name:
            if config.get_bool("declare", True):
                exchange = await channel.declare_exchange(
                    exchange_name, config.get_str("exchange-type", "topic") or "topic",
                    durable=config.get_bool("durable", True))
            else:
                exchange = await channel.get_exchange(exchange_name, ensure=True)
        else:
            exchange = channel.default_exchange
        if queue_name:
            await self._declare_queue(channel, config, queue_name)
        routing_key = config.get_str("routing-key") or queue_name or config.channel
        return AmqpSink(config, exchange, routing_key)

    async def close(self) -> None:
        """Stop consumers and close every connection (unacked deliveries go back to their queues)."""
        for source in self._sources:
            source.cancel()
            task = source.close_task()
            if task is not None:
                try:
                    await asyncio.wait_for(asyncio.shield(task), 5)
                except (TimeoutError, Exception):
                    task.cancel()
        for source in self._sources:
            source.abandon()
        self._sources.clear()
        for connection in self._connections.values():
            await connection.close()
        self._connections.clear()


def _safe(url: str) -> str:
    """The URL without its password."""
    if "@" in url and "://" in url:
        scheme, rest = url.split("://", 1)
        credentials, host = rest.rsplit("@", 1)
        user = credentials.split(":", 1)[0]
        return f"{scheme}://{user}:***@{host}"
    return url
