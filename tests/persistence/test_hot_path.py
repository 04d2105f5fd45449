"""The per-message statements run as SQL text on the driver's cursor (persistence/_hot_path.py).

They must store exactly what SQLAlchemy Core would store, refuse what its bind processors refuse with the same
error, and still be heard by SQLAlchemy's cursor listeners (tracing, the plan tests).
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
import sqlalchemy as sa
from openroute.persistence import MessageState, MessageStore, NewMessage, message_table
from openroute.persistence._statements import statement_sizes
from openroute.persistence.models import message_transition_table

from openroute.engine import states
from tests.persistence.conftest import START

CEST = timezone(timedelta(hours=2))


def _new(key: str, **extra: Any) -> NewMessage:
    values: dict[str, Any] = dict(service="s", operation="o", payload="<p>é</p>", content_type="text/xml",
                                  correlation_id=key, source_system="crm", receive_ts=START)
    values.update(extra)
    return NewMessage(**values)


def _raw_row(store: MessageStore, message_id: int) -> dict[str, Any]:
    """The row as the database holds it (no result processors: text, JSON text, naive timestamps on SQLite)."""
    names = [c.name for c in message_table.c if c.name != "id"]
    with store.engine.connect() as connection:
        row = connection.exec_driver_sql(
            f"SELECT {', '.join(names)} FROM message WHERE id = {int(message_id)}"
        ).one()
    return dict(zip(names, row, strict=True))


def test_rows_are_stored_as_sqlalchemy_core_stores_them(store: MessageStore) -> None:
    """The same message inserted and moved through the hot path and through Core: identical raw rows."""
    stamp = datetime(2024, 6, 1, 14, 0, 0, 5, tzinfo=CEST)
    hot = store.insert_message(_new("hot", msg_ts=stamp, headers={"h": "v"}, object_id="o-1", process_id="p")).message
    values = {c.name: getattr(hot, c.name) for c in message_table.c if c.name != "id"}
    values["correlation_id"] = "core"
    with store.begin() as connection:
        core_id = connection.execute(message_table.insert().values(values).returning(message_table.c.id)).scalar_one()
    assert _raw_row(store, hot.id) | {"correlation_id": "core"} == _raw_row(store, core_id)

    # an outcome writing JSON, text and timestamp columns, by the hot path and by Core
    changes = {"custom_data": {"n": 1, "s": "ü"}, "business_errors": [{"code": "B"}], "last_error_code": "E",
               "last_error_text": "boom", "next_attempt_at": stamp, "failed_count": 1}
    [claimed] = states.claim(store, [hot], "node-1", START)
    updated = states.transition(store, claimed, MessageState.PARTLY_FAILED, START + timedelta(seconds=1), changes)
    core_values = {"state": MessageState.PARTLY_FAILED, "version": 2, "last_update_ts": START + timedelta(seconds=1),
                   "node_id": "node-1", "start_process_ts": START, **changes}
    with store.begin() as connection:
        connection.execute(message_table.update().where(message_table.c.id == core_id).values(core_values))
    assert _raw_row(store, hot.id) | {"correlation_id": "core"} == _raw_row(store, core_id)
    assert store.get(hot.id) == updated  # the snapshot the engine follows is the row read back


def test_values_sqlalchemy_refuses_are_refused_with_its_error(store: MessageStore) -> None:
    with pytest.raises(sa.exc.StatementError, match="naive"):
        store.insert_message(_new("naive", msg_ts=datetime(2024, 1, 1)))
    message = store.insert_message(_new("ok")).message
    with pytest.raises(sa.exc.StatementError, match="naive"):
        store.transitions.apply((message.id, 0, MessageState.NEW, MessageState.CANCEL, datetime(2024, 1, 1), {}))
    with pytest.raises(sa.exc.StatementError, match="BOGUS"):
        store.transitions.apply((message.id, 0, MessageState.NEW, "BOGUS", START, {}))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="cannot write"):
        store.transitions.apply((message.id, 0, MessageState.NEW, MessageState.CANCEL, START, {"payload": "x"}))
    # nothing of the refused writes reached the store
    assert store.get(message.id) == message
    assert store.count_by_state() == {MessageState.NEW: 1}
    assert [t["to_state"] for t in store.transitions.of(message.id)] == [MessageState.NEW]


def test_cursor_listeners_hear_every_hot_statement(store: MessageStore) -> None:
    heard: list[tuple[str, bool]] = []

    def before(_conn: Any, _cursor: Any, statement: str, _parameters: Any, _context: Any, many: bool) -> None:
        heard.append((" ".join(statement.split()[:3]).upper(), many))

    sa.event.listen(store.engine, "before_cursor_execute", before)
    try:
        message = store.insert_message(_new("heard")).message
        [claimed] = states.claim(store, [message], "node-1", START)
        states.transition(store, claimed, MessageState.OK, START, {})
    finally:
        sa.event.remove(store.engine, "before_cursor_execute", before)
    statements = [text for text, _many in heard if not text.startswith(("BEGIN", "SELECT"))]
    assert statements == [
        "INSERT INTO MESSAGE", "INSERT INTO MESSAGE_TRANSITION",
        "UPDATE MESSAGE SET", "INSERT INTO MESSAGE_TRANSITION",
        "UPDATE MESSAGE SET", "INSERT INTO MESSAGE_TRANSITION",
    ]
    with store.engine.connect() as connection:
        rows = connection.execute(sa.select(sa.func.count()).select_from(message_transition_table)).scalar_one()
    assert rows == 3


@pytest.mark.parametrize(("count", "sizes"), [(1, [1]), (19, [16, 2, 1]), (256, [256]), (600, [256, 256, 64, 16, 8])])
def test_multi_row_statements_come_in_sizes_whose_texts_repeat(count: int, sizes: list[int]) -> None:
    assert statement_sizes(count) == sizes


def test_a_batch_insert_with_missing_values_stores_nulls_and_ids_in_order(store: MessageStore) -> None:
    """Rows lacking different values go in different statements (NULL written in the text); ids come back in the
    batch's order and are given in it (a split's children run in id order), a duplicate as a duplicate."""
    batch = [_new(f"n-{i}", process_id="p" if i % 3 == 0 else None, object_id="o" if i % 2 else None)
             for i in range(19)]
    first = store.insert_message(_new("n-7"))
    outcomes = store.insert_messages(batch)
    assert [o.duplicate for o in outcomes] == [i == 7 for i in range(19)]
    assert outcomes[7].message.id == first.message.id
    for new, outcome in zip(batch, outcomes, strict=True):
        if new.correlation_id != "n-7":
            stored = store.get(outcome.message.id)
            assert stored is not None and stored.correlation_id == new.correlation_id
            assert (stored.process_id, stored.object_id) == (new.process_id, new.object_id)
            assert stored == outcome.message
    ids = [o.message.id for i, o in enumerate(outcomes) if i != 7]
    assert ids == sorted(ids)


def test_ids_come_back_for_their_rows_with_duplicates_within_and_across_statements(store: MessageStore) -> None:
    """SQLite's INSERT returns its ids only: taken in ascending order when it stored every row, else matched by the
    rows' keys read back (a duplicate of a stored message, a repeat within one statement and across the statements
    of one batch: 19 rows go as 16 + 2 + 1)."""
    first = store.insert_message(_new("k-3")).message
    keys = [f"k-{i}" for i in range(17)] + ["k-5", "k-16"]  # k-5 repeats within the 16-row statement's rows
    outcomes = store.insert_messages([_new(key) for key in keys])
    assert [o.duplicate for o in outcomes] == [key == "k-3" for key in keys[:17]] + [True, True]
    by_key = {o.message.correlation_id: o.message.id for o in outcomes if not o.duplicate}
    assert outcomes[3].message.id == first.id and outcomes[17].message.id == by_key["k-5"]
    assert outcomes[18].message.id == by_key["k-16"]
    for key, message_id in by_key.items():
        stored = store.get(message_id)
        assert stored is not None and stored.correlation_id == key


def test_ids_not_given_one_after_the_other_are_matched_by_their_rows(store: MessageStore) -> None:
    """Once the largest id is taken, SQLite picks new ids at random: the ids of a batch are then matched by its rows'
    keys, not by their order."""
    with store.begin() as connection:
        connection.execute(message_table.insert().values(
            id=2**63 - 1, correlation_id="last", source_system="crm", service="s", operation="o", payload="<p/>",
            content_type="text/xml", headers={}, state=MessageState.NEW, failed_count=0, receive_ts=START,
            last_update_ts=START, custom_data={}, business_errors=[], version=0))
    outcomes = store.insert_messages([_new(f"r-{i}") for i in range(8)])
    assert not any(o.duplicate for o in outcomes)
    for i, outcome in enumerate(outcomes):
        stored = store.get(outcome.message.id)
        assert stored is not None and stored.correlation_id == f"r-{i}" == outcome.message.correlation_id


def test_a_none_in_a_not_null_column_is_refused_by_the_database(store: MessageStore) -> None:
    """Only the nullable columns are written as NULL in the text; a None in another one is bound as it is, and the
    database refuses the row as it refuses a NULL (its NOT NULL constraint), nothing of the batch stored."""
    bad = NewMessage(service="s", operation="o", payload=None, content_type="text/xml",  # type: ignore[arg-type]
                     correlation_id="bad", source_system="crm", receive_ts=START)
    with pytest.raises(Exception, match="payload") as refused:  # the driver's IntegrityError (sqlite3 or psycopg)
        store.insert_messages([_new("good"), bad])
    assert "null" in str(refused.value).lower()
    assert store.count_by_state() == {}


def test_changes_given_column_by_column_are_recorded_as_their_transition_rows(store: MessageStore) -> None:
    """HotPath.record_changes (the insert's rows) and a group of state-only outcomes (apply_many's column path) write
    the rows Transitions.record writes for the same changes, from None in some rows only as well."""
    from openroute.persistence.transitions import transition_row

    ids = [store.insert_message(_new(f"c-{i}")).message.id for i in range(6)]
    later = START + timedelta(seconds=1)
    froms = [None, MessageState.NEW, None]
    with store.begin() as connection:
        store.transitions.record_changes(connection, ids[:3], froms, [MessageState.NEW] * 3, [START, later, START],
                                         ["a", "b", "c"], "node-1")
        store.transitions.record(connection, [
            transition_row(message_id, before, MessageState.NEW, at, "node-1", None, cause)
            for message_id, before, at, cause in zip(ids[3:], froms, [START, later, START], ["a", "b", "c"],
                                                     strict=True)])
    written = [store.transitions.of(message_id)[1:] for message_id in ids]
    assert written[:3] == written[3:] and written[1][0]["from_state"] is MessageState.NEW

    batch = [(message_id, 0, MessageState.NEW, MessageState.CANCEL, later, {}) for message_id in ids]
    assert store.transitions.apply_many(batch[:3], node_id="node-2", cause=["x", "y", "z"]) == [True] * 3
    for item, why in zip(batch[3:], ["x", "y", "z"], strict=True):
        assert store.transitions.apply(item, node_id="node-2", cause=why)
    rows = [store.transitions.of(message_id)[-1] for message_id in ids]
    assert rows[:3] == rows[3:] and rows[0]["to_state"] is MessageState.CANCEL and rows[0]["node_id"] == "node-2"
    assert [store.get(message_id).version for message_id in ids] == [1] * 6  # type: ignore[union-attr]
