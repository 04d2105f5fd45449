"""The settings of one engine node (:class:`EngineSettings`) and its counters (:class:`EngineStats`)."""

from __future__ import annotations

import os
import socket
from collections import Counter
from dataclasses import dataclass, field
from datetime import timedelta

from openroute.definitions.errors import ConfigurationError
from openroute.definitions.retry import DEFAULT_RETRY_POLICY, RetryPolicy
from openroute.definitions.route import Route
from openroute.persistence import MessageState

__all__ = ["EngineSettings", "EngineStats", "default_node_id"]


def default_node_id() -> str:
    """``host-pid``: unique per process on a host."""
    return f"{socket.gethostname()}-{os.getpid()}"


@dataclass(frozen=True)
class EngineSettings:
    """Configuration of one engine node (all intervals are configuration, none is hard-coded)."""

    node_id: str = field(default_factory=default_node_id)
    #: messages whose route runs at the same time on this node (workers). A worker is a coroutine, and it holds its
    #: slot from the claim's group commit until its outcome is handed to the writer: with 32, short routes left the
    #: node waiting on commits a third full (docs/performance.md); lower it to spare a fragile external system
    concurrency: int = 64
    #: messages queued on this node beyond the workers' ones; the bound ``queue_size + concurrency`` counts a message
    #: from its emission until its outcome is committed and its final-state hooks ran; at the bound an accepted message
    #: waits in the store (NEW) and the feeder queues it once room frees: accepting never waits for room
    queue_size: int = 256
    #: UTF-8 size limit of a payload at accept
    max_payload_bytes: int = 1024 * 1024
    #: used by routes that have no retry policy of their own
    default_retry_policy: RetryPolicy = DEFAULT_RETRY_POLICY
    #: how often the repoll job runs; None: no scheduler (call :meth:`Engine.repoll_once` yourself)
    repoll_interval: timedelta | None = timedelta(seconds=10)
    #: a message PROCESSING for longer than this is considered abandoned by a dead node and repaired
    processing_lease: timedelta = timedelta(minutes=5)
    #: a NEW message older than this is picked up by repoll (its node died between commit and emit)
    new_pickup_age: timedelta = timedelta(minutes=1)
    #: wait before retrying a message a route postponed without a delay (funnels and open breakers wait on events)
    postpone_interval: timedelta = timedelta(seconds=30)
    #: at most this many messages are picked up per repoll query
    repoll_batch: int = 1000
    #: at most this many writes share one commit
    write_batch: int = 256
    #: threads for reads and external-call records
    db_threads: int = 4
    #: how long stop() waits for messages in flight before cancelling them (they are then repaired)
    stop_timeout: float = 30.0
    #: how often the node refreshes its heartbeat row
    heartbeat_interval: timedelta = timedelta(seconds=30)
    #: seconds a sender is told to wait (``Retry-After``) while the database is unreachable
    store_retry_after: int = 5

    def __post_init__(self) -> None:
        for name in ("concurrency", "queue_size", "max_payload_bytes", "repoll_batch", "write_batch", "db_threads",
                     "store_retry_after"):
            if getattr(self, name) < 1:
                raise ConfigurationError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("processing_lease", "new_pickup_age", "postpone_interval", "heartbeat_interval"):
            if getattr(self, name) < timedelta(0):
                raise ConfigurationError(f"{name} must not be negative, got {getattr(self, name)}")
        if self.repoll_interval is not None and self.repoll_interval <= timedelta(0):
            raise ConfigurationError(f"repoll_interval must be positive or None, got {self.repoll_interval}")
        if not self.node_id or len(self.node_id) > 100:
            raise ConfigurationError(f"node_id must be 1-100 characters, got {self.node_id!r}")
        if not isinstance(self.default_retry_policy, RetryPolicy):
            raise ConfigurationError("default_retry_policy must be a RetryPolicy")
        if self.stop_timeout < 0:
            raise ConfigurationError(f"stop_timeout must not be negative, got {self.stop_timeout}")


    def retry_policy_for(self, route: Route | None) -> RetryPolicy:
        """The retry policy of ``route``'s messages: its own, else :attr:`default_retry_policy`."""
        if route is not None and route.retry_policy is not None:
            return route.retry_policy
        return self.default_retry_policy


@dataclass
class EngineStats:
    """Counters of one node since it was created."""

    accepted: int = 0
    duplicates: int = 0
    claimed: int = 0
    #: of ``claimed``: messages stored claimed in their accept's own transaction (the queue had room for them)
    claimed_at_accept: int = 0
    lost_claims: int = 0
    stale_writes: int = 0
    repaired: int = 0
    reemitted: int = 0
    outcomes: Counter[MessageState] = field(default_factory=Counter)
