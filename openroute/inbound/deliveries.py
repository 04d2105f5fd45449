"""What the broker channels feeding routes did: each channel's deliveries by outcome and the last one refused.

:class:`~openroute.inbound.channel.ChannelInbound` counts them (``stats``, ``deliveries``, ``reports``); ``/metrics``
exposes them as ``openroute_channel_deliveries_total{channel, outcome}`` and the console's dashboard shows them.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from datetime import datetime

__all__ = ["ChannelReport", "ChannelStats", "DeliveryOutcome"]


class DeliveryOutcome(enum.StrEnum):
    """What became of one delivery of a channel (the ``outcome`` label of ``openroute_channel_deliveries_total``)."""

    #: stored NEW, then acked
    ACCEPTED = "accepted"
    #: its source system and correlation id were stored already: acked, no second row
    DUPLICATE = "duplicate"
    #: it can never be stored: published to the dead-letter channel with the reason, then acked
    DEAD_LETTERED = "dead_lettered"
    #: it can never be stored and no dead-letter channel is set: rejected without requeue (the queue's own
    #: dead-letter exchange, if any, gets it)
    REJECTED = "rejected"
    #: not stored now (the store failed, the node does not accept): given back to the queue for redelivery
    REQUEUED = "requeued"


@dataclass
class ChannelStats:
    """What one channel did since the node started it: its deliveries by outcome and the last one refused."""

    accepted: int = 0
    duplicates: int = 0
    dead_lettered: int = 0
    rejected: int = 0
    requeued: int = 0
    #: the last delivery dead-lettered or rejected: when, its error code and the reason (one line)
    last_refused_at: datetime | None = None
    last_refused_code: str | None = None
    last_refused_reason: str | None = None

    def by_outcome(self) -> dict[DeliveryOutcome, int]:
        """The counts by :class:`DeliveryOutcome`, every outcome listed (0 when none)."""
        return {DeliveryOutcome.ACCEPTED: self.accepted, DeliveryOutcome.DUPLICATE: self.duplicates,
                DeliveryOutcome.DEAD_LETTERED: self.dead_lettered, DeliveryOutcome.REJECTED: self.rejected,
                DeliveryOutcome.REQUEUED: self.requeued}

    def refused(self, at: datetime, code: str, reason: str) -> None:
        """Remember the delivery just dead-lettered or rejected."""
        self.last_refused_at, self.last_refused_code, self.last_refused_reason = at, code, reason


@dataclass(frozen=True)
class ChannelReport:
    """One channel of this node as the console shows it: what it feeds, where, its state and its counters."""

    channel: str
    service: str
    operation: str
    connector: str
    dead_letter_channel: str | None
    #: ``connected``, ``disconnected`` or ``stopped`` (as ``/health`` says)
    state: str
    stats: ChannelStats
