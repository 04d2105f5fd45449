"""The state changes of messages (``store.transitions``), each written with its ``message_transition`` row.

The store writes the ``state`` column only in :meth:`MessageStore.insert_message` (always ``NEW``),
:meth:`Transitions.apply_many` (and :meth:`Transitions.apply`) and :meth:`Transitions.claim`; whether a transition is
legal is decided by ``openroute.engine.states`` before these are called. Each of them also writes the change's
``message_transition`` row in the same transaction (one executemany INSERT per batch); :meth:`Transitions.of` reads
a message's history back.

Every write of a message row adds one to its ``version``, so a snapshot's (id, version) pins the state it was
read in: the hot-path statements (claim, outcome UPDATE) are keyed by primary key and version only. A state
predicate would add nothing to their safety, but it lets PostgreSQL plan them on a state index once the table
has statistics (a scan of the whole backlog per statement instead of one primary-key probe).

A :class:`~openroute.persistence.database.StorePart`: each method joins the transaction of the ``connection`` it is
given, or runs in one of its own.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from operator import itemgetter
from typing import Any

import sqlalchemy as sa
from openroute.persistence._hot_path import HotPath, TransitionRow
from openroute.persistence._staging import StagedWriter
from openroute.persistence.database import Database, StorePart
from openroute.persistence.models import MessageState, message_transition_table

__all__ = ["TRANSITION_COLUMNS", "GroupConflict", "Transitions", "transition_row"]

# The columns a transition may change besides state and version; everything else is written once.
TRANSITION_COLUMNS = frozenset(
    {
        "failed_count",
        "next_attempt_at",
        "custom_data",
        "business_errors",
        "last_error_code",
        "last_error_text",
        "last_error_trace",
        "node_id",
        "start_process_ts",
        "parked_on",
    }
)

#: one state change to write: (message id, version read, from state, to state, at, changed columns)
TransitionItem = tuple[int, int, MessageState, MessageState, datetime, Mapping[str, Any]]
#: an item's changed columns
_changes_of = itemgetter(5)


class GroupConflict(Exception):
    """A grouped write could not tell which of its items lost: roll back and write them one by one."""


def transition_row(
    message_id: int,
    from_state: MessageState | None,
    to_state: MessageState,
    at: datetime,
    node_id: str | None,
    error_code: str | None,
    cause: str,
    changes: Mapping[str, Any] | None = None,
) -> TransitionRow:
    """One ``message_transition`` row (its attempt is read from the message row when it is written).

    The attempt is ``failed_count + 1`` as written, except for a change out of PROCESSING that counts a failure
    (``changes`` sets the failed count): that one belongs to the attempt that failed, the new failed count. The row
    keeps the change's error text and traceback (from ``changes``) when it has an error code."""
    counted = changes is not None and from_state is MessageState.PROCESSING and "failed_count" in changes
    text = trace = None
    if error_code is not None and changes is not None:
        text, trace = changes.get("last_error_text"), changes.get("last_error_trace")
    return (message_id, from_state, to_state, at, node_id, error_code, cause, 0 if counted else 1, text, trace)


