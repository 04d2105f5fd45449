"""Messages parked on an external system's open circuit breaker (``store.parking``).

A message whose call meets an OPEN breaker is POSTPONED with ``parked_on`` naming the system and no due time: it is
not claimed while the breaker stays open. A message whose call of the system failed is PARTLY_FAILED with
``parked_on`` too, due by its retry policy. When the breaker lets calls through again the engine releases them:
:meth:`ParkingStore.release` makes the oldest parked ones (receive order) due at once, one for a trial call or all of
them once the breaker is closed, with the ones that failed before it closed. The partial index
``ix_message_parked`` holds them in that order.
"""

from __future__ import annotations

from datetime import datetime

import sqlalchemy as sa
from openroute.persistence.database import StorePart
from openroute.persistence.models import FUNNEL_WAIT_CODE, PARKED_PREDICATE, MessageState, message_table

__all__ = ["ParkingStore"]


class ParkingStore(StorePart):
    """The parked messages of ``database``, by external system."""

    def release(self, system: str, now: datetime, limit: int | None = None, *,
                failed_before: datetime | None = None, connection: sa.Connection | None = None) -> int:
        """Make the oldest ``limit`` (None: every) message parked on ``system`` due at ``now``; how many were released.

        With ``failed_before`` (the time the breaker closed) the PARTLY_FAILED messages whose call of the system
        failed before then are released too (their retry is due at once, not at the policy's time); a failure after it,
        while the breaker is closed, keeps its policy's time. Released without a limit, the parked messages of one
        funnel value do not all become due to find their funnel held: the oldest of each value is due, the others go
        straight to the funnel's queue in receive order (error code FUNNEL, no due time), where the funnel's release
        hands it on one by one. Each released row leaves the parking (``parked_on`` NULL) and gets a new version, so a
        snapshot read before the release no longer claims it. On PostgreSQL rows another transaction holds are
        skipped (``SKIP LOCKED``), never waited for."""
        c = message_table.c
        waiting = c.state == sa.literal_column(f"'{MessageState.POSTPONED.value}'")
        if failed_before is not None:
            waiting = sa.or_(waiting, sa.and_(c.state == sa.literal_column(f"'{MessageState.PARTLY_FAILED.value}'"),
                                              c.last_update_ts < failed_before))
        chosen = (sa.select(c.id).where(c.parked_on == system, sa.text(PARKED_PREDICATE), waiting)
                  .order_by(c.receive_ts, c.id))
        if limit is not None:
            chosen = chosen.limit(limit)
        if self.database.dialect == "postgresql":
            chosen = chosen.with_for_update(skip_locked=True)
        due = (sa.update(message_table).where(c.id.in_(chosen.scalar_subquery()))
               .values(parked_on=None, next_attempt_at=now, version=c.version + 1))

        def work(conn: sa.Connection) -> int:
            queued = 0 if limit is not None else conn.execute(self._queue_behind_funnel_heads(system)).rowcount
            return int(queued) + int(conn.execute(due).rowcount)

        return self.database.run(work, connection)

    @staticmethod
    def _queue_behind_funnel_heads(system: str) -> sa.Update:
        """The parked messages of a funnel value but its oldest, moved to the funnel's queue (no due time)."""
        c = message_table.c
        ranked = (sa.select(c.id, sa.func.row_number().over(partition_by=c.funnel_value,
                                                             order_by=(c.receive_ts, c.id)).label("place"))
                  .where(c.parked_on == system, sa.text(PARKED_PREDICATE), c.funnel_value.is_not(None),
                         c.state == sa.literal_column(f"'{MessageState.POSTPONED.value}'"))
                  .subquery())
        behind = sa.select(ranked.c.id).where(ranked.c.place > 1)
        return (sa.update(message_table).where(c.id.in_(behind.scalar_subquery()))
                .values(parked_on=None, next_attempt_at=None, last_error_code=FUNNEL_WAIT_CODE,
                        last_error_text=sa.literal("waits for its funnel after its system came back: ")
                        + sa.func.coalesce(c.funnel_value, ""), last_error_trace=None, version=c.version + 1))

    def counts(self, connection: sa.Connection | None = None) -> dict[str, int]:
        """How many messages are parked (POSTPONED, no due time) on each system (systems with none are left out)."""
        c = message_table.c
        query = (sa.select(c.parked_on, sa.func.count())
                 .where(sa.text(PARKED_PREDICATE), c.state == sa.literal_column(f"'{MessageState.POSTPONED.value}'"))
                 .group_by(c.parked_on))
        return {str(system): int(count)
                for system, count in self.database.run(lambda conn: conn.execute(query).all(), connection)}
