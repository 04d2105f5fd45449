"""Funnels (``store.funnels``): at most one message of a funnel value PROCESSING at a time, the order check of
guaranteed-order routes, and the queue of the messages waiting for a funnel.

A message that finds its funnel held waits in the funnel's queue: POSTPONED with error code FUNNEL and no due time
(the partial index ``ix_message_funnel_queue`` holds the queue in receive order). The transaction that frees the
funnel reads :meth:`FunnelStore.holder` (under the funnel row's lock, like :meth:`FunnelStore.acquire`), then
:meth:`FunnelStore.queue_head`, and hands the funnel to that one message: the lock orders a release and a
concurrent wait, so no waiting message is missed and none is woken twice.
"""

from __future__ import annotations

from datetime import datetime
from typing import cast

import sqlalchemy as sa
from openroute.persistence.database import StorePart
from openroute.persistence.messages import StoredMessage, row_to_message
from openroute.persistence.models import (
    FINAL_STATES,
    FUNNEL_QUEUE_PREDICATE,
    FUNNEL_WAIT_CODE,
    MessageState,
    funnel_lock_table,
    message_table,
)

__all__ = ["FunnelStore"]


class FunnelStore(StorePart):
    """The ``funnel_lock`` table of ``database`` and the funnel queries over its messages."""

    def older_unfinished(self, message: StoredMessage, connection: sa.Connection | None = None) -> int | None:
        """The id of an older (receive time, then id) message of the same funnel value that is not final."""
        if message.funnel_value is None:
            return None
        c = message_table.c
        query = sa.select(c.id).where(
            c.funnel_value == message.funnel_value,
            c.state.not_in(list(FINAL_STATES)),
            c.id != message.id,
            sa.or_(c.receive_ts < message.receive_ts, sa.and_(c.receive_ts == message.receive_ts, c.id < message.id)),
        ).order_by(c.receive_ts, c.id).limit(1)
        return self.database.run(lambda conn: conn.execute(query).scalar(), connection)

    def acquire(
        self, funnel_value: str, message_id: int, now: datetime, connection: sa.Connection | None = None
    ) -> int | None:
        """Make ``message_id`` the one message of ``funnel_value`` allowed to be PROCESSING.

        Returns None when it holds the funnel now, else the id of the PROCESSING message that holds it.
        The previous holder is replaced only when it is no longer PROCESSING. The funnel row is read under its
        row lock (PostgreSQL ``FOR UPDATE``; SQLite's write lock serialises anyway), so the holder's check and
        a concurrent takeover cannot interleave: of two concurrent takers exactly one wins, and a holder
        claimed again while another message takes its funnel over waits for that takeover and sees it.
        """
        f = funnel_lock_table.c
        m = message_table.c
        query = self.database.locked(sa.select(f.message_id).where(f.funnel_value == funnel_value))

        def work(conn: sa.Connection) -> int | None:
            holder = conn.execute(query).scalar()
            if holder is None:
                inserted = conn.execute(
                    self.database.upsert(funnel_lock_table)
                    .values(funnel_value=funnel_value, message_id=message_id, acquired_at=now)
                    .on_conflict_do_nothing(index_elements=["funnel_value"])
                    .returning(f.funnel_value)
                ).scalar()
                if inserted is not None:
                    return None
                holder = conn.execute(query).scalar()
            if holder == message_id:
                return None
            state = conn.execute(sa.select(m.state).where(m.id == holder)).scalar()
            if state == MessageState.PROCESSING:
                return int(cast(int, holder))
            taken = conn.execute(
                sa.update(funnel_lock_table)
                .where(f.funnel_value == funnel_value, f.message_id == holder)
                .values(message_id=message_id, acquired_at=now)
            ).rowcount
            return None if taken == 1 else int(cast(int, holder))

        return self.database.run(work, connection)

    def holder(self, funnel_value: str, connection: sa.Connection | None = None) -> int | None:
        """The PROCESSING message holding ``funnel_value``, read under the funnel row's lock (one statement); None when
        it is free."""
        f, m = funnel_lock_table.c, message_table.c
        query = (sa.select(f.message_id, m.state).select_from(
            funnel_lock_table.outerjoin(message_table, m.id == f.message_id)).where(f.funnel_value == funnel_value))
        if self.database.dialect == "postgresql":
            query = query.with_for_update(of=funnel_lock_table)

        def work(conn: sa.Connection) -> int | None:
            found = conn.execute(query).first()
            if found is None or found.message_id is None or found.state != MessageState.PROCESSING:
                return None
            return int(found.message_id)

        return self.database.run(work, connection)

    def hand_to(self, funnel_value: str, message_id: int, now: datetime,
                connection: sa.Connection | None = None) -> None:
        """Make ``message_id`` the holder of ``funnel_value`` (the caller read the row under its lock: a release's
        hand-off, :meth:`holder`)."""
        f = funnel_lock_table.c
        statement = (sa.update(funnel_lock_table).where(f.funnel_value == funnel_value)
                     .values(message_id=message_id, acquired_at=now))

        def work(conn: sa.Connection) -> None:
            if conn.execute(statement).rowcount == 0:  # no row yet (a queue its holder never took): take it
                self.acquire(funnel_value, message_id, now, conn)

        self.database.run(work, connection)

    def queue_head(self, funnel_value: str, connection: sa.Connection | None = None) -> StoredMessage | None:
        """The oldest message (receive time, then id) waiting in ``funnel_value``'s queue, or None."""
        c = message_table.c
        query = (sa.select(message_table).where(c.funnel_value == funnel_value, sa.text(FUNNEL_QUEUE_PREDICATE))
                 .order_by(c.receive_ts, c.id).limit(1))
        found = self.database.run(lambda conn: conn.execute(query).first(), connection)
        return None if found is None else row_to_message(found)

    def stalled(self, limit: int, now: datetime, connection: sa.Connection | None = None) -> list[str]:
        """Funnel values whose queue holds messages while no message of the value is PROCESSING (its holder's node
        died and was repaired, a release that found the head busy): the repoll's safety net hands them on.

        A queue with a message of its value about to run (NEW, or due by ``now``) is not stalled: that message takes
        the funnel when it is claimed (the oldest of each value a breaker's close made due, say). Handing the funnel
        to the queue's head instead would run the queue before it and send it to the queue behind that head."""
        waiting = message_table.alias("waiting")
        other = message_table.alias("other")
        running = other.c.state == MessageState.PROCESSING
        coming = sa.or_(other.c.state == MessageState.NEW,
                        sa.and_(other.c.state.in_([MessageState.PARTLY_FAILED, MessageState.POSTPONED]),
                                other.c.next_attempt_at <= now))
        query = (
            sa.select(waiting.c.funnel_value).distinct()
            # literal values, so that PostgreSQL matches the partial index of the queue at any plan
            .where(waiting.c.state == sa.literal_column(f"'{MessageState.POSTPONED.value}'"),
                   waiting.c.last_error_code == sa.literal_column(f"'{FUNNEL_WAIT_CODE}'"))
            .where(~sa.exists().where(other.c.funnel_value == waiting.c.funnel_value, sa.or_(running, coming)))
            .limit(limit)
        )
        return [str(value) for value in self.database.run(lambda conn: conn.execute(query).scalars().all(),
                                                          connection)]
