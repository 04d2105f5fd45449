"""The stored circuit breakers (``persistence/breaker.py``, ``BreakerStore``): one ``circuit_breaker`` row per
external system, made CLOSED on first use and replaced only from the version it was read at, on each real
database."""

from __future__ import annotations

import dataclasses
from datetime import timedelta

import pytest
import sqlalchemy as sa
from openroute.persistence import MessageState, MessageStore, message_table
from openroute.persistence.breaker import BreakerRow, BreakerState, BreakerStore, HeldBack
from openroute.persistence.models import circuit_breaker_table

from tests.persistence.conftest import START, new_message, rows


def test_a_breaker_is_stored_closed_on_first_use_and_read_back_as_stored(store: MessageStore) -> None:
    breakers = BreakerStore(store)
    assert breakers.get("bank") is None
    loaded = breakers.load("bank", START)
    assert loaded == BreakerRow("bank", BreakerState.CLOSED, START)
    assert rows(store, circuit_breaker_table) == [{
        "system": "bank", "state": "CLOSED", "changed_at": START, "open_until": None, "trials": [],
        "trial_successes": 0, "forced": False, "reason": None, "version": 0}]
    assert breakers.load("bank", START + timedelta(hours=1)) == loaded  # found, not made again
    assert len(rows(store, circuit_breaker_table)) == 1


def test_a_replacement_is_written_only_from_the_version_it_was_read_at(store: MessageStore) -> None:
    breakers = BreakerStore(store)
    closed = breakers.load("bank", START)
    trial = START + timedelta(seconds=30)
    half_open = dataclasses.replace(closed, state=BreakerState.HALF_OPEN, changed_at=trial,
                                    open_until=trial, trials=(trial,), reason="5 failures", version=1)
    assert breakers.replace(closed, half_open)
    assert breakers.get("bank") == half_open
    [row] = rows(store, circuit_breaker_table)
    assert (row["state"], row["trials"], row["reason"], row["version"]) == (
        "HALF_OPEN", [trial.isoformat()], "5 failures", 1)

    other_node = dataclasses.replace(closed, state=BreakerState.OPEN, version=1)
    assert not breakers.replace(closed, other_node)  # the row moved on: nothing written
    assert breakers.get("bank") == half_open
    with pytest.raises(ValueError, match="version 2"):
        breakers.replace(half_open, dataclasses.replace(half_open, version=3))


def test_the_systems_holding_messages_back_are_the_open_breakers_and_the_parked_messages(store: MessageStore) -> None:
    breakers = BreakerStore(store)
    for system in ("bank", "crm", "erp"):
        breakers.load(system, START)
    bank = breakers.get("bank")
    assert bank is not None
    opened = dataclasses.replace(bank, state=BreakerState.OPEN, changed_at=START, open_until=START + timedelta(
        minutes=1), version=1)
    assert breakers.replace(bank, opened)
    parked = store.insert_message(new_message("p-1")).message.id
    with store.begin() as connection:  # parked on a system whose breaker was never stored
        connection.execute(sa.update(message_table).where(message_table.c.id == parked)
                           .values(state=MessageState.POSTPONED, parked_on="ledger", next_attempt_at=None))

    assert breakers.holding_back() == [
        HeldBack("bank", BreakerState.OPEN, START, START + timedelta(minutes=1), 0),
        HeldBack("ledger", BreakerState.CLOSED, None, None, 1)]
    assert [row.system for row in breakers.all()] == ["bank", "crm", "erp"]
