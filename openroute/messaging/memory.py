"""The ``memory`` connector: in-process sources and sinks for tests and the embedded default.

``connector.source(channel).send(payload)`` feeds an incoming channel (the returned future completes when the
application acks, fails when it nacks); ``connector.sink(channel)`` collects what an outgoing channel emits and
acks each message on receipt (``auto-ack=false`` leaves acknowledgment to the test).
"""

from __future__ import annotations

import asyncio
from typing import Any

from openroute.messaging.config import ChannelConfig
from openroute.messaging.connector import IncomingConnectorFactory, OutgoingConnectorFactory
from openroute.messaging.emitter import AnyFuture, Emitter, OnOverflow
from openroute.messaging.message import Message
from openroute.streams.protocol import UNBOUNDED, Publisher, Subscriber, Subscription, first_subscription, refuse_none


class InMemorySource:
    """Feeds one incoming channel; records the outcome of every message it sent."""

    def __init__(self, channel: str) -> None:
        self.channel = channel
        self._emitter: Emitter[Any] = Emitter(channel, OnOverflow.UNBOUNDED_BUFFER)
        self.acked: list[Any] = []
        self.nacked: list[tuple[Any, BaseException]] = []

    def send(self, payload: Any) -> AnyFuture:
        """Send a payload or a ``Message`` into the channel (buffered until the application requests it)."""
        if payload is None:
            raise ValueError(f"memory source '{self.channel}': cannot send None")
        message = payload if isinstance(payload, Message) else Message(payload)
        value = message.payload

        def ack() -> Any:
            self.acked.append(value)
            return message.ack()

        def nack(reason: BaseException) -> Any:
            self.nacked.append((value, reason))
            return message.nack(reason)

        return self._emitter.send(message.with_ack(ack).with_nack(nack))

    def complete(self) -> None:
        """End the channel's stream."""
        self._emitter.complete()

    def fail(self, error: BaseException) -> None:
        """Fail the channel's stream with ``error``."""
        self._emitter.error(error)

    @property
    def publisher(self) -> Publisher[Message[Any]]:
        """The stream of messages (one subscriber)."""
        return self._emitter


class InMemorySink(Subscriber[Message[Any]]):
    """Collects the messages of one outgoing channel."""

    def __init__(self, channel: str, auto_ack: bool = True) -> None:
        self.channel = channel
        self.auto_ack = auto_ack
        self.received: list[Message[Any]] = []
        self.completed = False
        self.failure: BaseException | None = None
        self._subscription: Subscription | None = None
        self._changed = asyncio.Event()

    @property
    def payloads(self) -> list[Any]:
        """Payloads received so far, in order."""
        return [m.payload for m in self.received]

    def on_subscribe(self, subscription: Subscription) -> None:
        """Keep the first subscription (rules 2.5, 2.13) and request unbounded demand."""
        if first_subscription(self._subscription, subscription):
            self._subscription = subscription
            subscription.request(UNBOUNDED)

    def on_next(self, item: Message[Any]) -> None:
        """Record ``item`` in :attr:`received`, acking it at once unless ``auto_ack`` is off."""
        refuse_none(item, "on_next")
        self.received.append(item)
        if self.auto_ack:
            item.ack()
        self._changed.set()

    def on_error(self, error: BaseException) -> None:
        """Record the stream's failure in :attr:`failure`."""
        refuse_none(error, "on_error")
        self.failure = error
        self._changed.set()

    def on_complete(self) -> None:
        """Mark the stream :attr:`completed`."""
        self.completed = True
        self._changed.set()

    async def wait_for(self, count: int, timeout: float = 5.0) -> list[Any]:
        """Wait until ``count`` messages arrived (or the stream ended); returns the payloads.

        Raises ``TimeoutError`` after ``timeout`` seconds.
        """
        async def wait() -> None:
            while len(self.received) < count and not self.completed and self.failure is None:
                self._changed.clear()
                await self._changed.wait()

        await asyncio.wait_for(wait(), timeout)
        return self.payloads

    def clear(self) -> None:
        """Forget what was received."""
        self.received.clear()


class InMemoryConnector(IncomingConnectorFactory, OutgoingConnectorFactory):
    """Registered as ``memory`` on every application (one instance per application)."""

    def __init__(self) -> None:
        self._sources: dict[str, InMemorySource] = {}
        self._sinks: dict[str, InMemorySink] = {}

    def source(self, channel: str) -> InMemorySource:
        """The source of incoming channel ``channel`` (created on first use, before or after start)."""
        if channel not in self._sources:
            self._sources[channel] = InMemorySource(channel)
        return self._sources[channel]

    def sink(self, channel: str) -> InMemorySink:
        """The sink of outgoing channel ``channel``."""
        if channel not in self._sinks:
            self._sinks[channel] = InMemorySink(channel)
        return self._sinks[channel]

    async def create_publisher(self, config: ChannelConfig) -> Publisher[Message[Any]]:
        """The publisher of the channel's :class:`InMemorySource` (one subscriber)."""
        return self.source(config.channel).publisher

    async def create_subscriber(self, config: ChannelConfig) -> Subscriber[Message[Any]]:
        """The channel's :class:`InMemorySink`, acking each message on receipt unless ``auto-ack`` is false."""
        sink = self.sink(config.channel)
        sink.auto_ack = config.get_bool("auto-ack", True)
        return sink
