"""Confirmation over a broker channel: the confirmation published to an outgoing channel of the messaging layer
(RabbitMQ through the ``amqp`` connector, publisher confirms), as one more :class:`ExternalSystemConfirmation`.

The confirmation row is written in the final state's transaction and sent after the commit by the
:class:`~confirmation.ConfirmationService`, retried on its schedule until the broker confirmed the publish (the
same persist, publish after commit, retry, at-least-once discipline as the outcome-event outbox). The body is
:meth:`ConfirmationRequest.to_json`; the AMQP ``message_id`` and the ``x-openroute-confirmation-id`` header carry a
stable confirmation id (``<messageId>:<finishedAt>``): a confirmation sent again has the same id.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Protocol

from openroute.confirmation.callbacks import ExternalSystemConfirmation
from openroute.confirmation.model import ConfirmationRequest, ConfirmationSendError, InvalidConfirmationError

__all__ = ["CONFIRMATION_HEADER", "ChannelConfirmation", "ChannelPort"]

CONFIRMATION_HEADER = "x-openroute-confirmation-id"


class ChannelPort(Protocol):
    """The broker channels a :class:`ChannelConfirmation` publishes through, given by whoever builds it (the
    messaging layer's ``openroute.messaging.publisher.ChannelPublisher``: this package imports only the store)."""

    async def publish(self, channel: str, body: str, *, message_id: str, headers: Mapping[str, str],
                      timeout: float, correlation_id: str | None = None) -> None:
        """Publish ``body`` to ``channel``; return once the broker confirmed it, raise otherwise."""

    async def stop(self) -> None:
        """Close the channels' connections."""


class ChannelConfirmation(ExternalSystemConfirmation):
    """Confirms ``source_system``'s messages by publishing to the outgoing ``channel`` of ``channels`` (e.g.
    ``ChannelPublisher(config, [channel])`` of ``openroute.messaging.publisher``, configured by
    ``openroute.messaging.outgoing.<channel>.connector`` = ``amqp`` or ``in-memory``, its queue or exchange).

    The channel connects on the first confirmation; a publish the broker refuses or does not confirm within
    ``timeout`` seconds raises :class:`~confirmation.ConfirmationSendError` (retried by the service).
    """

    def __init__(self, source_system: str, channel: str, channels: ChannelPort, *, timeout: float = 10.0) -> None:
        super().__init__(source_system)
        if not isinstance(channel, str) or not channel.strip():
            raise InvalidConfirmationError(f"channel must be a non-empty channel name, got {channel!r}")
        if timeout <= 0:
            raise InvalidConfirmationError(f"timeout must be positive, got {timeout!r}")
        self.channel = channel
        self.timeout = timeout
        self.channels = channels

    @property
    def app(self) -> Any:
        """The messaging application of the channel (tests read the in-memory sink from it), when the port has
        one."""
        return getattr(self.channels, "app", None)

    async def confirm(self, request: ConfirmationRequest) -> None:
        """Publish the confirmation once; raise :class:`~confirmation.ConfirmationSendError` unless confirmed."""
        body = request.to_json()
        confirmation_id = f"{body['messageId']}:{body['finishedAt'] or body['state']}"
        try:
            await self.channels.publish(self.channel, json.dumps(body, separators=(",", ":")),
                                        message_id=confirmation_id, headers={CONFIRMATION_HEADER: confirmation_id},
                                        timeout=self.timeout, correlation_id=request.correlation_id)
        except Exception as error:
            text = " ".join(str(error).split())[:300] or type(error).__name__
            raise ConfirmationSendError(f"channel {self.channel}: {type(error).__name__}: {text}") from error

    async def aclose(self) -> None:
        """Close the channel's connection."""
        await self.channels.stop()
