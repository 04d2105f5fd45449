"""Funnels (``store.funnels``): at most one message of a funnel value PROCESSING at a time, the order check of
guaranteed-order routes, and the queue of the messages waiting for a funnel.

A message that finds its funnel held waits in the funnel's queue: POSTPONED with error code FUNNEL and no due time
(the partial index ``ix_message_funnel_queue`` holds the queue in receive order). The transaction that frees the
funnel reads :meth:`FunnelStore.holder` (under the funnel row's lock, like :meth:`FunnelStore.acquire`), then
:meth:`FunnelStore.queue_head`, and hands the funnel to that one message: the lock orders a release and a
concurrent wait, so no waiting message is missed and none is woken twice.

The ``_many`` forms do the same for a group commit's messages in a few statements whatever the group's size (a
drain's writer spent two thirds of its time in one-message funnel statements). Each locks its funnel rows in
``funnel_value`` order, as the one-message forms are called in; a transaction that holds both a claim group and a
finish group can still meet another node's in a circle, which PostgreSQL breaks by aborting one (the writer then
runs its operations one at a time).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
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

__all__ = ["FunnelShare", "FunnelStore"]


@dataclass(frozen=True)
class FunnelShare:
    """One node's share of the funnel values among the ``count`` nodes that pick up work: the values whose hash
    modulo ``count`` is ``index``. A node's feed takes the due funnel messages of its share, and those of the other
    shares once they are ``grace`` overdue (their node did not take them in time: busy, stopping, dead).

    After a breaker closes, the oldest message of every funnel value is due at once, and each funnel's queue then runs
    on the node that took its oldest: without shares the node whose feed came first took them all, and ran every
    queue while the other nodes idled. PostgreSQL only (``hashtext``); on SQLite every node takes every value."""

    index: int
    count: int
    grace: timedelta

    def __post_init__(self) -> None:
        if not 0 <= self.index < self.count:
            raise ValueError(f"a share's index must be in [0, {self.count}), got {self.index}")

    def condition(self, now: datetime) -> sa.ColumnElement[bool]:
        """Which due messages a feed of this share may take at ``now``."""
        c = message_table.c
        bucket = sa.func.hashtext(c.funnel_value).op("&")(0x7FFFFFFF) % self.count  # hashtext may be negative
        return sa.or_(c.funnel_value.is_(None), bucket == self.index, c.next_attempt_at <= now - self.grace)


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

    def acquire_many(self, claims: Sequence[tuple[str, int]], now: datetime,
                     connection: sa.Connection | None = None) -> dict[str, int | None]:
        """:meth:`acquire` for several funnels at once, each (``funnel_value``, ``message_id``) with its own value: by
        value, None when the message holds the funnel now, else the id of the PROCESSING message that holds it.

        Four statements for any number: the rows of new funnels inserted, the others' rows read under their locks
        (in value order), the holders' states read after the locks are granted (a fresh statement, so a holder
        whose release committed meanwhile is seen as it is now), and one that takes over the funnels whose holder
        left PROCESSING."""
        if not claims:
            return {}
        f, m = funnel_lock_table.c, message_table.c
        wanted = dict(sorted(claims))

        def work(conn: sa.Connection) -> dict[str, int | None]:
            inserted = set(conn.execute(
                self.database.upsert(funnel_lock_table)
                .values([{"funnel_value": value, "message_id": message_id, "acquired_at": now}
                         for value, message_id in wanted.items()])
                .on_conflict_do_nothing(index_elements=["funnel_value"])
                .returning(f.funnel_value)
            ).scalars())
            result: dict[str, int | None] = dict.fromkeys(inserted)
            existing = [value for value in wanted if value not in inserted]
            if not existing:
                return result
            holders = {str(row.funnel_value): int(row.message_id) for row in conn.execute(self.database.locked(
                sa.select(f.funnel_value, f.message_id).where(f.funnel_value.in_(existing))
                .order_by(f.funnel_value)))}
            busy = {int(i) for i in conn.execute(sa.select(m.id).where(
                m.id.in_(sorted(set(holders.values()))), m.state == MessageState.PROCESSING)).scalars()}
            taken = []
            for value in existing:
                holder = holders.get(value)
                if holder is None:  # the row was deleted meanwhile (it never is today): the one-message way
                    result[value] = self.acquire(value, wanted[value], now, conn)
                elif holder == wanted[value]:
                    result[value] = None
                elif holder in busy:
                    result[value] = holder
                else:
                    result[value] = None
                    taken.append({"value": value, "holder": holder, "message_id": wanted[value], "at": now})
            if taken:
                conn.execute(
                    sa.update(funnel_lock_table)
                    .where(f.funnel_value == sa.bindparam("value"), f.message_id == sa.bindparam("holder"))
                    .values(message_id=sa.bindparam("message_id"), acquired_at=sa.bindparam("at")), taken)
            return result

        return self.database.run(work, connection)

    def free_of(self, funnel_values: Sequence[str], connection: sa.Connection | None = None) -> list[str]:
        """Of ``funnel_values``, those no PROCESSING message holds, read under their rows' locks in value order
        (:meth:`holder` for several): the funnels a group of releases may hand on."""
        if not funnel_values:
            return []
        f, m = funnel_lock_table.c, message_table.c
        values = sorted(set(funnel_values))
        query = (sa.select(f.funnel_value, f.message_id, m.state).select_from(
            funnel_lock_table.outerjoin(message_table, m.id == f.message_id))
            .where(f.funnel_value.in_(values)).order_by(f.funnel_value))
        if self.database.dialect == "postgresql":
            query = query.with_for_update(of=funnel_lock_table)

        def work(conn: sa.Connection) -> list[str]:
            held = {str(row.funnel_value) for row in conn.execute(query)
                    if row.message_id is not None and row.state == MessageState.PROCESSING}
            return [value for value in values if value not in held]

        return self.database.run(work, connection)

    def queue_heads(self, funnel_values: Sequence[str],
                    connection: sa.Connection | None = None) -> dict[str, StoredMessage]:
        """:meth:`queue_head` of each of ``funnel_values`` that has a queue: on PostgreSQL one statement (a LATERAL
        look-up of the queue's index per value), on SQLite one per value (in-process, no round trip)."""
        if not funnel_values:
            return {}
        if self.database.dialect != "postgresql":
            heads = {value: self.queue_head(value, connection) for value in funnel_values}
            return {value: head for value, head in heads.items() if head is not None}
        c = message_table.c
        values = sa.values(sa.column("funnel_value", sa.String), name="wanted").data(
            [(value,) for value in sorted(set(funnel_values))])
        head = (sa.select(message_table).where(c.funnel_value == values.c.funnel_value,
                                               sa.text(FUNNEL_QUEUE_PREDICATE))
                .order_by(c.receive_ts, c.id).limit(1).lateral("head"))
        query = sa.select(head).select_from(values).join(head, sa.true())

        def work(conn: sa.Connection) -> dict[str, StoredMessage]:
            found = [row_to_message(row) for row in conn.execute(query)]
            return {cast(str, message.funnel_value): message for message in found}

        return self.database.run(work, connection)

    def hand_to_many(self, holders: Sequence[tuple[str, int]], now: datetime,
                     connection: sa.Connection | None = None) -> None:
        """:meth:`hand_to` for several funnels, each (``funnel_value``, ``message_id``), in one statement (an upsert:
        a queue its holder never took has no row yet)."""
        if not holders:
            return
        f = funnel_lock_table.c
        insert = self.database.upsert(funnel_lock_table).values(
            [{"funnel_value": value, "message_id": message_id, "acquired_at": now}
             for value, message_id in sorted(holders)])
        statement = insert.on_conflict_do_update(
            index_elements=[f.funnel_value],
            set_={"message_id": insert.excluded.message_id, "acquired_at": insert.excluded.acquired_at})
        self.database.run(lambda conn: conn.execute(statement), connection)

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
