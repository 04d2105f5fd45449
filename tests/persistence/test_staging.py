"""The set-based write of a batch of state changes (``persistence/_staging.py``, ``store.transitions.apply_many``
with ``staged=True``): the rows it leaves in ``message`` and ``message_transition`` are those of the per-row path,
and a message changed since it was read is not overwritten, on each real database."""

from __future__ import annotations

from typing import Any

import pytest
from openroute.persistence import MessageState, MessageStore, message_table
from openroute.persistence.models import message_transition_table

from tests.persistence.conftest import START, new_message, rows

S = MessageState
#: the changes of a batch: (from, to, the changed columns), one per message
CHANGES: list[tuple[MessageState, MessageState, dict[str, Any]]] = [
    (S.NEW, S.PARTLY_FAILED, {"failed_count": 1, "last_error_code": "E_DOWN", "last_error_text": "HTTP 503",
                              "custom_data": {"step": 2}}),
    (S.NEW, S.CANCEL, {"last_error_code": "CANCELLED"}),
    (S.NEW, S.POSTPONED, {"next_attempt_at": START, "business_errors": [{"code": "LATER"}]}),
]


def _written(store: MessageStore, ids: list[int]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The message rows of ``ids`` (in that order) and their transition rows, without the columns that tell two
    messages apart (id, correlation id, the transition row's own id)."""
    messages = {row["id"]: row for row in rows(store, message_table)}
    transitions = rows(store, message_transition_table, message_transition_table.c.id)
    return ([{k: v for k, v in messages[i].items() if k not in ("id", "correlation_id")} for i in ids],
            [{k: v for k, v in row.items() if k not in ("id", "message_id")}
             for i in ids for row in transitions if row["message_id"] == i])


def test_a_staged_batch_leaves_the_rows_of_the_per_row_path(store: MessageStore) -> None:
    staged = [store.insert_message(new_message(f"s-{n}")).message for n in range(3)]
    per_row = [store.insert_message(new_message(f"r-{n}")).message for n in range(3)]

    def batch(messages: list[Any]) -> list[Any]:
        return [(m.id, m.version, old, new, START, changes) for m, (old, new, changes) in zip(messages, CHANGES,
                                                                                                 strict=True)]

    with store.begin() as connection:
        assert store.transitions.apply_many(batch(staged), connection, node_id="spark", cause="reprocess",
                                            staged=True) == [True, True, True]
    with store.begin() as connection:
        assert store.transitions.apply_many(batch(per_row), connection, node_id="spark",
                                            cause="reprocess") == [True, True, True]

    staged_rows, per_row_rows = _written(store, [m.id for m in staged]), _written(store, [m.id for m in per_row])
    assert staged_rows == per_row_rows
    messages, transitions = staged_rows
    assert [(m["state"], m["version"], m["failed_count"], m["last_error_code"]) for m in messages] == [
        (S.PARTLY_FAILED, 1, 1, "E_DOWN"), (S.CANCEL, 1, 0, "CANCELLED"), (S.POSTPONED, 1, 0, None)]
    assert messages[0]["custom_data"] == {"step": 2} and messages[2]["next_attempt_at"] == START
    assert [(t["from_state"], t["to_state"], t["node_id"], t["cause"]) for t in transitions if t["from_state"]] == [
        (S.NEW, S.PARTLY_FAILED, "spark", "reprocess"), (S.NEW, S.CANCEL, "spark", "reprocess"),
        (S.NEW, S.POSTPONED, "spark", "reprocess")]


def test_a_message_changed_since_it_was_read_is_not_overwritten_and_gets_no_transition_row(
    store: MessageStore,
) -> None:
    fresh, moved = (store.insert_message(new_message(key)).message for key in ("c-1", "c-2"))
    assert store.transitions.apply((moved.id, moved.version, S.NEW, S.PROCESSING, START, {}), node_id="node-1")
    with store.begin() as connection:
        assert store.transitions.apply_many(
            [(fresh.id, fresh.version, S.NEW, S.CANCEL, START, {}), (moved.id, moved.version, S.NEW, S.CANCEL,
                                                                     START, {})],
            connection, staged=True) == [True, False]
    assert [(row["id"], row["state"], row["version"]) for row in rows(store, message_table, message_table.c.id)] == [
        (fresh.id, S.CANCEL, 1), (moved.id, S.PROCESSING, 1)]
    assert [(row["message_id"], row["to_state"]) for row in rows(
        store, message_transition_table, message_transition_table.c.id) if row["to_state"] != S.NEW] == [
        (moved.id, S.PROCESSING), (fresh.id, S.CANCEL)]
    with pytest.raises(ValueError), store.begin() as connection:
        store.transitions.apply_many([(fresh.id, 1, S.CANCEL, S.NEW, START, {})] * 2, connection, staged=True)