class Transitions(StorePart):
    """The state writes of ``database``'s messages and their history (the ``message_transition`` table)."""

    def __init__(self, database: Database, hot_path: HotPath) -> None:
        super().__init__(database)
        # the per-message statements (claim, outcome, transition row) run as SQL text on the driver's cursor
        self._hot = hot_path
        self._checked_columns: set[tuple[str, ...]] = set()  # column sets a transition was allowed to write
        self._staged: StagedWriter | None = None  # made at the first set-based batch (it needs the dialect)

    def apply(
        self,
        item: TransitionItem,
        connection: sa.Connection | None = None,
        *,
        node_id: str | None = None,
        cause: str = "engine",
    ) -> bool:
        """Write one state change ``item`` (id, version read, from state, to state, at, changes) if the row is still
        at the version read.

        Returns False (and writes nothing) when another writer got there first. The row is matched by id and
        version only: every write bumps the version, so an unchanged version means an unchanged state. Legality
        is not checked here: call ``openroute.engine.states.transition``, which checks it and raises the typed errors.
        The change's ``message_transition`` row (by ``node_id``, for ``cause``) is written with it.
        """
        return self.apply_many([item], connection, node_id=node_id, cause=cause)[0]

    def apply_many(
        self,
        batch: Sequence[TransitionItem],
        connection: sa.Connection | None = None,
        *,
        node_id: str | None = None,
        cause: str | Sequence[str] = "engine",
        staged: bool = False,
    ) -> list[bool]:
        """:meth:`apply` for many (id, version, from, to, now, changes) items, one flag per item.

        Items changing the same columns share one executemany UPDATE. If its total row count says some
        item lost, :class:`GroupConflict` is raised: the caller must roll back and retry the items one by
        one (a single item is always resolved exactly). The written items' ``message_transition`` rows
        follow in one executemany INSERT; ``cause`` is one for all items or one per item.

        ``staged`` (for bulk jobs) writes set-based instead: the batch staged in a temporary table, then one UPDATE
        and one INSERT of the ``message_transition`` rows for all of it (``persistence/_staging.py``); each message
        may appear once (ValueError otherwise), and an item that lost gets its False flag (no GroupConflict).
        """
        causes = [cause] * len(batch) if isinstance(cause, str) else list(cause)
        if len(causes) != len(batch):
            raise ValueError(f"{len(causes)} causes for {len(batch)} transitions")
        if staged:
            self._column_groups(batch)  # a column no transition writes is refused before anything is written
            return self._apply_staged(batch, causes, connection, node_id)
        if len(batch) > 1 and not any(map(_changes_of, batch)):  # a C loop: every outcome of the writer comes here
            return self.database.run(lambda conn: self._apply_state_changes(conn, batch, causes, node_id), connection)
        groups = self._column_groups(batch)

        def work(conn: sa.Connection) -> list[bool]:
            flags = [False] * len(batch)
            for columns, indexes in groups.items():
                # most outcomes write no column but state, version and time: no values to take from their changes
                items = [(item[0], item[1], item[3], item[4], [item[5][name] for name in columns] if columns else ())
                         for item in map(batch.__getitem__, indexes)]
                if len(items) > 1 and conn.dialect.supports_sane_multi_rowcount:
                    if self._hot.apply_outcomes(conn, columns, items) != len(items):
                        raise GroupConflict(f"{len(items)} transitions in one statement, some lost")
                    for index in indexes:
                        flags[index] = True
                    continue
                for index, item in zip(indexes, items, strict=True):
                    flags[index] = self._hot.apply_outcomes(conn, columns, [item]) == 1
            self.record(conn, [
                transition_row(item[0], item[2], item[3], item[4], node_id, item[5].get("last_error_code"), why,
                               item[5])
                for item, why, written in zip(batch, causes, flags, strict=True)
                if written
            ])
            return flags

        return self.database.run(work, connection)

    def _apply_state_changes(self, connection: sa.Connection, batch: Sequence[TransitionItem], causes: list[str],
                             node_id: str | None) -> list[bool]:
        """:meth:`apply_many` for a group of changes of the state alone (no column written: most outcomes, so no
        error and no failure counted): the hot path's UPDATE and transition rows from the batch's columns."""
        if not connection.dialect.supports_sane_multi_rowcount:  # no count to trust for a group: one at a time
            return [self.apply_many([item], connection, node_id=node_id, cause=why)[0]
                    for item, why in zip(batch, causes, strict=True)]
        ids, versions, from_states, to_states, nows, _ = zip(*batch, strict=True)
        if self._hot.apply_state_changes(connection, ids, versions, from_states, to_states, nows, causes,
                                         node_id) != len(batch):
            raise GroupConflict(f"{len(batch)} transitions in one statement, some lost")
        return [True] * len(batch)

    def _apply_staged(self, batch: Sequence[TransitionItem], causes: list[str], connection: sa.Connection | None,
                      node_id: str | None) -> list[bool]:
        if not batch:
            return []

        def work(conn: sa.Connection) -> list[bool]:
            if self._staged is None:
                self._staged = StagedWriter(conn.dialect, sorted(TRANSITION_COLUMNS))
            written = self._staged.apply(conn, [
                (item[0], item[1], item[2], item[3], item[4], node_id, why,
                 transition_row(item[0], item[2], item[3], item[4], None, None, why, item[5])[7], item[5])
                for item, why in zip(batch, causes, strict=True)
            ])
            return [item[0] in written for item in batch]

        return self.database.run(work, connection)

    def _column_groups(self, batch: Sequence[TransitionItem]) -> dict[tuple[str, ...], list[int]]:
        """The indexes of ``batch`` by the columns each item changes; ValueError for a column no transition writes."""
        groups: dict[tuple[str, ...], list[int]] = {}
        for index, item in enumerate(batch):
            columns = tuple(sorted(item[5])) if item[5] else ()
            if columns not in self._checked_columns:
                unknown = set(columns) - TRANSITION_COLUMNS
                if unknown:
                    raise ValueError(f"a transition cannot write {sorted(unknown)}")
                self._checked_columns.add(columns)
            indexes = groups.get(columns)
            if indexes is None:
                indexes = groups[columns] = []
            indexes.append(index)
        return groups

    def claim(
        self,
        candidates: Iterable[tuple[int, int]],
        from_states: Iterable[MessageState],
        to_state: MessageState,
        node_id: str,
        now: datetime,
        connection: sa.Connection | None = None,
        *,
        previous: Mapping[int, MessageState] | None = None,
        cause: str = "engine",
    ) -> set[int]:
        """Move the (id, version) ``candidates`` to ``to_state`` for ``node_id``.

        The caller read every candidate in one of ``from_states`` (``openroute.engine.states.claim`` checks it); the
        rows are matched by id and version only, which pins that state. Returns the ids this call won. On
        PostgreSQL rows locked by a concurrent claim are skipped (``FOR UPDATE SKIP LOCKED``) instead of waited
        for; on SQLite the write lock serialises claims and the conditional UPDATE decides. Each won message
        gets its ``message_transition`` row in the same transaction, from its state in ``previous`` (the state
        at the candidate's version).
        """
        pairs = list(candidates)
        if not pairs:
            return set()
        before = previous or {}

        def recorded(won: set[int], conn: sa.Connection) -> set[int]:
            self.record(conn, [transition_row(i, before.get(i), to_state, now, node_id, None, cause) for i in won])
            return won

        return self.database.run(
            lambda conn: recorded(self._hot.claim(conn, pairs, to_state, node_id, now), conn), connection
        )

    def record_changes(
        self, connection: sa.Connection, ids: Sequence[int], from_states: Sequence[MessageState | None],
        to_states: Sequence[MessageState], ats: Sequence[datetime], causes: Sequence[str], node_id: str | None,
    ) -> None:
        """:meth:`record` for changes without an error that count no failure (the insert's), given column by column
        (``HotPath.record_changes``): one value of each a row, made by ``node_id``."""
        self._hot.record_changes(connection, ids, from_states, to_states, ats, causes, node_id)

    def record(self, connection: sa.Connection, rows: list[TransitionRow]) -> None:
        """Write ``message_transition`` rows (see :func:`transition_row`) with one executemany INSERT, in the
        caller's transaction (the insert of new messages writes theirs this way)."""
        self._hot.record_transitions(connection, rows)

    def of(self, message_id: int, connection: sa.Connection | None = None) -> list[dict[str, Any]]:
        """The recorded state changes of ``message_id``, oldest first (from_state None for the insert), each with
        its error code, error text and traceback (None when the change had none)."""
        t = message_transition_table.c
        query = (
            sa.select(t.from_state, t.to_state, t.at, t.node_id, t.attempt, t.error_code, t.cause, t.error_text,
                      t.error_trace)
            .where(t.message_id == message_id)
            .order_by(t.id)
        )
        return [dict(r._mapping) for r in self.database.run(lambda conn: conn.execute(query).all(), connection)]
