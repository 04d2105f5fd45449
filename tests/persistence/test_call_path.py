"""The statements of external calls run as SQL text on the driver's cursor (persistence/_call_path.py).

The STARTED rows, the outcomes and the call records must be stored exactly as SQLAlchemy Core stores the same rows
(compared as the database holds them, on each real database), refuse what Core's bind processors refuse, and still be
heard by SQLAlchemy's cursor listeners.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
import sqlalchemy as sa
from openroute.persistence import CallEnd, CallStart, ExternalCallStatus, MessageStore
from openroute.persistence.call_records import CallOutcome, CallRecord, CallRecordStore
from openroute.persistence.models import call_record_table, external_call_table

from tests.persistence.conftest import START, new_message

CEST = timezone(timedelta(hours=2))


def _raw(store: MessageStore, table: sa.Table, where: str) -> list[dict[str, Any]]:
    """Rows as the database holds them (no result processors: text, JSON text, naive timestamps on SQLite), without
    their id."""
    names = [c.name for c in table.c if c.name != "id"]
    with store.engine.connect() as connection:
        found = connection.exec_driver_sql(f"SELECT {', '.join(names)} FROM {table.name} WHERE {where} ORDER BY id")
        return [dict(zip(names, row, strict=True)) for row in found]


def _core_start(connection: sa.Connection, start: CallStart) -> None:
    """The first STARTED row as Core wrote it before (``ExternalCallStore.begin_many``'s INSERT)."""
    connection.execute(sa.insert(external_call_table), [{
        "message_id": start.message_id, "call_key": start.call_key, "status": ExternalCallStatus.STARTED,
        "attempts": 1, "idempotency_key": start.idempotency_key, "node_id": start.node_id, "started_at": start.at,
        "created_at": start.at, "updated_at": start.at}])


def _core_end(connection: sa.Connection, end: CallEnd) -> None:
    """The outcome as Core wrote it before (``ExternalCallStore.finish_many``'s UPDATE)."""
    c = external_call_table.c
    connection.execute(sa.update(external_call_table).where(
        c.message_id == end.message_id, c.call_key == end.call_key, c.status == ExternalCallStatus.STARTED,
    ).values(status=ExternalCallStatus.OK if end.ok else ExternalCallStatus.FAILED, result=end.result,
             last_error=end.error, updated_at=end.at))


@pytest.mark.parametrize("result", [{"id": 7, "ok": True, "name": "é"}, {}, [], None, "text", 3])
def test_call_rows_are_stored_as_sqlalchemy_core_stores_them(store: MessageStore, result: Any) -> None:
    ours, core = (store.insert_message(new_message(key)).message.id for key in ("ours", "core"))
    at = START.astimezone(CEST) + timedelta(microseconds=123)
    later = at + timedelta(seconds=1)
    start = CallStart(ours, "pay", "key-1", "node-a", at)
    with store.begin() as connection:
        assert store.calls.begin_many(connection, [start, CallStart(ours, "notify", "key-2", "node-a", at)]) == [
            (None, True), (None, True)]
        _core_start(connection, CallStart(core, "pay", "key-1", "node-a", at))
        _core_start(connection, CallStart(core, "notify", "key-2", "node-a", at))
    assert _raw(store, external_call_table, f"message_id = {ours}") == [
        {**row, "message_id": ours} for row in _raw(store, external_call_table, f"message_id = {core}")]

    with store.begin() as connection:
        store.calls.finish_many(connection, [CallEnd(ours, "pay", True, later, result=result),
                                             CallEnd(ours, "notify", False, later, error="HTTP 503")])
        _core_end(connection, CallEnd(core, "pay", True, later, result=result))
        _core_end(connection, CallEnd(core, "notify", False, later, error="HTTP 503"))
    written = _raw(store, external_call_table, f"message_id = {ours}")
    assert written == [{**row, "message_id": ours} for row in _raw(store, external_call_table, f"message_id = {core}")]
    assert [row["status"] for row in written] == ["OK", "FAILED"]
    assert store.calls.get(ours, "pay").result == result  # type: ignore[union-attr]


def test_call_records_are_stored_as_sqlalchemy_core_stores_them(store: MessageStore) -> None:
    ours, core = (store.insert_message(new_message(key)).message.id for key in ("ours", "core"))
    at = START.astimezone(CEST) + timedelta(microseconds=5)
    made = [
        CallRecord(ours, "bank", "pay", at, 1200, CallOutcome.TIMEOUT, request="POST /pay\n{}", error="timed out"),
        CallRecord(ours, "bank", "pay", at + timedelta(seconds=5), 40, CallOutcome.OK, request="<pay/>",
                   response="HTTP 200\n{\"é\": 1}"),
        CallRecord(ours, "crm", "notify", at, 7, "BUSINESS_ERROR"),  # type: ignore[arg-type]  a plain text, as Core takes it
    ]
    records = CallRecordStore(store)
    with store.begin() as connection:
        ids = records.add_many(connection, made)
        for record in made:
            values = {name: getattr(record, name) for name in (
                "system", "call_key", "started_at", "duration_ms", "outcome", "request", "response", "error")}
            connection.execute(sa.insert(call_record_table).values(message_id=core, **values))
    assert ids == sorted(ids) and len(set(ids)) == 3
    assert _raw(store, call_record_table, f"message_id = {ours}") == [
        {**row, "message_id": ours} for row in _raw(store, call_record_table, f"message_id = {core}")]
    assert [record.id for record in records.of_message(ours)] == ids
    assert records.add(CallRecord(ours, "crm", "notify", at, 1, CallOutcome.FAILED)) > ids[-1]


def test_a_first_start_met_by_a_row_is_decided_on_alone(store: MessageStore) -> None:
    message_id = store.insert_message(new_message()).message.id
    with store.begin() as connection:
        store.calls.begin_many(connection, [CallStart(message_id, "pay", "key-1", "node-a", START)])
        store.calls.finish_many(connection, [CallEnd(message_id, "pay", False, START, error="down")])
    with store.begin() as connection:
        [(previous, started), (none, fresh)] = store.calls.begin_many(connection, [
            CallStart(message_id, "pay", "key-1", "node-b", START + timedelta(seconds=1)),
            CallStart(message_id, "other", "key-2", "node-b", START)])
    assert previous is not None and previous.status is ExternalCallStatus.FAILED and started
    assert (none, fresh) == (None, True)
    call = store.calls.get(message_id, "pay")
    assert call is not None and (call.status, call.attempts, call.node_id) == (ExternalCallStatus.STARTED, 2, "node-b")


def test_values_sqlalchemy_refuses_are_refused_with_its_error(store: MessageStore) -> None:
    message_id = store.insert_message(new_message()).message.id
    naive = datetime(2024, 3, 1, 12, 0)  # the point of the test: no time zone
    with pytest.raises(sa.exc.StatementError, match="naive datetime"), store.begin() as connection:
        store.calls.begin_many(connection, [CallStart(message_id, "pay", "key-1", "node-a", naive)])
    with pytest.raises(sa.exc.StatementError, match="naive datetime"), store.begin() as connection:
        CallRecordStore(store).add_many(connection, [CallRecord(message_id, "bank", "pay", naive, 1, CallOutcome.OK)])
    assert store.calls.get(message_id, "pay") is None


def test_cursor_listeners_hear_every_call_statement(store: MessageStore) -> None:
    message_id = store.insert_message(new_message()).message.id
    heard: list[str] = []

    def listen(_connection: Any, _cursor: Any, statement: str, *_rest: Any) -> None:
        heard.append(statement.split()[0] + " " + statement.split()[2 if statement.startswith("INSERT") else 1])

    sa.event.listen(store.engine, "before_cursor_execute", listen)
    try:
        with store.begin() as connection:
            store.calls.begin_many(connection, [CallStart(message_id, "pay", "key-1", "node-a", START)])
            store.calls.finish_many(connection, [CallEnd(message_id, "pay", True, START, result={"a": 1})])
            CallRecordStore(store).add_many(connection, [
                CallRecord(message_id, "bank", "pay", START.astimezone(UTC), 1, CallOutcome.OK)])
    finally:
        sa.event.remove(store.engine, "before_cursor_execute", listen)
    assert [h for h in heard if not h.startswith(("BEGIN", "COMMIT"))] == [
        "INSERT external_call", "UPDATE external_call", "INSERT call_record"]
