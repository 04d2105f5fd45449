"""Records of external calls: the request and response (or error) of each call, with its message, time, duration and
outcome. They go with their message (``ON DELETE CASCADE``), so the retention job prunes them too."""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from openroute.persistence._call_path import CallPath
from openroute.persistence.models import call_record_table
from openroute.persistence.store import MessageStore

__all__ = ["CallOutcome", "CallRecord", "CallRecordStore"]


class CallOutcome(enum.StrEnum):
    """How a call ended (the ``outcome`` of a call record and of the ``openroute_external_calls`` metric)."""

    OK = "OK"
    #: the system answered with a business error: an answer, so a success for the breaker
    BUSINESS_ERROR = "BUSINESS_ERROR"
    FAILED = "FAILED"
    TIMEOUT = "TIMEOUT"
    #: the breaker refused it: not made (counted by the metric, never recorded)
    REFUSED = "REFUSED"


@dataclass(frozen=True)
class CallRecord:
    """One recorded external call (``id`` is None before it is stored)."""

    message_id: int
    system: str
    call_key: str
    started_at: datetime
    duration_ms: int
    #: OK, BUSINESS_ERROR, FAILED or TIMEOUT
    outcome: CallOutcome
    request: str | None = None
    response: str | None = None
    error: str | None = None
    id: int | None = None

    def to_json(self) -> dict[str, Any]:
        """The JSON form the admin API shows."""
        return {
            "id": self.id, "system": self.system, "callKey": self.call_key, "startedAt": self.started_at.isoformat(),
            "durationMs": self.duration_ms, "outcome": self.outcome, "request": self.request,
            "response": self.response, "error": self.error,
        }


class CallRecordStore:
    """The ``call_record`` table of ``store``.

    A record is written as SQL text on the driver's cursor (:mod:`._call_path`: the values through the columns' own
    bind processors, the rows SQLAlchemy Core would write); a node writes its records in its group commit
    (:meth:`add_many`), a group's in one pass, with no transaction of their own.
    """

    def __init__(self, store: MessageStore) -> None:
        self.store = store
        self._path = CallPath(store.engine.dialect)

    def add(self, record: CallRecord, connection: sa.Connection | None = None) -> int:
        """Store ``record``; returns its id."""
        return self.store.run(lambda c: self.add_many(c, [record])[0], connection)

    def add_many(self, connection: sa.Connection, records: Sequence[CallRecord]) -> list[int]:
        """Store ``records`` in ``connection``'s transaction; returns their ids, in order."""
        return self._path.add_records(connection, [
            (r.message_id, r.system, r.call_key, r.started_at, r.duration_ms, r.outcome, r.request, r.response,
             r.error) for r in records])

    def of_message(self, message_id: int, connection: sa.Connection | None = None) -> list[CallRecord]:
        """The records of ``message_id``'s calls, oldest first."""
        table = call_record_table
        query = sa.select(table).where(table.c.message_id == message_id).order_by(table.c.id)
        return self.store.run(lambda c: [_record(r) for r in c.execute(query)], connection)


def _record(row: sa.Row[Any]) -> CallRecord:
    return CallRecord(**{**row._mapping, "outcome": CallOutcome(row.outcome)})
