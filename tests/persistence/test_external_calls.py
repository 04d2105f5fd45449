"""The group forms of the call records (``ExternalCallStore.begin_many``, ``finish_many``) decide as ``begin`` and
``finish`` do, one call at a time, on SQLite and PostgreSQL."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from openroute.persistence import (
    CallEnd,
    CallStart,
    ExternalCallStatus,
    MessageState,
    MessageStore,
    NewMessage,
)

START = datetime(2024, 3, 1, 12, 0, tzinfo=UTC)
LATER = START + timedelta(minutes=1)


def _message(store: MessageStore, n: int) -> int:
    return store.insert_message(NewMessage(
        service="orders", operation="create", payload="{}", content_type="application/json",
        correlation_id=f"c-{n}", source_system="CRM", receive_ts=START)).message.id


def test_a_group_of_starts_records_new_calls_and_decides_recorded_ones_as_begin_does(store: MessageStore) -> None:
    fresh, failed, done, in_doubt, held = (_message(store, n) for n in range(5))
    calls = store.calls
    for message_id in (failed, done, in_doubt, held):
        assert calls.begin(message_id, "pay", f"key-{message_id}", "node-a", START) == (None, True)
    calls.finish(failed, "pay", False, START, error="HTTP 503")
    calls.finish(done, "pay", True, START, result={"receipt": 7})

    with store.begin() as connection:
        results = calls.begin_many(connection, [
            CallStart(fresh, "pay", "key-new", "node-b", LATER),
            CallStart(failed, "pay", "key-failed", "node-b", LATER),
            CallStart(done, "pay", "key-done", "node-b", LATER),
            CallStart(in_doubt, "pay", "key-doubt", "node-b", LATER),
            CallStart(held, "pay", "key-held", "node-b", LATER, hold_in_doubt=True),
        ])

    assert [started for _previous, started in results] == [True, True, False, True, False]
    assert results[0][0] is None
    assert [previous.status for previous, _ in results[1:]] == [  # type: ignore[union-attr]
        ExternalCallStatus.FAILED, ExternalCallStatus.OK, ExternalCallStatus.STARTED, ExternalCallStatus.STARTED]
    new = calls.get(fresh, "pay")
    assert new is not None and (new.status, new.attempts, new.idempotency_key, new.node_id, new.started_at) == (
        ExternalCallStatus.STARTED, 1, "key-new", "node-b", LATER)
    retried = calls.get(failed, "pay")
    assert retried is not None and (retried.status, retried.attempts, retried.node_id) == (
        ExternalCallStatus.STARTED, 2, "node-b")
    kept = calls.get(done, "pay")
    assert kept is not None and (kept.status, kept.attempts, kept.result) == (ExternalCallStatus.OK, 1, {"receipt": 7})
    untouched = calls.get(held, "pay")
    assert untouched is not None and (untouched.attempts, untouched.node_id) == (1, "node-a")


def test_a_group_of_ends_records_each_outcome_and_leaves_calls_no_longer_started(store: MessageStore) -> None:
    ok, failed, cancelled = (_message(store, n) for n in range(3))
    calls = store.calls
    for message_id in (ok, failed, cancelled):
        calls.begin(message_id, "pay", f"key-{message_id}", "node-a", START)
    calls.resolve_in_doubt(cancelled, True, START)  # an operator marked it done meanwhile

    with store.begin() as connection:
        calls.finish_many(connection, [
            CallEnd(ok, "pay", True, LATER, result={"receipt": 1, "text": "café"}),
            CallEnd(failed, "pay", False, LATER, error="TechnicalError: HTTP 503"),
            CallEnd(cancelled, "pay", False, LATER, error="too late"),
        ])

    recorded = calls.get(ok, "pay")
    assert recorded is not None and (recorded.status, recorded.result, recorded.last_error) == (
        ExternalCallStatus.OK, {"receipt": 1, "text": "café"}, None)
    broken = calls.get(failed, "pay")
    assert broken is not None and (broken.status, broken.last_error) == (
        ExternalCallStatus.FAILED, "TechnicalError: HTTP 503")
    resolved = calls.get(cancelled, "pay")
    assert resolved is not None and (resolved.status, resolved.last_error) == (ExternalCallStatus.OK, None)
    assert store.get(ok).state is MessageState.NEW  # type: ignore[union-attr]  # the message itself is not touched
