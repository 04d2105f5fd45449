"""Reactive Messaging: channels, incoming/outgoing functions, messages and acks, emitters, connectors.

``from openroute.messaging import MessagingApp, Message, Emitter, OnOverflow, Acknowledgment``; see
docs/messaging.md.
"""

from openroute.messaging.app import ChannelPublisher, MessagingApp
from openroute.messaging.config import ChannelConfig, ConfigError, MessagingConfig
from openroute.messaging.connector import IncomingConnectorFactory, OutgoingConnectorFactory
from openroute.messaging.emitter import DEFAULT_BUFFER_SIZE, Emitter, OnOverflow
from openroute.messaging.errors import (
    ChannelClosedError,
    DefinitionError,
    DeploymentError,
    EmitterOverflowError,
    MessageDroppedError,
    RedeliverError,
)
from openroute.messaging.memory import InMemoryConnector, InMemorySink, InMemorySource
from openroute.messaging.message import Acknowledgment, Message, Metadata

__all__ = [
    "DEFAULT_BUFFER_SIZE",
    "Acknowledgment",
    "ChannelClosedError",
    "ChannelConfig",
    "ChannelPublisher",
    "ConfigError",
    "DefinitionError",
    "DeploymentError",
    "Emitter",
    "EmitterOverflowError",
    "InMemoryConnector",
    "InMemorySink",
    "InMemorySource",
    "IncomingConnectorFactory",
    "Message",
    "MessageDroppedError",
    "MessagingApp",
    "MessagingConfig",
    "Metadata",
    "OnOverflow",
    "OutgoingConnectorFactory",
    "RedeliverError",
]
