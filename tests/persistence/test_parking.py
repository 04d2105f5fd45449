"""Messages parked on an external system (``persistence/parking.py``, ``store.parking``): the release makes the
oldest parked ones due, leaves the rest parked, queues a funnel's later messages behind its oldest and releases the
failures from before the breaker closed, as rows of the ``message`` table on each real database."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import sqlalchemy as sa
from openroute.persistence import MessageState, MessageStore, message_table

from tests.persistence.conftest import START, new_message, rows

RELEASED = START + timedelta(minutes=5)


def _parked(store: MessageStore, key: str, system: str, *, received: int, **values: Any) -> int:
    """A message received ``received`` seconds after START, parked on ``system`` (POSTPONED, no due time)."""
    message_id = store.insert_message(new_message(key, receive_ts=START + timedelta(seconds=received))).message.id
    with store.begin() as connection:
        connection.execute(sa.update(message_table).where(message_table.c.id == message_id).values(
            **{"state": MessageState.POSTPONED, "parked_on": system, "next_attempt_at": None, **values}))
    return message_id


def _waiting(store: MessageStore) -> dict[int, tuple[str | None, Any, str | None, int]]:
    """(parked on, due at, error code, version) of every message, by id."""
    return {row["id"]: (row["parked_on"], row["next_attempt_at"], row["last_error_code"], row["version"])
            for row in rows(store, message_table, message_table.c.id)}


def test_a_trial_releases_the_oldest_parked_message_and_the_close_releases_the_rest(store: MessageStore) -> None:
    second = _parked(store, "c-2", "bank", received=2)
    first = _parked(store, "c-1", "bank", received=1)
    elsewhere = _parked(store, "c-3", "crm", received=0)
    assert store.parking.counts() == {"bank": 2, "crm": 1}

    assert store.parking.release("bank", RELEASED, limit=1) == 1
    waiting = _waiting(store)
    assert waiting[first] == (None, RELEASED, None, 1)  # a new version: a snapshot read before no longer claims it
    assert waiting[second] == ("bank", None, None, 0)
    assert store.parking.counts() == {"bank": 1, "crm": 1}

    assert store.parking.release("bank", RELEASED) == 1
    assert _waiting(store)[second] == (None, RELEASED, None, 1)
    assert _waiting(store)[elsewhere] == ("crm", None, None, 0)
    assert store.parking.counts() == {"crm": 1}


def test_a_funnel_s_later_messages_wait_in_its_queue_and_failures_before_the_close_are_due(
    store: MessageStore,
) -> None:
    oldest = _parked(store, "f-1", "bank", received=1, funnel_value="order-7")
    later = _parked(store, "f-2", "bank", received=2, funnel_value="order-7")
    closed_at = START + timedelta(minutes=1)
    failed_before = _parked(store, "x-1", "bank", received=3, state=MessageState.PARTLY_FAILED,
                            next_attempt_at=START + timedelta(hours=1), last_update_ts=START)
    failed_after = _parked(store, "x-2", "bank", received=4, state=MessageState.PARTLY_FAILED,
                           next_attempt_at=START + timedelta(hours=1), last_update_ts=closed_at)

    assert store.parking.release("bank", RELEASED, failed_before=closed_at) == 3
    waiting = _waiting(store)
    assert waiting[oldest] == (None, RELEASED, None, 1)
    assert waiting[later] == (None, None, "FUNNEL", 1)  # behind the oldest of its funnel, handed on by the funnel
    assert waiting[failed_before] == (None, RELEASED, None, 1)
    assert waiting[failed_after] == ("bank", START + timedelta(hours=1), None, 0)
    assert store.parking.counts() == {}
