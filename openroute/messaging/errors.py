"""Errors raised by the messaging layer, and :class:`OpenrouteError`, the root of every openroute error.

The root is defined here, in the lowest layer that raises openroute's own errors, so that every layer above
can build on it; import it from :mod:`openroute.definitions.errors`, which draws the whole tree.
"""

from __future__ import annotations

from collections.abc import Iterable


class OpenrouteError(Exception):
    """Base class of every error openroute raises on purpose."""


class DeploymentError(OpenrouteError):
    """The application cannot be assembled: lists every problem found (each naming its channel)."""

    def __init__(self, problems: str | Iterable[str]) -> None:
        self.problems: list[str] = [problems] if isinstance(problems, str) else list(problems)
        super().__init__("; ".join(self.problems) if len(self.problems) == 1 else
                         f"{len(self.problems)} deployment problems:\n- " + "\n- ".join(self.problems))


class DefinitionError(DeploymentError):
    """A decorated function has a shape the messaging layer cannot use (e.g. a sync consumer of ``Message``)."""


class EmitterOverflowError(OpenrouteError, RuntimeError):
    """An emitter could not accept a message under its overflow strategy (raised synchronously by ``send``)."""


class MessageDroppedError(OpenrouteError, RuntimeError):
    """Reason for the nack of a message an emitter dropped (``DROP`` / ``LATEST`` overflow strategies)."""


class ChannelClosedError(OpenrouteError, RuntimeError):
    """The channel was cancelled, completed or stopped before the message could be delivered."""


class RedeliverError(OpenrouteError, RuntimeError):
    """A nack reason asking the source connector to give the message back for redelivery (AMQP: reject with
    requeue), whatever the channel's ``failure-strategy``: the consumer could not take it *now* (its store is down,
    its node is draining), not because the message is bad."""
