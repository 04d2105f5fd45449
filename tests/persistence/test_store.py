"""The message store (``persistence/store.py``, ``MessageStore``) on each real database: inserts and duplicates,
external call records, the repoll's queries."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from openroute.persistence import (
    ExternalCallStatus,
    MessageState,
    MessageStore,
    NewMessage,
    StoredMessage,
)

from tests.persistence.conftest import START, new_message


def test_insert_stores_new_and_duplicates_are_reported(store: MessageStore) -> None:
    first = store.insert_message(new_message(headers={"h": "v"}, object_id="o-1"))
    assert not first.duplicate
    row = store.get(first.message.id)
    assert row == first.message
    assert row.state is MessageState.NEW and row.version == 0 and row.headers == {"h": "v"}
    again = store.insert_message(new_message())
    assert again.duplicate and again.message.id == first.message.id
    other_source = store.insert_message(new_message(source="erp"))
    assert not other_source.duplicate
    assert store.count_by_state() == {MessageState.NEW: 2}


def test_insert_claimed_stores_processing_for_the_node_with_both_transition_rows(store: MessageStore) -> None:
    claimed_at = START + timedelta(milliseconds=3)
    stored = store.insert_messages([new_message("c-1"), new_message("c-2")], node_id="node-1", claimed_at=claimed_at)
    assert [outcome.duplicate for outcome in stored] == [False, False]
    for outcome in stored:
        row = store.get(outcome.message.id)
        assert row == outcome.message  # the snapshot is the row as stored
        assert (row.state, row.version, row.node_id, row.start_process_ts, row.last_update_ts, row.receive_ts) == (
            MessageState.PROCESSING, 1, "node-1", claimed_at, claimed_at, START)
        assert [(t["from_state"], t["to_state"], t["at"], t["node_id"], t["attempt"])
                for t in store.transitions.of(row.id)] == [
            (None, MessageState.NEW, START, "node-1", 1),
            (MessageState.NEW, MessageState.PROCESSING, claimed_at, "node-1", 1)]
    # a duplicate is not claimed: the message stored before, as it is
    plain = store.insert_message(new_message("c-3"))
    again = store.insert_messages([new_message("c-3")], node_id="node-1", claimed_at=claimed_at)[0]
    assert again.duplicate and again.message == store.get(plain.message.id)
    assert again.message.state is MessageState.NEW and len(store.transitions.of(plain.message.id)) == 1
    with pytest.raises(ValueError, match="node_id"):
        store.insert_messages([new_message("c-4")], claimed_at=claimed_at)
    assert store.count_by_state() == {MessageState.PROCESSING: 2, MessageState.NEW: 1}


@pytest.mark.parametrize("claimed_at", [None, START + timedelta(milliseconds=3)])
def test_the_engines_pairs_are_the_outcomes_of_insert_messages(store: MessageStore, claimed_at: Any) -> None:
    """``insert_snapshots`` (the engine's accept) answers what ``insert_messages`` answers, as (message, duplicate)
    pairs: a batch without a duplicate (its pairs made apart), then one with duplicates within it and of before."""
    node = "node-1" if claimed_at is not None else None

    def batches(prefix: str) -> list[list[NewMessage]]:
        return [[new_message(f"{prefix}-1"), new_message(f"{prefix}-2", headers={"h": "v"})],
                [new_message(f"{prefix}-3"), new_message(f"{prefix}-1"), new_message(f"{prefix}-3"),
                 new_message(f"{prefix}-4", object_id="o-1")]]

    outcomes = [[(outcome.message, outcome.duplicate) for outcome in
                 store.insert_messages(batch, node_id=node, claimed_at=claimed_at)] for batch in batches("a")]
    pairs = [store.insert_snapshots(batch, node_id=node, claimed_at=claimed_at) for batch in batches("b")]

    def keyless(pair: tuple[StoredMessage, bool]) -> tuple[StoredMessage, bool]:
        message, duplicate = pair
        return message.evolve(id=0, correlation_id=message.correlation_id[2:]), duplicate

    assert [list(map(keyless, batch)) for batch in pairs] == [list(map(keyless, batch)) for batch in outcomes]
    assert [[duplicate for _, duplicate in batch] for batch in pairs] == [[False, False], [False, True, True, False]]
    for message, _ in pairs[0] + pairs[1]:
        assert message == store.get(message.id) and vars(message).keys() == vars(store.get(message.id)).keys()
    assert store.insert_snapshots([]) == []


def test_external_call_records(store: MessageStore) -> None:
    message = store.insert_message(new_message()).message
    assert store.calls.get(message.id, "k") is None
    store.calls.record(message.id, "k", ExternalCallStatus.FAILED, START, error="down")
    store.calls.record(message.id, "k", ExternalCallStatus.OK, START, result={"n": 1})
    call = store.calls.get(message.id, "k")
    assert call is not None and call.status is ExternalCallStatus.OK and call.attempts == 2 and call.result == {"n": 1}
    # an OK record is never overwritten by a later write
    store.calls.record(message.id, "k", ExternalCallStatus.FAILED, START, error="late")
    assert store.calls.get(message.id, "k") == call


def test_queries_of_the_repoll(store: MessageStore) -> None:
    message = store.insert_message(new_message()).message
    assert store.received_before(MessageState.NEW, START, 10) == [message]
    assert store.received_before(MessageState.NEW, START - timedelta(seconds=1), 10) == []
    assert store.due([MessageState.PARTLY_FAILED], START, 10) == []


