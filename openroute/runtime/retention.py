"""Retention of final messages: how long each final state is kept, and the job that deletes the older ones.

Without Spark, a node deletes final messages (OK, FAILED, SKIPPED, CANCEL) older than their state's keep time
(by last update), in batches, with everything stored about them: external calls, confirmations and transitions
go with them (``ON DELETE CASCADE``), child messages with their parent. A parent is kept while one of its children
is not final; children are never deleted on their own. On PostgreSQL a transaction-scoped advisory lock makes one
node delete at a time (the others skip that run); SQLite's write lock serialises anyway::

    from datetime import timedelta
    from openroute.runtime.retention import RetentionJob, RetentionPolicy

    policy = RetentionPolicy(keep={"OK": timedelta(days=7), "FAILED": timedelta(days=30)})
    deleted = RetentionJob(store, policy).run_once()   # {MessageState.OK: 120, ...}

States without a keep time are kept forever. An app built with ``create_app(..., retention=policy)`` runs the job
every ``interval`` for as long as it lives; the deleted messages are counted in ``/metrics`` as
``openroute_retention_deleted_total{state=...}``.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa

from openroute.definitions.errors import ConfigurationError
from openroute.persistence import FINAL_STATES, MessageState, MessageStore, funnel_lock_table, message_table
from openroute.persistence.outage import StoreOutage, run_passes

log = logging.getLogger("openroute.retention")

#: the PostgreSQL advisory lock key of the retention job ("openrout" in ASCII)
ADVISORY_LOCK_KEY = 0x6F70656E726F7574


@dataclass(frozen=True)
class RetentionPolicy:
    """How long final messages are kept, per state (by their last update); states left out are kept forever."""

    #: final state -> keep time (names or MessageState keys)
    keep: Mapping[Any, timedelta] = field(default_factory=dict)
    #: messages deleted per transaction
    batch_size: int = 1000
    #: how often the job runs on a server
    interval: timedelta = timedelta(hours=1)
    #: at most this many batches per run (the rest waits for the next run)
    max_batches: int = 100

    def __post_init__(self) -> None:
        problems = []
        parsed: dict[MessageState, timedelta] = {}
        for key, value in dict(self.keep).items():
            try:
                state = MessageState(str(key).upper())
            except ValueError:
                problems.append(f"keep: unknown state {key!r}")
                continue
            if state not in FINAL_STATES:
                problems.append(f"keep: {state.value} is not final; only OK, FAILED, SKIPPED, CANCEL are deleted")
            elif not isinstance(value, timedelta) or value < timedelta(0):
                problems.append(f"keep.{state.value} must be a non-negative timedelta, got {value!r}")
            else:
                parsed[state] = value
        if not isinstance(self.batch_size, int) or self.batch_size < 1:
            problems.append(f"batch_size must be >= 1, got {self.batch_size!r}")
        if not isinstance(self.max_batches, int) or self.max_batches < 1:
            problems.append(f"max_batches must be >= 1, got {self.max_batches!r}")
        if not isinstance(self.interval, timedelta) or self.interval <= timedelta(0):
            problems.append(f"interval must be a positive timedelta, got {self.interval!r}")
        if problems:
            raise ConfigurationError("retention: " + "; ".join(problems))
        object.__setattr__(self, "keep", parsed)


class RetentionJob:
    """Deletes the final messages ``policy`` no longer keeps (see the module docstring).

    ``registry`` (a prometheus ``CollectorRegistry``, e.g. ``Metrics.registry``) gets the
    ``openroute_retention_deleted_total`` counter; ``now`` defaults to the system clock.
    """

    def __init__(self, store: MessageStore, policy: RetentionPolicy, *, registry: Any = None,
                 now: Callable[[], datetime] | None = None) -> None:
        from datetime import UTC

        self.store = store
        self.policy = policy
        self._now = now or (lambda: datetime.now(UTC))
        self.deleted: Counter[MessageState] = Counter()
        #: whether the job's runs find the store unreachable (persistence/outage.py)
        self.outage = StoreOutage.of_loop("retention job")
        self._counter = None
        if registry is not None:
            from prometheus_client import Counter as PromCounter

            self._counter = PromCounter("openroute_retention_deleted", "Final messages deleted by the retention job",
                                        ["state"], registry=registry)

    def _candidates(self, connection: sa.Connection, now: datetime) -> sa.Select[Any]:
        c = message_table.c
        child = message_table.alias("child")
        by_state = [sa.and_(c.state == state, c.last_update_ts < now - keep)
                    for state, keep in self.policy.keep.items()]
        open_child = sa.exists().where(child.c.parent_id == c.id, child.c.state.not_in(FINAL_STATES))
        return (sa.select(c.id, c.state).where(c.parent_id.is_(None), sa.or_(*by_state), ~open_child)
                .order_by(c.last_update_ts).limit(self.policy.batch_size))

    def delete_batch(self, now: datetime | None = None) -> dict[MessageState, int] | None:
        """Delete one batch in one transaction; the count per state (empty: nothing left), None when another
        node holds the job's lock."""
        if not self.policy.keep:
            return {}
        now = now or self._now()
        c = message_table.c
        with self.store.begin() as connection:
            if connection.dialect.name == "postgresql":
                locked = connection.execute(sa.select(sa.func.pg_try_advisory_xact_lock(ADVISORY_LOCK_KEY)))
                if not locked.scalar_one():
                    return None
            rows = connection.execute(self._candidates(connection, now)).all()
            if not rows:
                return {}
            ids = [row.id for row in rows]
            children = connection.execute(sa.select(c.id).where(c.parent_id.in_(ids))).scalars().all()
            everything = [*children, *ids]
            connection.execute(sa.delete(funnel_lock_table).where(funnel_lock_table.c.message_id.in_(everything)))
            if children:
                connection.execute(sa.delete(message_table).where(c.id.in_(children)))
            connection.execute(sa.delete(message_table).where(c.id.in_(ids)))
        counts = Counter(MessageState(row.state) for row in rows)
        self.deleted.update(counts)
        if self._counter is not None:
            for state, count in counts.items():
                self._counter.labels(state.value).inc(count)
        log.info("retention deleted %d messages (%d children with them): %s", len(ids), len(children),
                 {s.value: n for s, n in counts.items()})
        return dict(counts)

    def run_once(self) -> dict[MessageState, int]:
        """Delete batches until nothing is left, another node holds the lock, or ``max_batches`` ran."""
        total: Counter[MessageState] = Counter()
        now = self._now()
        for _ in range(self.policy.max_batches):
            batch = self.delete_batch(now)
            if not batch:
                break
            total.update(batch)
        return dict(total)

    async def run(self, stop: asyncio.Event) -> None:
        """Run :meth:`run_once` every ``policy.interval`` (in a worker thread) until ``stop`` is set; while the store
        is unreachable the log gets one WARNING, one INFO when it is back (``self.outage``), and the runs back off."""
        await run_passes(lambda: asyncio.to_thread(self.run_once), self.policy.interval.total_seconds(), stop,
                         self.outage, "retention run failed; retried at the next interval", log)
