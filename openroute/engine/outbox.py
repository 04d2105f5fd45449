"""Outcome events through an outbox: a message's final state, told to other systems on a channel.

Two halves:

* :class:`OutboxWriter` is a final-state *transaction* hook of the engine: in the very transaction that makes a
  message final (with its ``message_transition`` row) it inserts one ``outbox`` row per matching
  :class:`OutcomeEvents` rule. A change that is rolled back leaves no event; a committed one always has its event.
  Registered only when some rule exists, so a node that publishes nothing pays nothing.
* :class:`OutboxPublisher` is an engine service: it leases due rows (one node at a time per row: ``FOR UPDATE SKIP
  LOCKED`` on PostgreSQL, and a lease that a dead node's rows outlive), publishes each to its channel through the
  messaging layer (AMQP: publisher confirms), deletes a row only after the broker confirmed it, and postpones a
  failed one with a growing back-off. Delivery is at least once; a redelivered event carries the same
  ``eventId``; the events of one message are published in the order they were written.

The event body (JSON) is documented in docs/channels.md (:func:`event_body`).
"""

from __future__ import annotations

import asyncio
import fnmatch
import json
import logging
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa

from openroute.definitions.clock import Clock, SystemClock
from openroute.definitions.errors import ConfigurationError
from openroute.messaging import MessagingApp, MessagingConfig
from openroute.messaging.publisher import ChannelPublisher
from openroute.persistence import MessageState, MessageStore, StoredMessage, mask_secrets
from openroute.persistence.delivery import DeliverySender, Leases, backoff
from openroute.persistence.models import FINAL_STATES
from openroute.persistence.outage import StoreOutage
from openroute.persistence.outbox import OutboxEvent, OutboxRows, add_events

__all__ = ["EVENT_HEADER", "OutboxPublisher", "OutboxWriter", "OutcomeEvents", "event_body", "outcome_rules"]

log = logging.getLogger("openroute.engine.outbox")

#: the AMQP header (and message id) carrying the event's stable id
EVENT_HEADER = "x-openroute-event-id"


@dataclass(frozen=True)
class OutcomeEvents:
    """Publish the ``states`` (final states; default all four) of the messages of ``routes`` (``service/operation``
    patterns with ``*``; default every route) to the outgoing channel ``channel``."""

    channel: str
    states: frozenset[MessageState] = FINAL_STATES
    routes: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.channel, str) or not self.channel.strip():
            raise ConfigurationError(f"outcome events need a channel name, got {self.channel!r}")
        states = frozenset(MessageState(s) for s in self.states)
        if not states or not states <= FINAL_STATES:
            raise ConfigurationError(f"outgoing channel '{self.channel}': outcome events are published for final "
                                     f"states (OK, FAILED, SKIPPED, CANCEL), got {sorted(s.value for s in states)}")
        object.__setattr__(self, "states", states)
        object.__setattr__(self, "routes", tuple(self.routes))

    def matches(self, message: StoredMessage) -> bool:
        """True when ``message`` (just made final) is published by this rule."""
        if message.state not in self.states:
            return False
        if not self.routes:
            return True
        key = f"{message.service}/{message.operation}"
        return any(fnmatch.fnmatchcase(key, pattern) for pattern in self.routes)


def outcome_rules(config: Mapping[str, Any] | MessagingConfig) -> list[OutcomeEvents]:
    """The rules in a messaging configuration: every outgoing channel with an ``outcome-events`` attribute
    (``"final"`` or a comma-separated list of final states) and optionally ``outcome-routes`` (comma-separated
    ``service/operation`` patterns). Raises ConfigurationError naming the channel for a bad value."""
    messaging = config if isinstance(config, MessagingConfig) else MessagingConfig(config, environ={})
    rules = []
    for name in sorted(messaging.names("outgoing")):
        channel = messaging.channel("outgoing", name)
        raw = channel.get("outcome-events")
        if raw in (None, "", False):
            continue
        values = raw if isinstance(raw, list) else ("final" if raw is True else str(raw)).split(",")
        words = [str(v).strip().upper() for v in values if str(v).strip()]
        try:
            states = FINAL_STATES if words in (["FINAL"], ["TRUE"]) else frozenset(MessageState(w) for w in words)
        except ValueError as error:
            raise ConfigurationError(f"outgoing channel '{name}': outcome-events: {error}") from None
        routes_raw = channel.get("outcome-routes") or []
        routes = routes_raw if isinstance(routes_raw, list) else str(routes_raw).split(",")
        rules.append(OutcomeEvents(name, states, tuple(str(r).strip() for r in routes if str(r).strip())))
    return rules


