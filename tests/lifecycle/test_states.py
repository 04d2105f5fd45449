"""The state machine: every legal and illegal transition, in memory and written through each real database."""

from __future__ import annotations

import itertools
from collections import deque
from datetime import timedelta

import pytest
from openroute.persistence import MessageState, MessageStore, NewMessage, StoredMessage

from openroute.definitions.errors import IllegalTransitionError, StaleMessageError
from openroute.engine import states
from tests.lifecycle.conftest import START

S = MessageState

# The specification of the lifecycle, written out independently of openroute.engine.states.
EXPECTED_LEGAL = {
    (S.NEW, S.PROCESSING),
    (S.PARTLY_FAILED, S.PROCESSING),
    (S.POSTPONED, S.PROCESSING),
    (S.PROCESSING, S.OK),
    (S.PROCESSING, S.PARTLY_FAILED),
    (S.PROCESSING, S.FAILED),
    (S.PROCESSING, S.POSTPONED),
    # its funnel is held: it waits in the funnel's queue without being claimed (a released parked message too)
    (S.NEW, S.POSTPONED),
    (S.PARTLY_FAILED, S.POSTPONED),
    (S.POSTPONED, S.POSTPONED),
    (S.PROCESSING, S.SKIPPED),
    (S.PROCESSING, S.WAITING_FOR_CHILDREN),
    (S.WAITING_FOR_CHILDREN, S.OK),
    (S.WAITING_FOR_CHILDREN, S.FAILED),
    (S.NEW, S.CANCEL),
    (S.PARTLY_FAILED, S.CANCEL),
    (S.POSTPONED, S.CANCEL),
    (S.WAITING_FOR_CHILDREN, S.CANCEL),
    (S.FAILED, S.PARTLY_FAILED),
    (S.CANCEL, S.PARTLY_FAILED),
    (S.FAILED, S.SKIPPED),  # a reprocessing job finds a FAILED message obsolete
}
ALL_PAIRS = list(itertools.product(MessageState, repeat=2))


@pytest.mark.parametrize(("source", "target"), ALL_PAIRS, ids=lambda s: s.value)
def test_transition_table_matches_the_lifecycle(source: MessageState, target: MessageState) -> None:
    assert states.is_legal(source, target) == ((source, target) in EXPECTED_LEGAL)
    if (source, target) in EXPECTED_LEGAL:
        states.check_transition(source, target)
    else:
        with pytest.raises(IllegalTransitionError) as raised:
            states.check_transition(source, target)
        assert raised.value.from_state == source and raised.value.to_state == target


def test_final_states_have_no_way_out_but_restart() -> None:
    finals = {s for s in MessageState if states.is_final(s)}
    assert finals == {S.OK, S.FAILED, S.SKIPPED, S.CANCEL}
    exits = {(a, b) for a, b in EXPECTED_LEGAL if a in finals}
    assert exits == {(S.FAILED, S.PARTLY_FAILED), (S.CANCEL, S.PARTLY_FAILED), (S.FAILED, S.SKIPPED)}
    assert {S.NEW, S.PARTLY_FAILED, S.POSTPONED} == states.CLAIMABLE_STATES


def _path_to(target: MessageState) -> list[MessageState]:
    """Shortest legal path NEW -> target (every state is reachable)."""
    previous: dict[MessageState, MessageState | None] = {S.NEW: None}
    todo = deque([S.NEW])
    while todo:
        here = todo.popleft()
        for source, nxt in sorted(EXPECTED_LEGAL):
            if source == here and nxt not in previous:
                previous[nxt] = here
                todo.append(nxt)
    assert target in previous, f"{target} unreachable"
    path: list[MessageState] = []
    node: MessageState | None = target
    while node is not None and node != S.NEW:
        path.append(node)
        node = previous[node]
    return list(reversed(path))


def _new(store: MessageStore, key: str) -> StoredMessage:
    outcome = store.insert_message(
        NewMessage(service="s", operation="o", payload="p", content_type="text/plain", correlation_id=key,
                   source_system="test", receive_ts=START)
    )
    return outcome.message


def test_every_transition_through_the_database(store: MessageStore) -> None:
    now = START + timedelta(seconds=1)
    for source, target in ALL_PAIRS:
        message = _new(store, f"{source.value}->{target.value}")
        for step in _path_to(source):
            message = states.transition(store, message, step, now)
        assert store.get(message.id) == message, "the snapshot follows the row without re-reading it"
        before = store.get(message.id)
        if (source, target) in EXPECTED_LEGAL:
            after = states.transition(store, message, target, now, {"last_error_code": "X"})
            row = store.get(message.id)
            assert row is not None and row.state == target and row.version == message.version + 1
            assert row == after and row.last_error_code == "X"
        else:
            with pytest.raises(IllegalTransitionError):
                states.transition(store, message, target, now, {"last_error_code": "X"})
            assert store.get(message.id) == before, f"{source}->{target} wrote something"


def test_stale_writer_loses_and_overwrites_nothing(store: MessageStore) -> None:
    now = START
    message = _new(store, "race")
    processing = states.transition(store, message, S.PROCESSING, now)
    winner = states.transition(store, processing, S.OK, now, {"custom_data": {"by": "winner"}})
    with pytest.raises(StaleMessageError) as raised:
        states.transition(store, processing, S.PARTLY_FAILED, now, {"custom_data": {"by": "loser"}, "failed_count": 1})
    assert raised.value.message_id == message.id and raised.value.version == processing.version
    assert store.get(message.id) == winner
    # a stale snapshot with an allowed transition from its own (old) state is refused as well
    with pytest.raises(StaleMessageError):
        states.transition(store, message, S.CANCEL, now)
    assert store.get(message.id) == winner


def test_claim_is_won_once(store: MessageStore) -> None:
    messages = [_new(store, f"claim-{i}") for i in range(5)]
    first = states.claim(store, messages[:3], "node-a", START)
    second = states.claim(store, messages, "node-b", START)
    assert {m.id for m in first} == {m.id for m in messages[:3]}
    assert {m.id for m in second} == {m.id for m in messages[3:]}
    for won, node in ((first, "node-a"), (second, "node-b")):
        for message in won:
            row = store.get(message.id)
            assert row == message and row.node_id == node and row.start_process_ts == START
    with pytest.raises(IllegalTransitionError):
        states.claim(store, first, "node-c", START)  # PROCESSING is not claimable


def test_transition_cannot_write_the_state_or_identity_columns(store: MessageStore) -> None:
    message = _new(store, "columns")
    for column in ("state", "version", "id", "payload"):
        with pytest.raises(ValueError, match="cannot write"):
            store.transitions.apply((message.id, message.version, S.NEW, S.PROCESSING, START, {column: "x"}))
    assert store.get(message.id) == message
