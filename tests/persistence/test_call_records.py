"""The records of external calls (``persistence/call_records.py``, ``CallRecordStore``): one ``call_record`` row per
call, read back per message in the order made, on each real database."""

from __future__ import annotations

from datetime import timedelta

from openroute.persistence import MessageStore
from openroute.persistence.call_records import CallOutcome, CallRecord, CallRecordStore
from openroute.persistence.models import call_record_table

from tests.persistence.conftest import START, new_message, rows


def test_a_record_is_one_row_and_a_message_s_records_come_back_oldest_first(store: MessageStore) -> None:
    first, other = (store.insert_message(new_message(key)).message.id for key in ("c-1", "c-2"))
    records = CallRecordStore(store)
    failed = CallRecord(first, "bank", "pay", START, 1200, CallOutcome.TIMEOUT, request="<pay/>",
                        error="read timed out")
    answered = CallRecord(first, "bank", "pay", START + timedelta(seconds=5), 40, CallOutcome.BUSINESS_ERROR,
                          request="<pay/>", response="<refused/>")
    elsewhere = CallRecord(other, "crm", "notify", START, 7, CallOutcome.OK)
    ids = [records.add(record) for record in (failed, answered, elsewhere)]

    assert ids == sorted(ids) and len(set(ids)) == 3
    stored = rows(store, call_record_table, call_record_table.c.id)
    assert [(row["message_id"], row["system"], row["call_key"], row["duration_ms"], row["outcome"], row["error"])
            for row in stored] == [
        (first, "bank", "pay", 1200, "TIMEOUT", "read timed out"),
        (first, "bank", "pay", 40, "BUSINESS_ERROR", None),
        (other, "crm", "notify", 7, "OK", None)]
    assert records.of_message(first) == [
        CallRecord(**{**vars(failed), "id": ids[0]}), CallRecord(**{**vars(answered), "id": ids[1]})]
    assert records.of_message(first)[0].outcome is CallOutcome.TIMEOUT
    assert records.of_message(other + 100) == []


def test_a_record_added_in_a_transaction_goes_with_it(store: MessageStore) -> None:
    message_id = store.insert_message(new_message()).message.id
    records = CallRecordStore(store)
    record = CallRecord(message_id, "bank", "pay", START, 3, CallOutcome.FAILED, error="HTTP 503")
    try:
        with store.begin() as connection:
            records.add(record, connection)
            assert len(records.of_message(message_id, connection)) == 1
            raise RuntimeError("rolled back")
    except RuntimeError:
        pass
    assert rows(store, call_record_table) == []
