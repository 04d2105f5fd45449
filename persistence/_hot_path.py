"""The statements every message runs through, as SQL text on the driver's cursor.

Each message costs the store four kinds of statement: the INSERT of its row, the claim UPDATE (to
PROCESSING), the outcome UPDATE and a ``message_transition`` INSERT per state change. Through SQLAlchemy Core
every execution builds an execution context and runs each parameter of each row through the type's bind
processor inside SQLAlchemy's own loops; issue #10 measured two thirds of the writer thread there, three times
the cost of the statements themselves. Here the SQL is written once per dialect, the parameters are converted
by the columns' own bind processors (so a row is stored exactly as SQLAlchemy would store it) and the text runs
on the DB-API cursor of the caller's connection, inside its transaction.

SQLAlchemy's ``before_cursor_execute`` / ``after_cursor_execute`` listeners still hear every statement (tracing
and test instrumentation keep working); ``echo`` logging does not show them.

The statements are keyed the way ``openroute.persistence.store`` explains: by primary key and version, never
by state, so PostgreSQL plans them on the primary key at any table size and with any statistics.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from itertools import chain, compress, repeat
from operator import add, is_not, itemgetter
from typing import Any

import sqlalchemy as sa
from openroute.persistence._bind import Processor, _converted, _processor
from openroute.persistence._statements import (
    in_statement_sizes,
    sqlite_inserted_keys,
    statement_sizes,
    transition_insert,
    transition_values,
)
from openroute.persistence.models import MessageState, message_table, message_transition_table

#: the columns of a new ``message`` row, in the order of the INSERT's values
#: the grouped claim on PostgreSQL (parameters: state, node id, start and update time, the ids, their versions): rows
#: a concurrent claim holds are skipped, not waited for; the arrays keep one text for any group size
POSTGRES_CLAIM = (
    "UPDATE message SET state = %s, version = message.version + 1, node_id = %s, "
    "start_process_ts = %s, last_update_ts = %s "
    "WHERE message.id IN (SELECT m.id FROM message AS m "
    "JOIN unnest(%s::bigint[], %s::integer[]) AS c(id, version) "
    "ON m.id = c.id AND m.version = c.version FOR UPDATE OF m SKIP LOCKED) RETURNING message.id"
)

INSERT_COLUMNS: tuple[str, ...] = (
    "correlation_id", "source_system", "process_id", "service", "operation", "object_id", "entity_type",
    "funnel_value", "payload", "content_type", "headers", "state", "failed_count", "receive_ts", "msg_ts",
    "start_process_ts", "last_update_ts", "next_attempt_at", "node_id", "custom_data", "business_errors",
    "last_error_code", "last_error_text", "parent_id", "version", "traceparent",
)

#: a ``message_transition`` row: (message id, from state, to state, at, node id, error code, cause, what to add to
#: the failed count for the attempt (1, or 0 for a counted failure), error text, error traceback)
TransitionRow = tuple[int, MessageState | None, MessageState, datetime, str | None, str | None, str, int,
                      str | None, str | None]

#: a message row's values in INSERT_COLUMNS order, from its values by column name (one C call)
_insert_columns = itemgetter(*INSERT_COLUMNS)
#: the positions of the columns that may be NULL (a None in any other is bound as it is: SQLite refuses it the same)
_NULLABLE = tuple(index for index, name in enumerate(INSERT_COLUMNS) if message_table.c[name].nullable)
#: the positions of the columns a row's duplicate is known by
_SOURCE, _CORRELATION = INSERT_COLUMNS.index("source_system"), INSERT_COLUMNS.index("correlation_id")
#: the positions of a row's receive time and update time (a NEW row's are the same object)
_RECEIVED, _LAST_UPDATE = INSERT_COLUMNS.index("receive_ts"), INSERT_COLUMNS.index("last_update_ts")

#: a result row's first value
_first = itemgetter(0)


def _bad_parameter(sql: str, error: Exception) -> sa.exc.StatementError:
    """The error SQLAlchemy raises for a value its bind processor refuses (a naive datetime, an unknown state)."""
    return sa.exc.StatementError(f"({type(error).__name__}) {error}", sql, None, error)


#: what no transition row's time is (a missing one, None, is converted and refused as any other value)
_NO_TIME = object()


class HotPath:
    """The hot statements of one dialect (``sqlite`` or ``postgresql``), ready to run on a connection."""

    def __init__(self, dialect: sa.Dialect) -> None:
        self.postgres = dialect.name == "postgresql"
        mark = "%s" if self.postgres else "?"
        self._mark = mark
        m, t = message_table.c, message_transition_table.c
        self._insert_processors = [
            (index, processor) for index, name in enumerate(INSERT_COLUMNS)
            if (processor := _processor(m[name], dialect)) is not None
        ]
        self._message_processors = {column.key: _processor(column, dialect) for column in m}
        self._timestamp = _processor(m.last_update_ts, dialect) or (lambda value: value)
        self._state = _processor(m.state, dialect) or (lambda value: value)
        self._optional_state = _processor(t.from_state, dialect) or (lambda value: value)
        # read once: a member read through its class is a call of the enum type's attribute hook each time (3.11)
        self._new, self._processing = MessageState.NEW, MessageState.PROCESSING
        self._new_text, self._processing_text = self._state(self._new), self._state(self._processing)
        columns = ", ".join(INSERT_COLUMNS)
        row = "(" + ", ".join(mark for _ in INSERT_COLUMNS) + ")"
        if self.postgres:
            # one text for any batch: psycopg prepares it once and pipelines the executemany
            self._insert_one = (f"INSERT INTO message ({columns}) VALUES {row} "  # noqa: S608  names are the schema's constants; values are bound parameters
                                "ON CONFLICT (source_system, correlation_id) DO NOTHING RETURNING id")
        self._insert_head = f"INSERT INTO message ({columns}) VALUES "  # noqa: S608  names are the schema's constants; values are bound parameters
        self._sqlite_claims: dict[int, str] = {}  # by rows
        self._sqlite_inserts: dict[tuple[tuple[int, ...], int], str] = {}  # by (NULL columns, rows)
        # by NULL columns: the positions of the values bound and their getter
        self._present: dict[tuple[int, ...], tuple[tuple[int, ...], Callable[[Sequence[Any]], tuple[Any, ...]]]] = {}
        self._insert_tail = " ON CONFLICT (source_system, correlation_id) DO NOTHING RETURNING id"
        self._transition = transition_insert(mark)
        # SQLite: the statement and the parameters of a row, by which of the optional values (from state, node, error
        # code, text, trace) a group of rows lacks
        self._transitions: dict[tuple[bool, bool, bool, bool, bool],
                                tuple[str, Callable[[Sequence[Any]], tuple[Any, ...]]]] = {}
        # by the columns an outcome writes: its statement, their processors, whether any of them has one
        self._outcomes: dict[tuple[str, ...], tuple[str, list[Processor | None], bool]] = {}

    # -- running statements -----------------------------------------------------------------------
    @staticmethod
    def _cursor(connection: sa.Connection) -> Any:
        return connection.connection.dbapi_connection.cursor()  # type: ignore[union-attr]

    @staticmethod
    def _run(
        connection: sa.Connection, cursor: Any, sql: str, parameters: Any, many: bool, returning: bool = False
    ) -> None:
        """Execute on the DB-API cursor, telling SQLAlchemy's cursor listeners (they see what they would see).

        ``returning`` asks psycopg to keep each parameter set's result of an executemany (``nextset()``)."""
        dispatch = connection.dispatch
        if dispatch.before_cursor_execute:
            for listener in dispatch.before_cursor_execute:
                listener(connection, cursor, sql, parameters, None, many)
        if many and returning:
            cursor.executemany(sql, parameters, returning=True)  # psycopg 3's cursor, not the DB-API protocol
        elif many:
            cursor.executemany(sql, parameters)
        else:
            cursor.execute(sql, parameters)
        if dispatch.after_cursor_execute:
            for listener in dispatch.after_cursor_execute:
                listener(connection, cursor, sql, parameters, None, many)

    # -- the statements ---------------------------------------------------------------------------
    def insert_messages(
        self, connection: sa.Connection, rows: Sequence[dict[str, Any]], node_id: str | None, cause: str,
        claimed_at: datetime | None = None,
    ) -> list[int | None]:
        """INSERT the ``message`` rows (values by column name) and the transition rows of the stored ones (by
        ``node_id``, for ``cause``): None -> NEW at their receive time, then, with ``claimed_at``, NEW -> PROCESSING
        at that time (after all of them: the history reads in the order it happened). The new id of each row, None
        for a duplicate of (source system, correlation id), in order.

        The receive times' texts (SQLite) are the row's, converted once for both statements."""
        if not rows:
            return []
        # the batch's values by column (each a tuple in row order), converted column by column: a Python loop over
        # the columns of a row cost ~9 iterations a message, a column's map runs in C and a column holding one
        # value for the whole batch (the claim's time and node, the state, the NULLs) is converted once
        columns: list[Sequence[Any]] = list(zip(*map(_insert_columns, rows), strict=True))
        received = columns[_RECEIVED]
        try:
            for index, process in self._insert_processors:
                if index == _LAST_UPDATE and columns[index] == received:  # a NEW row: its receive time's texts
                    columns[index] = columns[_RECEIVED]
                    continue
                columns[index] = _converted(process, columns[index])
        except (ValueError, TypeError, LookupError) as error:
            raise _bad_parameter(self._insert_head, error) from error
        cursor = self._cursor(connection)
        try:
            if self.postgres:
                self._run(connection, cursor, self._insert_one, list(zip(*columns, strict=True)), True,
                          returning=True)
                ids: list[int | None] = []
                while True:
                    found = cursor.fetchone()
                    ids.append(None if found is None else int(found[0]))
                    if not cursor.nextset():
                        break
            else:
                ids = []
                row = 0  # the batch's row of a statement's first (the runs and their statements keep the batch's order)
                for nulls, parameters in self._sqlite_runs(columns):
                    width = len(INSERT_COLUMNS) - len(nulls)
                    first = 0
                    for size in statement_sizes(len(parameters) // width):
                        self._run(connection, cursor, self._sqlite_insert(nulls, size),
                                  parameters[first:first + size * width], False)
                        first += size * width
                        ids += self._sqlite_inserted(connection, cursor, size, columns, row)
                        row += size
        finally:
            cursor.close()
        self._record_inserted(connection, ids, received if self.postgres else columns[_RECEIVED], node_id, cause,
                              claimed_at)
        return ids

    def _record_inserted(
        self, connection: sa.Connection, ids: list[int | None], received: Sequence[Any], node_id: str | None,
        cause: str, claimed_at: datetime | None,
    ) -> None:
        """The transition rows of the rows :meth:`insert_messages` stored (their ids; None: a duplicate) received at
        ``received`` (SQLite: the texts the INSERT bound)."""
        if None in ids:
            stored = list(map(is_not, ids, repeat(None)))
            ids, received = list(compress(ids, stored)), list(compress(received, stored))
        count = len(ids)
        if not count:
            return
        stored_ids: Sequence[int] = ids  # type: ignore[assignment]  # the Nones left out above
        causes = (cause,) * count
        if self.postgres:
            self.record_changes(connection, stored_ids, (None,) * count, (self._new,) * count, received, causes,
                                node_id)
            if claimed_at is not None:
                self.record_changes(connection, stored_ids, (self._new,) * count, (self._processing,) * count,
                                    (claimed_at,) * count, causes, node_id)
            return
        self._insert_changes(connection, stored_ids, (None,) * count, (self._new_text,) * count, received, causes,
                             node_id)
        if claimed_at is not None:
            try:
                claimed = self._timestamp(claimed_at)
            except (ValueError, TypeError, LookupError) as error:
                raise _bad_parameter(self._transition, error) from error
            self._insert_changes(connection, stored_ids, (self._new,) * count, (self._processing_text,) * count,
                                 (claimed,) * count, causes, node_id)

    def _sqlite_inserted(self, connection: sa.Connection, cursor: Any, size: int, columns: list[Sequence[Any]],
                         row: int) -> list[int | None]:
        """The ids of the ``size`` rows a SQLite INSERT just stored from the batch's row ``row`` on (``columns``), None
        for a duplicate, from its ``RETURNING id``.

        SQLite gives a new row the largest id so far plus one, and the statement stores its rows in order: when
        every row was stored (as many ids, one after the other), the ids in ascending order are the rows'. Otherwise
        (a duplicate left out, or ids not given that way) they are matched by (source system, correlation id), read
        back: a repeat within the batch is the duplicate of its first row, as the INSERT skipped it. RETURNING the
        two texts with the id cost every row their decoding and matching (~5,000 instructions a message)."""
        stored = sorted(map(_first, cursor.fetchall()))
        if len(stored) == size and stored[-1] - stored[0] == size - 1:
            return stored
        created: dict[tuple[str, str], int] = {}
        if stored:
            self._run(connection, cursor, sqlite_inserted_keys(len(stored)), stored, False)
            created = {(source, correlation): new_id for new_id, source, correlation in cursor.fetchall()}
        return list(map(created.pop, zip(columns[_SOURCE][row:row + size], columns[_CORRELATION][row:row + size],
                                         strict=True), repeat(None)))

    def _sqlite_runs(self, columns: list[Sequence[Any]]) -> list[tuple[tuple[int, ...], list[Any]]]:
        """The batch's rows as runs of consecutive rows lacking the same values, each as (the positions of the NULL
        columns, the values the run binds, row after row); the runs keep the batch's order, so ids do too (a split's
        children are processed in id order). Usually one run: each nullable column is NULL in every row or in none,
        and its values are laid out column by column, without a tuple a row."""
        count = len(columns[0])
        nulls: list[int] = []
        for index in _NULLABLE:
            missing = columns[index].count(None)
            if missing == count:
                nulls.append(index)
            elif missing:
                break
        else:
            kept = self._kept(tuple(nulls))[0]
            width = len(kept)
            parameters: list[Any] = [None] * (count * width)
            for offset, index in enumerate(kept):
                parameters[offset::width] = columns[index]
            return [(tuple(nulls), parameters)]
        runs: list[tuple[tuple[int, ...], list[tuple[Any, ...]]]] = []
        for row in zip(*columns, strict=True):
            lacking = tuple([index for index in _NULLABLE if row[index] is None])
            if runs and runs[-1][0] == lacking:
                runs[-1][1].append(row)
            else:
                runs.append((lacking, [row]))
        return [(lacking, list(chain.from_iterable(map(self._kept(lacking)[1], group)))) for lacking, group in runs]

    def _kept(self, nulls: tuple[int, ...]) -> tuple[tuple[int, ...], Callable[[Sequence[Any]], tuple[Any, ...]]]:
        """The positions of the values a row lacking ``nulls`` binds, and their getter (14 columns at least: a
        tuple)."""
        kept = self._present.get(nulls)
        if kept is None:
            indexes = tuple(i for i in range(len(INSERT_COLUMNS)) if i not in nulls)
            kept = self._present[nulls] = (indexes, itemgetter(*indexes))
        return kept

    def _sqlite_insert(self, nulls: tuple[int, ...], rows: int) -> str:
        """The SQLite INSERT of ``rows`` rows with NULL written for the columns at ``nulls``: Python's sqlite3 binds
        a None through its adapter lookup, several times the cost of binding a text, and a new message has a
        dozen."""
        key = (nulls, rows)
        sql = self._sqlite_inserts.get(key)
        if sql is None:
            row = "(" + ", ".join("NULL" if index in nulls else "?" for index in range(len(INSERT_COLUMNS))) + ")"
            sql = self._insert_head + ", ".join([row] * rows) + self._insert_tail
            self._sqlite_inserts[key] = sql
        return sql

    def claim(
        self, connection: sa.Connection, pairs: Sequence[tuple[int, int]], to_state: MessageState, node_id: str,
        now: datetime,
    ) -> set[int]:
        """Move the rows still at their (id, version) to ``to_state`` for ``node_id``; the ids that moved.

        PostgreSQL skips rows a concurrent claim holds (``FOR UPDATE SKIP LOCKED``) instead of waiting; SQLite's
        write lock serialises claims. SQLite lists the ids as well as the pairs: it cannot search the primary key
        for a row-value IN alone.
        """
        try:
            at, state = self._timestamp(now), self._state(to_state)
        except (ValueError, TypeError, LookupError) as error:
            raise _bad_parameter("UPDATE message", error) from error
        if self.postgres:
            parameters: list[Any] = [state, node_id, at, at, [p[0] for p in pairs],
                                     [p[1] for p in pairs]]
            cursor = self._cursor(connection)
            try:
                self._run(connection, cursor, POSTGRES_CLAIM, parameters, False)
                return {int(row[0]) for row in cursor.fetchall()}
            finally:
                cursor.close()
        won: set[int] = set()
        cursor = self._cursor(connection)
        try:
            for chunk in in_statement_sizes(pairs):
                self._run(connection, cursor, self._sqlite_claim(len(chunk)),
                          [state, node_id, at, at, *(p[0] for p in chunk), *(v for pair in chunk for v in pair)], False)
                won.update(int(row[0]) for row in cursor.fetchall())
            return won
        finally:
            cursor.close()

    def _sqlite_claim(self, rows: int) -> str:
        sql = self._sqlite_claims.get(rows)
        if sql is None:
            sql = ("UPDATE message SET state = ?, version = version + 1, node_id = ?, start_process_ts = ?, "  # noqa: S608  names are the schema's constants; values are bound parameters
                   f"last_update_ts = ? WHERE id IN ({', '.join('?' for _ in range(rows))}) "
                   f"AND (id, version) IN ({', '.join('(?, ?)' for _ in range(rows))}) RETURNING id")
            self._sqlite_claims[rows] = sql
        return sql

    def _outcome(self, columns: tuple[str, ...]) -> tuple[str, list[Processor | None], bool]:
        """The UPDATE of an outcome writing ``columns`` (besides state, version and time), their processors and
        whether any of them has one."""
        outcome = self._outcomes.get(columns)
        if outcome is None:
            mark = self._mark
            assignments = "".join(f", {name} = {mark}" for name in columns)
            processors = [self._message_processors[name] for name in columns]
            outcome = self._outcomes[columns] = (
                f"UPDATE message SET state = {mark}, version = {mark}, last_update_ts = {mark}{assignments} "  # noqa: S608  names are the schema's constants; values are bound parameters
                f"WHERE id = {mark} AND version = {mark}",
                processors, any(process is not None for process in processors),
            )
        return outcome

    def apply_outcomes(
        self, connection: sa.Connection, columns: tuple[str, ...],
        items: Sequence[tuple[int, int, MessageState, datetime, Sequence[Any]]],
    ) -> int:
        """UPDATE rows still at their version: each item is (id, version, to state, now, values of ``columns``).

        One executemany of one text for items changing the same ``columns``; returns how many rows matched in all
        (the caller compares it with the number of items).
        """
        sql, processors, converts = self._outcome(columns)
        state, timestamp = self._state, self._timestamp
        parameters = []
        try:
            for message_id, version, to_state, now, values in items:
                if converts:  # most outcomes write no column but state, version and time (engine/states.py, _changed)
                    values = [value if process is None else process(value)
                              for process, value in zip(processors, values, strict=True)]
                parameters.append([state(to_state), version + 1, timestamp(now), *values, message_id, version])
        except (ValueError, TypeError, LookupError) as error:
            raise _bad_parameter(sql, error) from error
        cursor = self._cursor(connection)
        try:
            if len(parameters) == 1:
                self._run(connection, cursor, sql, parameters[0], False)
            else:
                self._run(connection, cursor, sql, parameters, True)
            return int(cursor.rowcount)
        finally:
            cursor.close()

    def apply_state_changes(
        self, connection: sa.Connection, ids: Sequence[int], versions: Sequence[int],
        from_states: Sequence[MessageState], to_states: Sequence[MessageState], nows: Sequence[datetime],
        causes: Sequence[str], node_id: str | None,
    ) -> int:
        """:meth:`apply_outcomes` and :meth:`record_changes` for outcomes changing the state alone (most: no column
        written, no error, no failure counted), given column by column: one executemany UPDATE of the rows still at
        their version and, when every row matched, their transition rows. Returns how many rows matched (the caller
        compares it with the number of ids, as for :meth:`apply_outcomes`).

        The parameters are built by C loops over the columns (a column of one object converted once) instead of a
        Python loop over the items and again over their transition rows."""
        sql = self._outcome(())[0]
        try:
            states, times = _converted(self._state, to_states), _converted(self._timestamp, nows)
        except (ValueError, TypeError, LookupError) as error:
            raise _bad_parameter(sql, error) from error
        cursor = self._cursor(connection)
        try:
            parameters = list(zip(states, map(add, versions, repeat(1)), times, ids, versions, strict=True))
            self._run(connection, cursor, sql, parameters, True)
            matched = int(cursor.rowcount)
        finally:
            cursor.close()
        if matched == len(ids):
            if self.postgres or None in from_states:
                self.record_changes(connection, ids, from_states, to_states, nows, causes, node_id)
            else:  # the texts of the UPDATE's states and times again (each time a call, though found in its cache)
                self._insert_changes(connection, ids, from_states, states, times, causes, node_id)
        return matched

    def record_changes(
        self, connection: sa.Connection, ids: Sequence[int], from_states: Sequence[MessageState | None],
        to_states: Sequence[MessageState], ats: Sequence[datetime], causes: Sequence[str], node_id: str | None,
    ) -> None:
        """:meth:`record_transitions` for changes without an error that count no failure (an insert's, a claim's,
        most outcomes'), given column by column (one value of each a row) and made by ``node_id``.

        On SQLite the parameters are built by C loops over the columns (a column of one object, e.g. the claim's
        time, converted once); a batch whose from states are None in some rows only, and PostgreSQL, go through
        :meth:`record_transitions`."""
        if not ids:
            return
        if self.postgres or 0 < from_states.count(None) < len(ids):
            self.record_transitions(connection, [
                (message_id, before, after, at, node_id, None, cause, 1, None, None)
                for message_id, before, after, at, cause in zip(ids, from_states, to_states, ats, causes, strict=True)
            ])
            return
        try:
            states, times = _converted(self._state, to_states), _converted(self._timestamp, ats)
        except (ValueError, TypeError, LookupError) as error:
            raise _bad_parameter(self._transition, error) from error
        self._insert_changes(connection, ids, from_states, states, times, causes, node_id)

    def _insert_changes(
        self, connection: sa.Connection, ids: Sequence[int], from_states: Sequence[MessageState | None],
        to_texts: Sequence[str], at_texts: Sequence[str], causes: Sequence[str], node_id: str | None,
    ) -> None:
        """SQLite: :meth:`record_changes` with the to states and times converted, the from states None in every row
        or in none."""
        count = len(ids)
        no_from = from_states[0] is None
        # in the order of the parameters of transition_insert (absent optional values left out)
        columns: list[Sequence[Any]] = [ids]
        if not no_from:
            try:
                columns.append(_converted(self._optional_state, from_states))
            except (ValueError, TypeError, LookupError) as error:
                raise _bad_parameter(self._transition, error) from error
        columns += (to_texts, at_texts)
        if node_id is not None:
            columns.append((node_id,) * count)
        columns += ((1,) * count, ids, causes)
        sql = self._transition_shape((no_from, node_id is None, True, True, True))[0]
        cursor = self._cursor(connection)
        try:
            self._run(connection, cursor, sql, list(zip(*columns, strict=True)), True)
        finally:
            cursor.close()

    def _transition_shape(
        self, absent: tuple[bool, bool, bool, bool, bool],
    ) -> tuple[str, Callable[[Sequence[Any]], tuple[Any, ...]]]:
        """SQLite: the transition INSERT of rows lacking ``absent`` of the optional values (from state, node, error
        code, text, trace) and the getter of a row's parameters from its values."""
        shape = self._transitions.get(absent)
        if shape is None:
            shape = self._transitions[absent] = (transition_insert(self._mark, *absent), transition_values(absent))
        return shape

    def record_transitions(self, connection: sa.Connection, rows: Sequence[TransitionRow]) -> None:
        """INSERT ``message_transition`` rows (one executemany); the attempt is read from the message row."""
        if not rows:
            return
        state, optional, timestamp = self._state, self._optional_state, self._timestamp
        cursor = self._cursor(connection)
        try:
            if self.postgres:
                try:
                    parameters = [
                        (message_id, None if before is None else optional(before), state(after), timestamp(at), node,
                         offset, message_id, error, text, trace, cause)
                        for message_id, before, after, at, node, error, cause, offset, text, trace in rows
                    ]
                except (ValueError, TypeError, LookupError) as error:
                    raise _bad_parameter(self._transition, error) from error
                self._run(connection, cursor, self._transition, parameters, True)
                return
            # usually one group: the rows of one kind of change lack the same values
            groups: dict[tuple[bool, bool, bool, bool, bool], list[tuple[Any, ...]]] = {}
            last_at: Any = _NO_TIME  # the rows of one claim follow each other with its time
            try:
                for message_id, before, after, at, node, code, cause, offset, text, trace in rows:
                    absent = (before is None, node is None, code is None, text is None, trace is None)
                    group = groups.get(absent)
                    if group is None:
                        group = groups[absent] = []
                    if at is not last_at:
                        last_at, at_text = at, timestamp(at)
                    # in TRANSITION_OPTIONAL's order; the absent ones are left out of the parameters below
                    group.append((message_id, None if before is None else optional(before), state(after),
                                  at_text, node, offset, message_id, code, text, trace, cause))
            except (ValueError, TypeError, LookupError) as error:
                raise _bad_parameter(self._transition, error) from error
            for absent, group in groups.items():
                shape = self._transition_shape(absent)
                self._run(connection, cursor, shape[0], list(map(shape[1], group)), True)
        finally:
            cursor.close()
