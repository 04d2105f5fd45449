"""Publishing to outgoing channels and waiting for the broker's confirm: the port through which the delivery family
(the outcome events of the outbox, the confirmations over a channel) reaches the messaging layer.

    publisher = ChannelPublisher(config, ["crm-events"], environ={})
    await publisher.start()
    await publisher.publish("crm-events", '{"state": "OK"}', message_id="e-1", headers={"x-id": "e-1"}, timeout=10)
    await publisher.stop()
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping
from typing import Any

from openroute.messaging.amqp import AmqpOutgoingMetadata
from openroute.messaging.app import MessagingApp
from openroute.messaging.config import MessagingConfig, select_channels
from openroute.messaging.emitter import Emitter, OnOverflow
from openroute.messaging.message import Message

__all__ = ["ChannelPublisher"]


class ChannelPublisher:
    """Publishes JSON bodies to the outgoing ``channels`` configured in ``config`` (the ``openroute.messaging.*``
    keys, of which only these channels' and the connectors' are read unless ``config`` is a whole
    :class:`MessagingConfig`; ``environ``: the environment the messaging layer reads, default ``os.environ``).

    The messaging application is made when first needed (a configuration it cannot read fails then, not here) and
    connects at :meth:`start` or the first :meth:`publish`; a start that failed is tried again with a new one.
    """

    def __init__(self, config: Mapping[str, Any] | MessagingConfig | None, channels: Iterable[str], *,
                 environ: Mapping[str, str] | None = None) -> None:
        self.channels = tuple(dict.fromkeys(channels))
        self._config: Mapping[str, Any] | MessagingConfig = (
            config if isinstance(config, MessagingConfig) else select_channels(dict(config or {}), (), self.channels))
        self._environ = environ
        self._app: MessagingApp | None = None
        self._emitters: dict[str, Emitter[Any]] = {}
        self._started = False
        self._stopped = False
        self._lock: asyncio.Lock | None = None

    @property
    def app(self) -> MessagingApp:
        """The messaging application of the channels (tests read the in-memory sinks from it)."""
        if self._app is None:
            if isinstance(self._config, MessagingConfig):
                app = MessagingApp(self._config)
            else:
                app = MessagingApp(self._config, environ=self._environ)
            app.register_connector("in-memory", app.connector("memory"))
            self._emitters = {name: app.emitter(name, overflow=OnOverflow.UNBOUNDED_BUFFER) for name in self.channels}
            self._app = app
        return self._app

    async def start(self) -> None:
        """Connect the channels (once; raises the messaging layer's DeploymentError when a broker cannot be
        reached)."""
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            if self._started:
                return
            if self._stopped:
                self._app, self._stopped = None, False
            try:
                await self.app.start()
            except BaseException:
                self._app = None  # the next start begins with a new application
                raise
            self._started = True

    async def publish(self, channel: str, body: str, *, message_id: str, headers: Mapping[str, str],
                      timeout: float, correlation_id: str | None = None) -> None:
        """Publish ``body`` (JSON) to ``channel`` with ``message_id`` and ``headers`` and wait up to ``timeout``
        seconds for the broker's confirm; raises what the channel raised (LookupError: not one of ``channels``)."""
        if channel not in self.channels:
            raise LookupError(f"no outgoing channel {channel!r} on this node")
        await self.start()
        metadata = AmqpOutgoingMetadata(message_id=message_id, correlation_id=correlation_id,
                                        content_type="application/json", headers=dict(headers))
        sent = self._emitters[channel].send(Message(body, (metadata,)))
        future = sent if isinstance(sent, asyncio.Future) else asyncio.wrap_future(sent)
        await asyncio.wait_for(future, timeout)

    async def stop(self) -> None:
        """Close the channels' connections (a later :meth:`start` connects a new application)."""
        if self._app is not None and self._started:
            await self._app.stop()
            # kept for what it received (its in-memory sinks); a later start connects a new one
            self._started, self._stopped = False, True
