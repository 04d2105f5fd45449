"""The confirmation kind's own SQL (persistence/confirmations.py): the PENDING rows written in a final transaction,
one statement for many, a row already there left alone and started over when its message ends again. What the kind
shares with the outcome events (claim, renew, settle, release) is tests/persistence/test_delivery.py."""

from __future__ import annotations

import sqlalchemy as sa
from openroute.persistence import MessageStore, confirmation_table
from openroute.persistence import confirmations as table

from tests.persistence.conftest import START, new_message, rows


def _stored(store: MessageStore, count: int) -> list[int]:
    with store.begin() as connection:
        return [outcome.message.id for outcome in store.insert_messages([new_message(f"c-{n}") for n in range(count)],
                                                                         connection)]


def _counting_inserts(store: MessageStore, inserts: list[str]) -> None:
    def count(_conn: object, _cursor: object, statement: str, *_args: object) -> None:
        if statement.lstrip().upper().startswith("INSERT INTO CONFIRMATION"):
            inserts.append(statement)

    sa.event.listen(store.engine, "before_cursor_execute", count)


def test_many_pending_rows_go_in_one_statement_and_a_row_already_there_stays(store: MessageStore) -> None:
    first, second, third = _stored(store, 3)
    with store.begin() as connection:
        assert table.inserted_pending(connection, [table.pending_row(first, "crm", "OK", START)]) == {first}
    before = rows(store, confirmation_table)
    inserts: list[str] = []
    _counting_inserts(store, inserts)
    with store.begin() as connection:
        again = [table.pending_row(message_id, "crm", "FAILED", START) for message_id in (first, second, third)]
        assert table.inserted_pending(connection, again) == {second, third}
    assert len(inserts) == 1
    after = {row["message_id"]: row for row in rows(store, confirmation_table)}
    assert after[first] == before[0]  # the row of an earlier outcome is not touched by the insert
    assert {after[second]["status"], after[third]["status"]} == {"PENDING"}
    assert after[second]["confirmation_id"] != after[third]["confirmation_id"]
    with store.begin() as connection:
        assert table.inserted_pending(connection, []) == set()


def test_a_row_starts_over_when_its_message_ends_again(store: MessageStore) -> None:
    [message_id] = _stored(store, 1)
    with store.begin() as connection:
        table.add_pending(connection, [table.pending_row(message_id, "crm", "FAILED", START)])
    [before] = rows(store, confirmation_table)
    with store.begin() as connection:
        table.reset_pending(connection, message_id, "OK", START)
    [after] = rows(store, confirmation_table)
    assert after["status"] == "PENDING" and after["outcome_state"] == "OK" and after["attempts"] == 0
    assert after["confirmation_id"] not in (None, before["confirmation_id"])
