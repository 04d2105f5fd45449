"""The message store: the ``message`` rows of one database, and the parts of the store that work beside them.

``MessageStore`` is the :class:`~openroute.persistence.database.Database` (engine, schema, transactions) with the
message rows: insert, read, find, the repoll queries. The other concepts are parts it holds, each a class over the
same database in its own module:

* ``store.transitions`` (:class:`~openroute.persistence.transitions.Transitions`): state changes and their history
* ``store.calls`` (:class:`~openroute.persistence.external_calls.ExternalCallStore`): external and entity calls
* ``store.funnels`` (:class:`~openroute.persistence.funnels.FunnelStore`): funnel locks, order and queues
* ``store.parking`` (:class:`~openroute.persistence.parking.ParkingStore`): messages parked on an open breaker
* ``store.nodes`` (:class:`~openroute.persistence.nodes.NodeStore`): the cluster's nodes
* ``store.counts`` (:class:`~openroute.persistence.counts.StoredCounts`): messages per route and state
* ``store.payload_index`` (:class:`~openroute.persistence.payload_index.PayloadIndex`): the payload search's index,
  written behind the commit

One transaction story for all of them (:mod:`openroute.persistence.database`): every method takes an optional
``connection``; without one it runs in a transaction of its own, with one (from :meth:`MessageStore.begin` or the
engine's writer) it joins the caller's transaction, so the writes of several parts commit together.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime
from itertools import repeat
from typing import Any

import sqlalchemy as sa
from openroute.persistence._hot_path import HotPath
from openroute.persistence.counts import StoredCounts
from openroute.persistence.database import Database
from openroute.persistence.external_calls import ExternalCallStore
from openroute.persistence.funnels import FunnelShare, FunnelStore
from openroute.persistence.messages import (
    InsertOutcome,
    NewMessage,
    StoredMessage,
    claimed_row,
    insert_values,
    row_to_message,
)
from openroute.persistence.models import DUE_PREDICATE, MessageState, message_table
from openroute.persistence.nodes import NodeStore
from openroute.persistence.parking import ParkingStore
from openroute.persistence.payload_index import PayloadIndex
from openroute.persistence.transitions import Transitions

__all__ = ["MessageStore"]


class MessageStore(Database):
    """The message rows of one relational database, and the parts of the store over it (see the module docstring).

    ``url`` is a SQLAlchemy URL: ``sqlite:///path/file.db`` (the default ``sqlite:///openroute.db``) or
    ``postgresql+psycopg://user@host/db``. The same statements run on both.
    """

    def __init__(self, url: str | None = None, *, pool_size: int = 8, echo: bool = False) -> None:
        super().__init__(url, pool_size=pool_size, echo=echo)
        # the per-message statements (insert, claim, outcome, transition row) run as SQL text on the driver's cursor
        self._hot = HotPath(self.engine.dialect)
        #: state changes of messages and their ``message_transition`` history
        self.transitions = Transitions(self, self._hot)
        #: the calls of messages (and entities) to external systems
        self.calls = ExternalCallStore(self)
        #: funnel locks and the order check of guaranteed-order routes
        self.funnels = FunnelStore(self)
        #: the messages parked on an external system's open circuit breaker
        self.parking = ParkingStore(self)
        #: the nodes of the cluster
        self.nodes = NodeStore(self)
        #: messages per route and state, kept as the transitions are written (``persistence/counts.py``)
        self.counts = StoredCounts(self)
        #: the payload search's index, filled behind the commit (``persistence/payload_index.py``)
        self.payload_index = PayloadIndex(self)

    def insert_message(
        self, new: NewMessage, connection: sa.Connection | None = None, *, node_id: str | None = None,
        cause: str = "engine",
    ) -> InsertOutcome:
        """Store ``new`` as NEW, or report the message with the same (source system, correlation id).

        Uses ``INSERT ... ON CONFLICT DO NOTHING`` so a duplicate is an answer, not a failed transaction.
        A stored message gets its first ``message_transition`` row (from None to NEW, by ``node_id``).
        """
        return self.insert_messages([new], connection, node_id=node_id, cause=cause)[0]

    def insert_messages(
        self, batch: Sequence[NewMessage], connection: sa.Connection | None = None, *, node_id: str | None = None,
        cause: str = "engine", claimed_at: datetime | None = None,
    ) -> list[InsertOutcome]:
        """:meth:`insert_message` for many messages with one multi-row INSERT; one outcome per item, in order.

        With ``claimed_at`` the messages are stored claimed for ``node_id`` as well, as if claimed at that time in the
        same transaction (the engine's accept, when the node has room for them): PROCESSING, version 1, with the
        claim's node and start time, and both transition rows (None -> NEW at the receive time, NEW -> PROCESSING at
        ``claimed_at``); the outcome's snapshot is the PROCESSING one. A duplicate is not claimed: its outcome is the
        message stored before, as it is.
        """
        return [InsertOutcome.of(message, duplicate) for message, duplicate in self.insert_snapshots(
            batch, connection, node_id=node_id, cause=cause, claimed_at=claimed_at)]

    def insert_snapshots(
        self, batch: Sequence[NewMessage], connection: sa.Connection | None = None, *, node_id: str | None = None,
        cause: str = "engine", claimed_at: datetime | None = None,
    ) -> list[tuple[StoredMessage, bool]]:
        """:meth:`insert_messages` with each outcome as the pair (message, duplicate) of its :class:`InsertOutcome`:
        the engine's accept takes the pair apart at once, where an ``InsertOutcome`` cost ~3,900 instructions a
        message to build and read (with the loop that made them)."""
        if not batch:
            return []
        base = None
        if claimed_at is not None:
            if node_id is None:
                raise ValueError("claimed_at needs the node_id the messages are claimed for")
            base = claimed_row(node_id, claimed_at)
        rows = [insert_values(new, base) for new in batch]
        c = message_table.c

        def work(conn: sa.Connection) -> list[tuple[StoredMessage, bool]]:
            ids = self._hot.insert_messages(conn, rows, node_id, cause, claimed_at)
            if None not in ids:  # no duplicate (almost every batch): the pairs made without a loop of ours
                stored: list[int] = ids  # type: ignore[assignment]  # no None among them
                return list(zip(map(StoredMessage.from_values, stored, rows), repeat(False)))
            outcomes: list[tuple[StoredMessage, bool]] = []
            for new, values, new_id in zip(batch, rows, ids, strict=True):
                if new_id is not None:
                    outcomes.append((StoredMessage.from_values(new_id, values), False))
                    continue
                existing = conn.execute(sa.select(message_table).where(
                    c.source_system == new.source_system, c.correlation_id == new.correlation_id)).one()
                outcomes.append((row_to_message(existing), True))
            return outcomes

        return self.run(work, connection)

    def get(self, message_id: int, connection: sa.Connection | None = None) -> StoredMessage | None:
        """The current row of ``message_id``, or None."""
        row = self.run(
            lambda conn: conn.execute(sa.select(message_table).where(message_table.c.id == message_id)).first(),
            connection,
        )
        return None if row is None else row_to_message(row)

    def find(
        self, *conditions: sa.ColumnElement[bool], limit: int | None = None, connection: sa.Connection | None = None
    ) -> list[StoredMessage]:
        """Messages matching SQLAlchemy ``conditions`` on :data:`message_table` columns, by id."""
        query = sa.select(message_table).where(*conditions).order_by(message_table.c.id).limit(limit)
        return [row_to_message(r) for r in self.run(lambda conn: conn.execute(query).all(), connection)]

    def count_by_state(self, connection: sa.Connection | None = None) -> dict[MessageState, int]:
        """How many messages are in each state (states with none are left out)."""
        query = sa.select(message_table.c.state, sa.func.count()).group_by(message_table.c.state)
        return {MessageState(s): n for s, n in self.run(lambda conn: conn.execute(query).all(), connection)}

    def due(
        self, states: Iterable[MessageState], now: datetime, limit: int, connection: sa.Connection | None = None
    ) -> list[StoredMessage]:
        """Messages in ``states`` whose next attempt is due at ``now``, oldest due first."""
        c = message_table.c
        query = (
            sa.select(message_table)
            .where(c.state.in_(list(states)), c.next_attempt_at <= now)
            .order_by(c.next_attempt_at)
            .limit(limit)
        )
        return [row_to_message(r) for r in self.run(lambda conn: conn.execute(query).all(), connection)]

    def ready(
        self, now: datetime, new_cutoff: datetime | None, limit: int, connection: sa.Connection | None = None,
        share: FunnelShare | None = None,
    ) -> list[StoredMessage]:
        """Messages to queue for processing, at most ``limit``: the due PARTLY_FAILED / POSTPONED ones (due order),
        then NEW ones received at or before ``new_cutoff`` (receive order; None: no NEW ones), each half of ``limit``
        at least when both have that many. PostgreSQL locks the rows for the caller's transaction and skips rows
        another one holds (``FOR UPDATE SKIP LOCKED``): nodes feeding at once take different messages; with a
        ``share`` it takes the due funnel messages of the node's share of the funnel values (:class:`FunnelShare`).

        The due ones come from the partial index ``ix_message_due`` in its order (no sort, whatever the backlog)."""
        c = message_table.c
        postgres = self.dialect == "postgresql"

        def query(condition: sa.ColumnElement[bool], order: list[sa.ColumnElement[Any]], count: int) -> Any:
            selected = sa.select(message_table).where(condition).order_by(*order).limit(count)
            return selected.with_for_update(skip_locked=True) if postgres else selected

        due_condition = sa.and_(sa.text(DUE_PREDICATE), c.next_attempt_at <= now)
        if share is not None and share.count > 1 and postgres:
            due_condition = sa.and_(due_condition, share.condition(now))
        new_condition = sa.and_(c.state == sa.literal_column(f"'{MessageState.NEW.value}'"),
                                c.receive_ts <= new_cutoff) if new_cutoff is not None else None

        def work(conn: sa.Connection) -> list[StoredMessage]:
            due: Sequence[Any] = conn.execute(query(due_condition, [c.next_attempt_at, c.id], limit)).all()
            fresh: Sequence[Any] = []
            if new_condition is not None and (len(due) < limit or limit > 1):
                # NEW ones get what the due ones leave, and half at least: neither kind starves the other
                room = max(limit - len(due), limit // 2)
                fresh = conn.execute(query(new_condition, [c.receive_ts, c.id], room)).all()
                due = due[: limit - len(fresh)]
            return [row_to_message(row) for row in (*due, *fresh)]

        return self.run(work, connection)

    def refresh_statistics(self) -> None:
        """``ANALYZE message`` on PostgreSQL (nothing on SQLite): after a bulk change of states (a release of thousands
        of parked messages into the funnels' queues) the planner's statistics no longer know the queues' rows, and
        the queue head's plan can leave its partial index for a scan of every waiting message (found with
        autovacuum off: 33,000 rows read per hand-off). A sample of the table, off the hot path."""
        if self.dialect == "postgresql":
            with self.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
                connection.exec_driver_sql("ANALYZE message")

    def refresh_stale_statistics(self, share: float = 0.1, least: int = 1000) -> bool:
        """Analyze the message table on PostgreSQL when more than ``share`` of its rows (and ``least``) changed since
        its last analysis; True when it did. A queue's plans depend on the statistics (a waiting message's partial
        index is left for a scan of every waiting message once they are stale), so the node keeps them true itself
        when autovacuum does not (turned off, or behind a burst). One node at a time (an advisory lock); SQLite has
        nothing to do."""
        if self.dialect != "postgresql":
            return False
        with self.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
            row = connection.execute(sa.text(
                "SELECT n_live_tup, n_mod_since_analyze FROM pg_stat_user_tables WHERE relname = 'message'")).first()
            if row is None or row.n_mod_since_analyze <= max(least, share * row.n_live_tup):
                return False
            if not connection.execute(sa.text("SELECT pg_try_advisory_lock(hashtext('openroute.analyze'))")).scalar():
                return False  # another node analyzes it now
            try:
                connection.exec_driver_sql("ANALYZE message")
            finally:
                connection.execute(sa.text("SELECT pg_advisory_unlock(hashtext('openroute.analyze'))"))
        return True

    def received_before(
        self, state: MessageState, cutoff: datetime, limit: int, connection: sa.Connection | None = None
    ) -> list[StoredMessage]:
        """Messages in ``state`` received at or before ``cutoff``, oldest first (NEW nobody queued)."""
        c = message_table.c
        query = (
            sa.select(message_table).where(c.state == state, c.receive_ts <= cutoff).order_by(c.receive_ts).limit(limit)
        )
        return [row_to_message(r) for r in self.run(lambda conn: conn.execute(query).all(), connection)]

    def started_before(
        self,
        state: MessageState,
        cutoff: datetime,
        limit: int,
        node_id: str | None = None,
        connection: sa.Connection | None = None,
    ) -> list[StoredMessage]:
        """Messages in ``state`` started at or before ``cutoff`` (optionally of one node), oldest first."""
        c = message_table.c
        conditions = [c.state == state, c.start_process_ts <= cutoff]
        if node_id is not None:
            conditions.append(c.node_id == node_id)
        query = sa.select(message_table).where(*conditions).order_by(c.start_process_ts).limit(limit)
        return [row_to_message(r) for r in self.run(lambda conn: conn.execute(query).all(), connection)]

    def newer_ok_exists(self, message: StoredMessage, connection: sa.Connection | None = None) -> bool:
        """Whether a message received after ``message`` for the same entity type + object id ended OK."""
        if message.object_id is None or message.entity_type is None:
            return False
        c = message_table.c
        query = sa.select(c.id).where(
            c.entity_type == message.entity_type,
            c.object_id == message.object_id,
            c.state == MessageState.OK,
            c.id != message.id,
            sa.or_(c.receive_ts > message.receive_ts, sa.and_(c.receive_ts == message.receive_ts, c.id > message.id)),
        ).limit(1)
        return self.run(lambda conn: conn.execute(query).first(), connection) is not None

    def children_of(self, parent_id: int, connection: sa.Connection | None = None) -> list[StoredMessage]:
        """The child messages of ``parent_id``, in the order they were split (by id)."""
        return self.find(message_table.c.parent_id == parent_id, connection=connection)

    def lock_message(self, message_id: int, connection: sa.Connection) -> StoredMessage | None:
        """Read ``message_id`` holding its row lock (PostgreSQL ``FOR UPDATE``) until ``connection`` commits."""
        row = connection.execute(self.locked(sa.select(message_table).where(message_table.c.id == message_id))).first()
        return None if row is None else row_to_message(row)
