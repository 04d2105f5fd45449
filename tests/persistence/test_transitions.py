"""The state changes of stored messages (``persistence/transitions.py``, ``store.transitions``): every write bumps
the version that the next one is keyed on, and an UPDATE writes only the columns that changed, on each real
database."""

from __future__ import annotations

import sqlalchemy as sa
from openroute.persistence import MessageState, MessageStore

from openroute.engine import states
from tests.persistence.conftest import START, new_message


def test_every_write_of_a_message_bumps_its_version_so_a_version_pins_the_state(store: MessageStore) -> None:
    """The claim and the outcome UPDATE match (id, version) only: this is what makes that as safe as a state check."""
    message = store.insert_message(new_message("pin")).message
    seen = [(message.version, message.state)]
    single = states.claim(store, [message], "node-1", START)[0]
    seen.append((single.version, single.state))
    retry = states.transition(store, single, MessageState.PARTLY_FAILED, START, {"failed_count": 1})
    seen.append((retry.version, retry.state))
    other = store.insert_message(new_message("pin-2")).message
    grouped = {m.id: m for m in states.claim(store, [retry, other], "node-1", START)}
    seen.append((grouped[message.id].version, grouped[message.id].state))
    [done] = states.transition_many(store, [(grouped[message.id], MessageState.OK, START, {})])
    assert not isinstance(done, Exception)
    seen.append((done.version, done.state))
    assert [v for v, _s in seen] == [0, 1, 2, 3, 4]
    assert store.get(message.id) == done
    # every older snapshot is refused, whatever transition it asks for
    for stale in (message, retry):
        assert states.claim(store, [stale], "node-2", START) == []
    assert not store.transitions.apply((single.id, single.version, single.state, MessageState.OK, START, {}))
    assert store.get(message.id) == done


def test_a_transition_writes_only_the_columns_that_changed(store: MessageStore) -> None:
    statements: list[str] = []

    def listener(_conn: object, _cursor: object, statement: str, *_rest: object) -> None:
        if statement.startswith("UPDATE message"):
            statements.append(statement.split(" WHERE ")[0])

    first, second, third = (store.insert_message(new_message(key)).message for key in ("w-1", "w-2", "w-3"))
    claimed = states.claim(store, [first, second, third], "node-1", START)
    sa.event.listen(store.engine, "before_cursor_execute", listener)
    try:
        unchanged = {"custom_data": {}, "business_errors": [], "next_attempt_at": None, "failed_count": 0}
        [done] = states.transition_many(store, [(claimed[0], MessageState.OK, START, unchanged)])
        retry = states.transition(store, claimed[1], MessageState.PARTLY_FAILED, START,
                                  {**unchanged, "custom_data": {"step": 2}, "failed_count": 1})
        # an error column is written even when it repeats the snapshot's value (its transition row records it); a
        # column an insert left at its default (parked_on) is as unchanged as any other
        states.transition(store, claimed[2], MessageState.OK, START, {"parked_on": None, "last_error_code": None})
    finally:
        sa.event.remove(store.engine, "before_cursor_execute", listener)
    assert len(statements) == 3
    assert "last_error_code" in statements[2] and "parked_on" not in statements[2]
    assert "custom_data" not in statements[0] and "business_errors" not in statements[0]
    assert "next_attempt_at" not in statements[0] and "failed_count" not in statements[0]
    assert "custom_data" in statements[1] and "failed_count" in statements[1] and "business_errors" not in statements[1]
    assert store.get(done.id) == done and store.get(retry.id) == retry
    assert retry.custom_data == {"step": 2} and retry.failed_count == 1 and done.custom_data == {}
