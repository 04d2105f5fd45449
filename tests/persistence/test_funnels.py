"""Funnels (``persistence/funnels.py``, ``store.funnels``): one ``funnel_lock`` row per funnel value naming the one
message allowed to be PROCESSING, taken over once its holder left PROCESSING, and the queue of the messages waiting
for a funnel, as rows on each real database."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import sqlalchemy as sa
from openroute.persistence import MessageState, MessageStore, funnel_lock_table, message_table

from tests.persistence.conftest import START, new_message, rows

LATER = START + timedelta(minutes=1)


def _message(store: MessageStore, key: str, *, received: int = 0, **values: Any) -> int:
    """A message of the funnel value ``order-7`` received ``received`` seconds after START, with ``values`` set."""
    message_id = store.insert_message(new_message(key, funnel_value="order-7",
                                                  receive_ts=START + timedelta(seconds=received))).message.id
    if values:
        with store.begin() as connection:
            connection.execute(sa.update(message_table).where(message_table.c.id == message_id).values(**values))
    return message_id


def _queued(store: MessageStore, key: str, received: int) -> int:
    """A message waiting in the funnel's queue (POSTPONED, error code FUNNEL, no due time)."""
    return _message(store, key, received=received, state=MessageState.POSTPONED, last_error_code="FUNNEL",
                    next_attempt_at=None)


def _locks(store: MessageStore) -> list[tuple[str, int, Any]]:
    return [(row["funnel_value"], row["message_id"], row["acquired_at"])
            for row in rows(store, funnel_lock_table, funnel_lock_table.c.funnel_value)]


def test_a_funnel_is_held_by_one_processing_message_and_taken_over_once_it_left(store: MessageStore) -> None:
    first = _message(store, "c-1", state=MessageState.PROCESSING)
    second = _message(store, "c-2", received=1)
    funnels = store.funnels

    assert funnels.acquire("order-7", first, START) is None
    assert _locks(store) == [("order-7", first, START)]
    assert funnels.acquire("order-7", first, LATER) is None  # its holder again: nothing changes
    assert funnels.acquire("order-7", second, LATER) == first  # held by a PROCESSING message
    assert funnels.holder("order-7") == first
    assert _locks(store) == [("order-7", first, START)]

    with store.begin() as connection:
        connection.execute(sa.update(message_table).where(message_table.c.id == first).values(state=MessageState.OK))
    assert funnels.holder("order-7") is None
    assert funnels.acquire_many([("order-7", second), ("order-9", first)], LATER) == {"order-7": None, "order-9": None}
    assert _locks(store) == [("order-7", second, LATER), ("order-9", first, LATER)]
    assert funnels.older_unfinished(store.get(second)) is None  # type: ignore[arg-type]  # the first is final


def test_a_released_funnel_is_handed_to_the_head_of_its_queue(store: MessageStore) -> None:
    holder = _message(store, "c-1", state=MessageState.PROCESSING)
    behind = _queued(store, "c-3", received=3)
    head = _queued(store, "c-2", received=2)
    funnels = store.funnels
    assert funnels.acquire("order-7", holder, START) is None
    assert funnels.free_of(["order-7"]) == []
    assert funnels.stalled(10, START) == []  # its holder runs: the queue moves on when it is released
    assert funnels.older_unfinished(store.get(head)) == holder  # type: ignore[arg-type]

    with store.begin() as connection:  # the release: the holder is final, the head takes the funnel
        connection.execute(sa.update(message_table).where(message_table.c.id == holder).values(state=MessageState.OK))
        assert funnels.free_of(["order-7"], connection) == ["order-7"]
        queued = funnels.queue_head("order-7", connection)
        assert queued is not None and queued.id == head
        funnels.hand_to("order-7", head, LATER, connection)
    assert _locks(store) == [("order-7", head, LATER)]
    assert funnels.queue_heads(["order-7", "order-9"]) == {"order-7": store.get(head)}
    # nobody runs the funnel's value now and two wait in its queue: stalled, the repoll hands it on
    assert funnels.stalled(10, LATER) == ["order-7"]
    funnels.hand_to_many([("order-7", behind)], LATER + timedelta(seconds=1))
    assert _locks(store) == [("order-7", behind, LATER + timedelta(seconds=1))]
