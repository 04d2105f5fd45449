"""The node's message counts (``openroute/jobs/counts.py``, ``MessageCounts``) over the stored counts: exact on
every call, the backlog per route cached, a long tail of transitions folded. The stored counts themselves are
tests/persistence/test_counts.py."""

from __future__ import annotations

import random
from datetime import UTC, datetime

import pytest
import sqlalchemy as sa
from openroute.persistence import MessageState, MessageStore, NewMessage, message_table

from openroute.definitions.errors import ConfigurationError
from openroute.jobs import MessageCounts

S = MessageState
NOW = datetime(2026, 11, 27, 12, 0, tzinfo=UTC)


def _new(index: int, service: str = "s") -> NewMessage:
    return NewMessage(service=service, operation=f"o{index % 2}", payload="{}", content_type="application/json",
                      correlation_id=f"m-{index}-{random.random()}", source_system="crm", receive_ts=NOW)


def _move(store: MessageStore, message_id: int, to: MessageState) -> None:
    c = message_table.c
    row = store.run(lambda conn: conn.execute(sa.select(c.version, c.state).where(c.id == message_id)).first())
    assert row is not None
    assert store.transitions.apply((message_id, row.version, MessageState(row.state), to, NOW, {}))


def test_message_counts_are_exact_on_every_call_and_fold_a_long_tail(store: MessageStore) -> None:
    ticks = [0.0]
    counts = MessageCounts(store, route_ttl=5, max_tail=3, monotonic=lambda: ticks[0])
    first = store.insert_message(_new(1)).message.id
    assert counts.by_state().counts == {S.NEW: 1}
    assert counts.open_by_route() == [("s", "o1", S.NEW, 1)]
    _move(store, first, S.PROCESSING)
    _move(store, first, S.OK)
    assert counts.by_state().counts == {S.OK: 1}  # at once, no cache
    assert counts.open_by_route() == [("s", "o1", S.NEW, 1)]  # the backlog per route is cached for route_ttl
    ticks[0] = 6.0
    assert counts.open_by_route() == []
    for i in range(5):
        store.insert_message(_new(10 + i))
    assert counts.by_state().counts == {S.OK: 1, S.NEW: 5}  # 8 transitions after the mark: a fold starts
    assert counts.wait_for_fold(timeout=30)
    assert store.counts.by_state()[1] <= 8
    assert counts.by_state().counts == {S.OK: 1, S.NEW: 5}
    with pytest.raises(ConfigurationError, match="fold_interval=0"):
        MessageCounts(store, fold_interval=0)
