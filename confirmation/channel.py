"""Confirmation over a broker channel: the confirmation published to an outgoing channel of the messaging layer
(RabbitMQ through the ``amqp`` connector, publisher confirms), as one more :class:`ExternalSystemConfirmation`.

The confirmation row is written in the final state's transaction and sent after the commit by the
:class:`~confirmation.ConfirmationService`, retried on its schedule until the broker confirmed the publish (the
same persist, publish after commit, retry, at-least-once discipline as the outcome-event outbox). The body is
:meth:`ConfirmationRequest.to_json`; the AMQP ``message_id`` and the ``x-openroute-confirmation-id`` header carry a
stable confirmation id (``<messageId>:<finishedAt>``): a confirmation sent again has the same id.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from typing import Any

from openroute.confirmation.callbacks import ExternalSystemConfirmation
from openroute.confirmation.model import ConfirmationRequest, ConfirmationSendError, InvalidConfirmationError

from openroute.messaging import Emitter, Message, MessagingApp, OnOverflow
from openroute.messaging.amqp import AmqpOutgoingMetadata
from openroute.messaging.config import select_channels

__all__ = ["CONFIRMATION_HEADER", "ChannelConfirmation"]

CONFIRMATION_HEADER = "x-openroute-confirmation-id"


class ChannelConfirmation(ExternalSystemConfirmation):
    """Confirms ``source_system``'s messages by publishing to the outgoing ``channel`` configured in ``config``
    (``openroute.messaging.outgoing.<channel>.connector`` = ``amqp`` or ``in-memory``, its queue or exchange).

    The channel connects on the first confirmation; a publish the broker refuses or does not confirm within
    ``timeout`` seconds raises :class:`~confirmation.ConfirmationSendError` (retried by the service).
    """

    def __init__(self, source_system: str, channel: str, config: Mapping[str, Any] | None = None, *,
                 timeout: float = 10.0, environ: Mapping[str, str] | None = None) -> None:
        super().__init__(source_system)
        if not isinstance(channel, str) or not channel.strip():
            raise InvalidConfirmationError(f"channel must be a non-empty channel name, got {channel!r}")
        if timeout <= 0:
            raise InvalidConfirmationError(f"timeout must be positive, got {timeout!r}")
        self.channel = channel
        self.timeout = timeout
        self._config = select_channels(dict(config or {}), (), [channel])
        self._environ = environ
        self._app: MessagingApp | None = None
        self._emitter: Emitter[Any] | None = None
        self._lock: asyncio.Lock | None = None

    @property
    def app(self) -> MessagingApp | None:
        """The messaging application of the channel once connected (tests read the in-memory sink from it)."""
        return self._app

    async def _connected(self) -> Emitter[Any]:
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            if self._emitter is None:
                app = MessagingApp(self._config, environ=self._environ)
                app.register_connector("in-memory", app.connector("memory"))
                emitter = app.emitter(self.channel, overflow=OnOverflow.UNBOUNDED_BUFFER)
                try:
                    await app.start()
                except Exception as error:
                    raise ConfirmationSendError(f"channel {self.channel}: {error}") from error
                self._app, self._emitter = app, emitter
            return self._emitter

    async def confirm(self, request: ConfirmationRequest) -> None:
        """Publish the confirmation once; raise :class:`~confirmation.ConfirmationSendError` unless confirmed."""
        emitter = await self._connected()
        body = request.to_json()
        confirmation_id = f"{body['messageId']}:{body['finishedAt'] or body['state']}"
        metadata = AmqpOutgoingMetadata(message_id=confirmation_id, correlation_id=request.correlation_id,
                                        content_type="application/json",
                                        headers={CONFIRMATION_HEADER: confirmation_id})
        try:
            sent = emitter.send(Message(json.dumps(body, separators=(",", ":")), (metadata,)))
            future = sent if isinstance(sent, asyncio.Future) else asyncio.wrap_future(sent)
            await asyncio.wait_for(future, self.timeout)
        except Exception as error:
            text = " ".join(str(error).split())[:300] or type(error).__name__
            raise ConfirmationSendError(f"channel {self.channel}: {type(error).__name__}: {text}") from error

    async def aclose(self) -> None:
        """Close the channel's connection."""
        if self._app is not None:
            await self._app.stop()
            self._app, self._emitter = None, None
