"""The statements of every external call a route makes, as SQL text on the driver's cursor.

A call of a message costs the store its STARTED record (the ``external_call`` INSERT, committed before the call),
its outcome (the ``external_call`` UPDATE) and, with the system's call records on, its ``call_record`` INSERT. Through
SQLAlchemy Core each execution builds its statement's parameters and execution context anew, inside the group commit
or, for a record, in a transaction of its own. Here, as for the message statements (:mod:`._hot_path`), the SQL is
written once per dialect, each value goes through its column's own bind processor (a row is stored exactly as
SQLAlchemy Core stores it: tests/persistence/test_call_path.py compares both) and the text runs on the DB-API cursor
of the caller's connection, inside its transaction; SQLAlchemy's cursor listeners still hear every statement.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from openroute.persistence._bind import Processor, _processor
from openroute.persistence._hot_path import HotPath, _bad_parameter
from openroute.persistence._statements import in_statement_sizes
from openroute.persistence.models import ExternalCallStatus, call_record_table, external_call_table

#: the columns of a call's first STARTED row, in the order of the INSERT's values (``result`` and ``last_error`` are
#: left out, so they are NULL as Core's INSERT of the same row leaves them)
START_COLUMNS: tuple[str, ...] = (
    "message_id", "call_key", "status", "attempts", "refused", "idempotency_key", "node_id", "started_at",
    "created_at", "updated_at",
)

#: the columns of a ``call_record`` row, in the order of the INSERT's values
RECORD_COLUMNS: tuple[str, ...] = (
    "message_id", "system", "call_key", "started_at", "duration_ms", "outcome", "request", "response", "error",
)

#: a first start: (message id, call key, idempotency key, node id, at)
StartRow = tuple[int, str, str, str, datetime]
#: an outcome: (message id, call key, OK or FAILED, result, error, at)
EndRow = tuple[int, str, ExternalCallStatus, Any, "str | None", datetime]


def _identity(value: Any) -> Any:
    return value


class CallPath:
    """The call statements of one dialect (``sqlite`` or ``postgresql``), ready to run on a connection."""

    def __init__(self, dialect: sa.Dialect) -> None:
        self.postgres = dialect.name == "postgresql"
        mark = "%s" if self.postgres else "?"
        c, r = external_call_table.c, call_record_table.c
        self._status: Processor = _processor(c.status, dialect) or _identity
        self._result: Processor = _processor(c.result, dialect) or _identity
        self._call_time: Processor = _processor(c.updated_at, dialect) or _identity
        self._record_time: Processor = _processor(r.started_at, dialect) or _identity
        self._started = self._status(ExternalCallStatus.STARTED)
        self._start_row = "(" + ", ".join(mark for _ in START_COLUMNS) + ")"
        self._start_head = f"INSERT INTO external_call ({', '.join(START_COLUMNS)}) VALUES "  # noqa: S608  names are the schema's constants; values are bound parameters
        self._start_tail = " ON CONFLICT (message_id, call_key) DO NOTHING RETURNING message_id, call_key"
        self._starts: dict[int, str] = {}  # SQLite: by rows (chunks of powers of two, so the texts repeat)
        self.end = (f"UPDATE external_call SET status = {mark}, result = {mark}, last_error = {mark}, "  # noqa: S608  names are the schema's constants; values are bound parameters
                    f"updated_at = {mark} WHERE message_id = {mark} AND call_key = {mark} AND status = {mark}")
        self.record = (f"INSERT INTO call_record ({', '.join(RECORD_COLUMNS)}) VALUES "  # noqa: S608  names are the schema's constants; values are bound parameters
                       f"({', '.join(mark for _ in RECORD_COLUMNS)}) RETURNING id")

    def start(self, connection: sa.Connection, rows: Sequence[StartRow]) -> set[tuple[int, str]]:
        """INSERT the first STARTED rows of calls (attempts 1, refused 0); the (message id, call key) of those
        inserted. A call that has its row already is left as it is (``ON CONFLICT DO NOTHING``)."""
        if not rows:
            return set()
        status, at = self._started, self._call_time
        try:
            parameters = []
            for message_id, call_key, idempotency_key, node_id, now in rows:
                when = at(now)
                parameters.append([message_id, call_key, status, 1, 0, idempotency_key, node_id, when, when, when])
        except (ValueError, TypeError, LookupError) as error:
            raise _bad_parameter(self._start_head, error) from error
        inserted: set[tuple[int, str]] = set()
        cursor = HotPath._cursor(connection)
        try:
            if self.postgres:  # one text for any group: psycopg prepares it once and pipelines the executemany
                sql = self._start_head + self._start_row + self._start_tail
                HotPath._run(connection, cursor, sql, parameters, True, returning=True)
                while True:
                    found = cursor.fetchone()
                    if found is not None:
                        inserted.add((int(found[0]), found[1]))
                    if not cursor.nextset():
                        break
                return inserted
            for chunk in in_statement_sizes(parameters):
                HotPath._run(connection, cursor, self._sqlite_start(len(chunk)),
                             [value for row in chunk for value in row], False)
                inserted.update((int(message_id), call_key) for message_id, call_key in cursor.fetchall())
            return inserted
        finally:
            cursor.close()

    def _sqlite_start(self, rows: int) -> str:
        sql = self._starts.get(rows)
        if sql is None:
            sql = self._starts[rows] = self._start_head + ", ".join([self._start_row] * rows) + self._start_tail
        return sql

    def finish(self, connection: sa.Connection, rows: Sequence[EndRow]) -> None:
        """UPDATE the calls still STARTED to their outcome (status, result, error, at): one executemany."""
        if not rows:
            return
        status, result, at, started = self._status, self._result, self._call_time, self._started
        try:
            parameters = [[status(outcome), result(value), error, at(now), message_id, call_key, started]
                          for message_id, call_key, outcome, value, error, now in rows]
        except (ValueError, TypeError, LookupError) as error:
            raise _bad_parameter(self.end, error) from error
        cursor = HotPath._cursor(connection)
        try:
            if len(parameters) == 1:
                HotPath._run(connection, cursor, self.end, parameters[0], False)
            else:
                HotPath._run(connection, cursor, self.end, parameters, True)
        finally:
            cursor.close()

    def add_records(self, connection: sa.Connection, rows: Sequence[Sequence[Any]]) -> list[int]:
        """INSERT ``call_record`` rows (values in the order of :data:`RECORD_COLUMNS`); their new ids, in order."""
        if not rows:
            return []
        at = self._record_time
        try:
            parameters = [[message_id, system, call_key, at(started), millis, str(outcome), request, response, error]
                          for message_id, system, call_key, started, millis, outcome, request, response, error in rows]
        except (ValueError, TypeError, LookupError) as error:
            raise _bad_parameter(self.record, error) from error
        cursor = HotPath._cursor(connection)
        try:
            if self.postgres and len(parameters) > 1:  # pipelined, each row's id kept
                HotPath._run(connection, cursor, self.record, parameters, True, returning=True)
                ids = []
                while True:
                    ids.append(int(cursor.fetchone()[0]))
                    if not cursor.nextset():
                        break
                return ids
            ids = []
            for row in parameters:  # SQLite: one compiled statement, run per row (no round trip)
                HotPath._run(connection, cursor, self.record, row, False)
                ids.append(int(cursor.fetchone()[0]))
            return ids
        finally:
            cursor.close()
