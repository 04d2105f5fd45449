"""Connector SPI: named factories that turn a channel's configuration into a publisher or a subscriber.

A connector is registered on an application under a name (``MessagingApp(connectors={"name": factory})`` or
``app.register_connector``); a channel uses it with ``openroute.messaging.incoming.<channel>.connector=<name>``
(or ``outgoing``). The built-in ``memory`` and ``amqp`` connectors are registered on every application.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar

from openroute.messaging.config import ChannelConfig
from openroute.messaging.message import Message
from openroute.streams import PublisherBuilder, SubscriberBuilder
from openroute.streams.protocol import Publisher, Subscriber


class IncomingConnectorFactory(ABC):
    """Creates the publisher of messages for an incoming channel (broker -> application)."""

    #: attributes a channel using this connector must set (checked at assembly: ``DeploymentError``).
    incoming_mandatory: ClassVar[tuple[str, ...]] = ()

    @abstractmethod
    async def create_publisher(self, config: ChannelConfig) -> Publisher[Message[Any]] | PublisherBuilder[Any]:
        """The channel's source; messages it emits carry the connector's ack/nack."""

    async def close(self) -> None:
        """Release connections (called by ``MessagingApp.stop``)."""


class OutgoingConnectorFactory(ABC):
    """Creates the subscriber of messages for an outgoing channel (application -> broker)."""

    outgoing_mandatory: ClassVar[tuple[str, ...]] = ()

    @abstractmethod
    async def create_subscriber(self, config: ChannelConfig) -> Subscriber[Message[Any]] | SubscriberBuilder[Any, Any]:
        """The channel's sink; it acks each message once the message is safely handed over."""

    async def close(self) -> None:
        """Release connections (called by ``MessagingApp.stop``)."""


ConnectorFactory = IncomingConnectorFactory | OutgoingConnectorFactory