def event_body(message: StoredMessage, event_id: str) -> dict[str, Any]:
    """The JSON body of the event telling that ``message`` reached its (final) state."""
    return {
        "eventId": event_id,
        "messageId": message.id,
        "correlationId": message.correlation_id,
        "sourceSystem": message.source_system,
        "processId": message.process_id,
        "service": message.service,
        "operation": message.operation,
        "objectId": message.object_id,
        "entityType": message.entity_type,
        "state": message.state.value,
        "errorCode": message.last_error_code,
        # stored masked; a row from before that is masked here (every consumer of the events reads it)
        "errorText": None if message.last_error_text is None else mask_secrets(message.last_error_text),
        "failedCount": message.failed_count,
        "at": message.last_update_ts.isoformat(),
    }


class OutboxWriter:
    """The final-state transaction hook writing the outbox rows of ``rules`` (see the module docstring)."""

    def __init__(self, rules: Iterable[OutcomeEvents]) -> None:
        self.rules = tuple(rules)

    def __call__(self, message: StoredMessage, connection: sa.Connection) -> None:
        """Write the outcome events of the rules ``message`` matches, in the transaction that made it final."""
        rows = []
        for rule in self.rules:
            if rule.matches(message):
                event_id = str(uuid.uuid4())
                rows.append({"event_id": event_id, "channel": rule.channel, "message_id": message.id,
                             "payload": json.dumps(event_body(message, event_id), separators=(",", ":")),
                             "created_at": message.last_update_ts})
        add_events(connection, rows)


@dataclass(frozen=True)
class OutboxSettings:
    """How the publisher works: rows leased per round, lease length, polling interval (it is also woken by every
    final state), back-off of a failed publish (doubled per attempt up to ``max_backoff``), confirm timeout."""

    batch: int = 256
    lease: timedelta = timedelta(seconds=60)
    interval: float = 1.0
    backoff: timedelta = timedelta(seconds=1)
    max_backoff: timedelta = timedelta(minutes=5)
    confirm_timeout: float = 30.0

    def __post_init__(self) -> None:
        if self.batch < 1 or self.interval <= 0 or self.confirm_timeout <= 0:
            raise ConfigurationError("outbox: batch, interval and confirm_timeout must be positive")
        if self.lease <= timedelta(0) or self.backoff <= timedelta(0) or self.max_backoff < self.backoff:
            raise ConfigurationError("outbox: lease and backoff must be positive, max_backoff >= backoff")


@dataclass
class OutboxStats:
    """What one publisher did since start."""

    published: int = 0
    failed: int = 0
    rounds: int = 0
    #: rounds that could not lease or settle (the store unreachable): their events stay in the outbox
    failed_rounds: int = 0
    by_channel: dict[str, int] = field(default_factory=dict)


