"""The set-based write of a batch of state changes: rows staged in a temporary table, then one UPDATE of the
``message`` rows and one INSERT of their ``message_transition`` rows for the whole batch.

:meth:`Transitions.apply_many` writes one parameter set per message (an executemany); a bulk job that changes
thousands of messages per batch (``openroute spark reprocess --apply``) pays a statement round per row there. Here
the batch goes into the temporary table ``transition_staging`` (PostgreSQL: ``COPY``; SQLite: one executemany
into the temporary table, which is no write to the database file) and the database joins it with ``message``:

* PostgreSQL: one statement, ``WITH written AS (UPDATE message ... FROM transition_staging ... RETURNING ...)
  INSERT INTO message_transition SELECT ... FROM written``: only the rows the UPDATE matched at their version get
  their transition row;
* SQLite: the INSERT of the transition rows of the staged rows still at their version, then the UPDATE of the same
  rows; the transaction holds the write lock (``BEGIN IMMEDIATE``), so both statements see the same rows.

The version check is the one of the per-row path: a row matched by id and version only, so a message another writer
changed since it was read is not overwritten (its flag is False). Values go through the columns' own bind
processors, so a row is stored exactly as the per-row path stores it. The statements run on the DB-API cursor;
SQLAlchemy's cursor listeners do not hear them (a bulk job's batch, not the engine's hot path that tracing follows).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from openroute.persistence._bind import Processor, _processor
from openroute.persistence._hot_path import _bad_parameter
from openroute.persistence.models import MessageState, message_table, message_transition_table

#: one staged change: (message id, version read, from state, to state, at, node id, cause, what to add to the
#: written failed count for the transition row's attempt, the changed columns)
StagedItem = tuple[int, int, MessageState, MessageState, datetime, str | None, str, int, Mapping[str, Any]]

STAGING_TABLE = "transition_staging"


class StagedWriter:
    """The staging table and the two statements of one dialect (``sqlite`` or ``postgresql``) for ``columns``."""

    def __init__(self, dialect: sa.Dialect, columns: Sequence[str]) -> None:
        self.postgres = dialect.name == "postgresql"
        m, t = message_table.c, message_transition_table.c
        self.columns = tuple(sorted(columns))
        self._processors: list[Processor | None] = [_processor(m[name], dialect) for name in self.columns]
        self._state = _processor(m.state, dialect) or (lambda value: value)
        self._timestamp = _processor(m.last_update_ts, dialect) or (lambda value: value)

        def kind(column: sa.Column[Any]) -> str:
            return str(column.type.compile(dialect))

        staged = [
            ("seq", "INTEGER"), ("message_id", kind(m.id)), ("version", kind(m.version)),
            # the transition row's values (t_*: the message's columns keep their own names below)
            ("t_from", kind(t.from_state)), ("t_to", kind(t.to_state)), ("t_at", kind(t.at)),
            ("t_node", kind(t.node_id)), ("t_cause", kind(t.cause)), ("t_offset", "INTEGER"),
            ("t_code", kind(t.error_code)), ("t_text", kind(t.error_text)), ("t_trace", kind(t.error_trace)),
        ]
        for name in self.columns:
            staged += [(name, kind(m[name])), (f"set_{name}", "INTEGER")]
        self.staged_names = [name for name, _ in staged]
        body = ", ".join(f"{name} {type_}" for name, type_ in staged)
        tail = " ON COMMIT DELETE ROWS" if self.postgres else ""
        self.create = f"CREATE TEMPORARY TABLE IF NOT EXISTS {STAGING_TABLE} ({body}){tail}"
        # a column the item does not change keeps its value (set_<column> = 0)
        assignments = "".join(
            f", {name} = CASE WHEN s.set_{name} = 1 THEN s.{name} ELSE message.{name} END" for name in self.columns
        )
        self.update = (
            f"UPDATE message SET state = s.t_to, version = message.version + 1, last_update_ts = s.t_at"  # noqa: S608  names are the schema's constants
            f"{assignments} FROM {STAGING_TABLE} AS s "
            "WHERE message.id = s.message_id AND message.version = s.version"
        )
        insert = ("INSERT INTO message_transition (message_id, from_state, to_state, at, node_id, attempt, "
                  "error_code, error_text, error_trace, cause) ")
        if self.postgres:
            self.write = (
                f"WITH written AS ({self.update} RETURNING message.id, message.failed_count) "  # noqa: S608  names are the schema's constants
                f"{insert}SELECT s.message_id, s.t_from, s.t_to, s.t_at, s.t_node, "
                "w.failed_count + s.t_offset, s.t_code, s.t_text, s.t_trace, s.t_cause "
                f"FROM written AS w JOIN {STAGING_TABLE} AS s ON s.message_id = w.id ORDER BY s.seq "
                "RETURNING message_id"
            )
        else:
            # before the UPDATE: the attempt from the failed count as it will be written
            failed = "CASE WHEN s.set_failed_count = 1 THEN s.failed_count ELSE m.failed_count END" \
                if "failed_count" in self.columns else "m.failed_count"
            self.write = (
                f"{insert}SELECT s.message_id, s.t_from, s.t_to, s.t_at, s.t_node, "  # noqa: S608  names are the schema's constants
                f"{failed} + s.t_offset, s.t_code, s.t_text, s.t_trace, s.t_cause "
                f"FROM {STAGING_TABLE} AS s JOIN message AS m ON m.id = s.message_id AND m.version = s.version "
                "ORDER BY s.seq"
            )

    def _rows(self, items: Sequence[StagedItem]) -> list[list[Any]]:
        state, timestamp, processors = self._state, self._timestamp, self._processors
        rows = []
        try:
            for seq, (message_id, version, before, after, at, node, cause, offset, changes) in enumerate(items):
                code = changes.get("last_error_code")
                text, trace = (None, None) if code is None else (changes.get("last_error_text"),
                                                                 changes.get("last_error_trace"))
                row: list[Any] = [seq, message_id, version, state(before), state(after), timestamp(at), node, cause,
                                  offset, code, text, trace]
                for name, process in zip(self.columns, processors, strict=True):
                    if name in changes:
                        value = changes[name]
                        row += [value if process is None or value is None else process(value), 1]
                    else:
                        row += [None, 0]
                rows.append(row)
        except (ValueError, TypeError, LookupError) as error:
            raise _bad_parameter(self.update, error) from error
        return rows

    def apply(self, connection: sa.Connection, items: Sequence[StagedItem]) -> set[int]:
        """Stage ``items`` and write those still at their version; returns the ids written."""
        ids = [item[0] for item in items]
        if len(set(ids)) != len(ids):
            raise ValueError("a staged batch changes each message at most once (a message id repeats)")
        rows = self._rows(items)
        cursor = connection.connection.dbapi_connection.cursor()  # type: ignore[union-attr]
        try:
            cursor.execute(self.create)
            names = ", ".join(self.staged_names)
            if self.postgres:
                with cursor.copy(f"COPY {STAGING_TABLE} ({names}) FROM STDIN") as copy:
                    for row in rows:
                        copy.write_row(row)
                cursor.execute(self.write)
                written = {int(row[0]) for row in cursor.fetchall()}
            else:
                cursor.execute(f"DELETE FROM {STAGING_TABLE}")  # noqa: S608  a constant name
                marks = ", ".join("?" for _ in self.staged_names)
                cursor.executemany(f"INSERT INTO {STAGING_TABLE} ({names}) VALUES ({marks})", rows)  # noqa: S608  names are the schema's constants
                cursor.execute(self.write)
                recorded = cursor.rowcount
                cursor.execute(f"{self.update} RETURNING message.id")
                written = {int(row[0]) for row in cursor.fetchall()}
                if len(written) != recorded:  # cannot happen under the write lock: say so rather than go on
                    raise RuntimeError(f"staged write: {recorded} transition rows for {len(written)} updates")
                cursor.execute(f"DELETE FROM {STAGING_TABLE}")  # noqa: S608  a constant name
            return written
        finally:
            cursor.close()