class OutboxPublisher:
    """Publishes the outbox rows of ``store`` to the channels of ``rules``, configured by ``config`` (the
    ``openroute.messaging.*`` keys: each rule's channel is an outgoing channel with a connector; ``environ``: the
    environment the messaging layer reads, default ``os.environ``).

    :meth:`writer` is the transaction hook to give the engine; :meth:`wake` (e.g. a final-state hook) starts a
    round at once; :meth:`run` publishes until its ``stop`` event is set.
    """

    def __init__(
        self,
        store: MessageStore,
        rules: Sequence[OutcomeEvents],
        config: Mapping[str, Any] | MessagingConfig | None = None,
        *,
        node_id: str,
        settings: OutboxSettings | None = None,
        clock: Clock | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        if not rules:
            raise ConfigurationError("an outbox publisher needs at least one OutcomeEvents rule")
        self.store = store
        self.rules = tuple(rules)
        self.node_id = node_id
        self.settings = settings or OutboxSettings()
        self.clock = clock or SystemClock()
        self.stats = OutboxStats()
        #: the rules' channels (the messaging layer's port of the delivery family)
        self.channels = ChannelPublisher(config, [rule.channel for rule in self.rules], environ=environ)
        _ = self.channels.app  # made now, so that a channel the messaging layer cannot configure fails here
        self._wake = asyncio.Event()
        #: the delivery family's sender over the outbox rows (persistence/delivery.py)
        self._sender = DeliverySender(Leases(store.engine, OutboxRows(), node_id), self._retry_at, self.clock.now,
                                      self._lease)
        #: whether the rounds find the store unreachable (persistence/outage.py)
        self.outage = StoreOutage.of_loop("outbox publisher")

    def _lease(self) -> timedelta:
        return self.settings.lease

    def _retry_at(self, event: OutboxEvent, now: datetime) -> datetime:
        """A failed publish is due again after a back-off doubled per failed attempt (never given up)."""
        return now + backoff(self.settings.backoff, event.attempts, self.settings.max_backoff)

    def writer(self) -> OutboxWriter:
        """The engine's final-state transaction hook for these rules."""
        return OutboxWriter(self.rules)

    async def on_final_state(self, _message: StoredMessage) -> None:
        """A final-state hook (after the commit): publish without waiting for the next poll."""
        self._wake.set()

    def wake(self) -> None:
        """Start a round now."""
        self._wake.set()

    async def start(self) -> None:
        """Take back the leases a previous run of this node held (it was killed while publishing: those events are
        due now, not after the lease), then connect the channels (raises the messaging layer's DeploymentError when
        a broker cannot be reached)."""
        now = self.clock.now()
        released = await asyncio.get_running_loop().run_in_executor(None, self._sender.leases.release, now, now)
        if released:
            log.info("outbox: %d events leased by an earlier run of node %s are due again", released, self.node_id)
        await self.channels.start()

    async def stop(self) -> None:
        """Close the channels (a round in flight should be over: :meth:`run` returned)."""
        await self.channels.stop()

    @property
    def app(self) -> MessagingApp:
        """The messaging application of the rules' channels (tests and the demo read the in-memory sinks)."""
        return self.channels.app

    async def run(self, stop: asyncio.Event) -> None:
        """Publish rounds until ``stop`` is set: after each final state (see :meth:`on_final_state`) or every
        ``settings.interval`` seconds. A failing round is logged in one line and retried at the next; while the store
        is unreachable the log gets one WARNING, one INFO when it is back (``self.outage``), and the rounds back off
        (a final state's wake-up does not shorten the wait: there is none while the store is away)."""
        while not stop.is_set():
            try:
                published = await self.publish_once()
            except Exception as error:
                self.stats.failed_rounds += 1
                if not self.outage.failed(error):
                    log.warning("outbox round failed (%s: %s); retried in %.1f s", type(error).__name__,
                                " ".join(str(error).split())[:300], self.settings.interval)
                published = 0
            else:
                self.outage.succeeded()
            if published >= self.settings.batch:
                continue  # more may be due
            self._wake.clear()
            waiters = [asyncio.ensure_future(self._wake.wait()), asyncio.ensure_future(stop.wait())]
            await asyncio.wait(waiters, timeout=self.outage.delay(self.settings.interval),
                               return_when=asyncio.FIRST_COMPLETED)
            for waiter in waiters:
                waiter.cancel()

    async def publish_once(self) -> int:
        """One round: lease due events, publish them, delete the confirmed ones and postpone the others; returns
        how many were confirmed."""
        loop = asyncio.get_running_loop()
        claimed = await loop.run_in_executor(None, self._sender.claim, self.clock.now(), self.settings.batch)
        events = claimed.claims
        if not events:
            return 0
        self.stats.rounds += 1
        outcomes = await self._sender.round(events, self._publish)
        confirmed = [event.id for event, error in zip(events, outcomes, strict=True) if error is None]
        failed = [(event, error) for event, error in zip(events, outcomes, strict=True) if error is not None]
        self.stats.published += len(confirmed)
        self.stats.failed += len(failed)
        for event, error in zip(events, outcomes, strict=True):
            if error is None:
                self.stats.by_channel[event.channel] = self.stats.by_channel.get(event.channel, 0) + 1
        for event, error in failed:
            log.warning("outcome event %s of message %s to %s not confirmed (%s); attempt %d, retried later",
                        event.event_id, event.message_id, event.channel, error, event.attempts + 1)
        return len(confirmed)

    async def _publish(self, event: OutboxEvent) -> str | None:
        """Publish one event; None once the broker confirmed it, else the reason (one line)."""
        headers = {EVENT_HEADER: event.event_id, "x-openroute-message-id": str(event.message_id)}
        try:
            await self.channels.publish(event.channel, event.payload, message_id=event.event_id, headers=headers,
                                        timeout=self.settings.confirm_timeout)
        except LookupError as error:  # not one of this node's channels
            return str(error)
        except Exception as error:
            return f"{type(error).__name__}: {' '.join(str(error).split())[:300]}"
        return None
