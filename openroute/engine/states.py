"""The message state machine: the table of legal transitions and the one way to change a state.

The table is a :mod:`transitions` machine; :func:`transition` checks legality against it first
(:class:`IllegalTransitionError`, nothing written) and then lets the store write the change with a
version check (:class:`StaleMessageError` when another writer won, nothing overwritten).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, cast

import sqlalchemy as sa
from transitions import Machine

from openroute.definitions.errors import IllegalTransitionError, StaleMessageError
from openroute.persistence import FINAL_STATES, MessageState, MessageStore, StoredMessage
from openroute.persistence.transitions import TRANSITION_COLUMNS, TransitionItem

S = MessageState

#: trigger, sources, destination. Final states (OK, FAILED, SKIPPED, CANCEL) have no way out except an
#: operator's ``restart`` of a FAILED or CANCEL message, or a reprocessing job's ``skip_obsolete`` of a
#: FAILED one.
TRANSITION_TABLE: tuple[tuple[str, tuple[MessageState, ...], MessageState], ...] = (
    ("claim", (S.NEW, S.PARTLY_FAILED, S.POSTPONED), S.PROCESSING),
    ("succeed", (S.PROCESSING, S.WAITING_FOR_CHILDREN), S.OK),
    ("fail_technical", (S.PROCESSING,), S.PARTLY_FAILED),
    ("repair", (S.PROCESSING,), S.PARTLY_FAILED),  # lease expired: the node died while processing
    ("fail", (S.PROCESSING, S.WAITING_FOR_CHILDREN), S.FAILED),
    ("postpone", (S.PROCESSING,), S.POSTPONED),
    # its funnel is held: it waits in the funnel's queue without running (engine/funnel.py)
    ("queue_for_funnel", (S.NEW, S.PARTLY_FAILED, S.POSTPONED), S.POSTPONED),
    ("skip", (S.PROCESSING,), S.SKIPPED),
    ("wait_for_children", (S.PROCESSING,), S.WAITING_FOR_CHILDREN),
    ("cancel", (S.NEW, S.PARTLY_FAILED, S.POSTPONED, S.WAITING_FOR_CHILDREN), S.CANCEL),
    ("restart", (S.FAILED, S.CANCEL), S.PARTLY_FAILED),
    # bulk reprocessing: a FAILED message made obsolete by a newer OK one of its entity is not restarted
    ("skip_obsolete", (S.FAILED,), S.SKIPPED),
)

machine = Machine(
    states=[state.value for state in MessageState],
    transitions=[
        {"trigger": trigger, "source": [s.value for s in sources], "dest": dest.value}
        for trigger, sources, dest in TRANSITION_TABLE
    ],
    initial=MessageState.NEW.value,
    auto_transitions=False,
    send_event=False,
)


def _legal_pairs() -> dict[tuple[MessageState, MessageState], tuple[str, ...]]:
    pairs: dict[tuple[MessageState, MessageState], list[str]] = {}
    for name, event in machine.events.items():
        for source, transitions in event.transitions.items():
            for item in transitions:
                pairs.setdefault((MessageState(source), MessageState(cast(str, item.dest))), []).append(name)
    return {pair: tuple(names) for pair, names in pairs.items()}


#: (from, to) -> the triggers that make it; read from the machine, not written twice.
LEGAL_TRANSITIONS: Mapping[tuple[MessageState, MessageState], tuple[str, ...]] = _legal_pairs()

#: States a worker may claim a message from.
CLAIMABLE_STATES: frozenset[MessageState] = frozenset(
    MessageState(s) for s in machine.events["claim"].transitions
)


def is_legal(from_state: MessageState, to_state: MessageState) -> bool:
    """Whether the state machine allows ``from_state -> to_state``."""
    # a StrEnum member hashes and compares like its value, so the lookup needs no conversion; converting the
    # pair when it is not found keeps the ValueError for a name that is no state (the writer's hot path)
    if (from_state, to_state) in LEGAL_TRANSITIONS:
        return True
    return (MessageState(from_state), MessageState(to_state)) in LEGAL_TRANSITIONS


#: trigger -> (the states it fires from, its destination), from the table above
TRIGGERS: Mapping[str, tuple[frozenset[MessageState], MessageState]] = {
    trigger: (frozenset(sources), dest) for trigger, sources, dest in TRANSITION_TABLE
}


def check_trigger(trigger: str, from_state: MessageState) -> None:
    """Raise :class:`IllegalTransitionError` unless ``trigger`` fires from ``from_state``.

    Stricter than :func:`check_transition` where several triggers reach one state: an operator's ``restart`` leads
    to PARTLY_FAILED from FAILED or CANCEL only, while the engine's own failures reach it from PROCESSING.
    """
    sources, dest = TRIGGERS[trigger]
    if from_state not in sources:
        raise IllegalTransitionError(from_state, dest)


def check_transition(from_state: MessageState, to_state: MessageState) -> None:
    """Raise :class:`IllegalTransitionError` unless ``from_state -> to_state`` is legal."""
    if not is_legal(from_state, to_state):
        raise IllegalTransitionError(from_state, to_state)


def is_final(state: MessageState) -> bool:
    """Whether ``state`` is final (OK, FAILED, SKIPPED, CANCEL)."""
    return state in FINAL_STATES or MessageState(state) in FINAL_STATES


def _changed(message: StoredMessage, changes: Mapping[str, Any]) -> dict[str, Any]:
    """The ``changes`` that differ from the snapshot: an UPDATE writes only those (no JSON rewritten for nothing).

    The snapshot's version pins the row, so a value equal to the snapshot's is the value the row holds. The error
    (code, text, traceback) is always passed on: the change's ``message_transition`` row records it even when it
    repeats.
    """
    if not changes:  # an attempt's plain OK (outcome.succeeded)
        return {}
    # most outcomes change nothing but the state: their changes are items of the snapshot's fields (one C call)
    if changes.items() <= message.__dict__.items() and _ERROR_COLUMNS.isdisjoint(changes):
        return {}
    return {name: value for name, value in changes.items()
            if name in _ERROR_COLUMNS or getattr(message, name, _MISSING) != value}


_ERROR_COLUMNS = frozenset({"last_error_code", "last_error_text", "last_error_trace"})


_MISSING = object()


def transition(
    store: MessageStore,
    message: StoredMessage,
    to_state: MessageState,
    now: datetime,
    changes: Mapping[str, Any] | None = None,
    connection: sa.Connection | None = None,
    *,
    node_id: str | None = None,
    cause: str = "engine",
) -> StoredMessage:
    """Move ``message`` (a snapshot at its version) to ``to_state`` and return the new snapshot.

    ``changes`` may set the bookkeeping columns that go with the change (failed count, next attempt,
    custom data, business errors, last error code/text). Raises :class:`IllegalTransitionError` before
    touching the database, :class:`StaleMessageError` when the row is no longer at ``message.version``.
    The change is recorded in ``message_transition`` in the same transaction: made by ``node_id`` (default:
    the message's node) for ``cause`` (``engine``, ``admin:<user>``, ``reprocess:<job id>``, ``repair``).
    """
    check_transition(message.state, to_state)
    changes = dict(changes or {})
    bad = set(changes) - TRANSITION_COLUMNS
    if bad:
        raise ValueError(f"a transition cannot write {sorted(bad)}")
    node = node_id if node_id is not None else changes.get("node_id", message.node_id)
    written = _changed(message, changes)
    item = (message.id, message.version, message.state, to_state, now, written)
    if not store.transitions.apply(item, connection, node_id=node, cause=cause):
        raise StaleMessageError(message.id, message.version)
    return message.evolve(state=MessageState(to_state), version=message.version + 1, last_update_ts=now, **changes)


#: (message, to_state, now, changes) or (message, to_state, now, changes, cause); cause defaults to "engine".
TransitionRequest = (
    tuple[StoredMessage, MessageState, datetime, Mapping[str, Any]]
    | tuple[StoredMessage, MessageState, datetime, Mapping[str, Any], str]
)


def transition_many(
    store: MessageStore,
    requests: list[TransitionRequest],
    connection: sa.Connection | None = None,
    *,
    node_id: str | None = None,
) -> list[StoredMessage | IllegalTransitionError | StaleMessageError]:
    """:func:`transition` for many (message, to_state, now, changes[, cause]) requests, one result per request.

    An illegal or lost transition is returned as its error (nothing written for it); the others are
    written in the same transaction, grouped into as few statements as the store can manage, with their
    ``message_transition`` rows (made by ``node_id``). May raise :class:`persistence.GroupConflict` (roll
    back and retry the requests one at a time).
    """
    results: list[Any] = [None] * len(requests)
    legal: list[int] = []
    items: list[TransitionItem] = []
    causes: list[str] = []
    # one pass (the writer's hot path: every outcome comes here); a ValueError still leaves everything unwritten
    for index, request in enumerate(requests):
        message, target, now, changes = request[0], request[1], request[2], request[3]
        if (message.state, target) not in LEGAL_TRANSITIONS and not is_legal(message.state, target):
            results[index] = IllegalTransitionError(message.state, target)
            continue
        if changes and not TRANSITION_COLUMNS.issuperset(changes):  # empty: an attempt's plain OK (most outcomes)
            raise ValueError(f"a transition cannot write {sorted(set(changes) - TRANSITION_COLUMNS)}")
        legal.append(index)
        if target.__class__ is not MessageState:  # a name (the writer's hot path passes members)
            target = _as_state(target)
        items.append((message.id, message.version, message.state, target, now,
                      _changed(message, changes) if changes else {}))
        causes.append(request[4] if len(request) > 4 else "engine")
    flags = store.transitions.apply_many(items, connection, node_id=node_id, cause=causes)
    if len(items) == len(requests) and all(flags):  # every one written (nearly every group): no index to follow
        return [request[0].transitioned(item[3], item[4], request[3])
                for request, item in zip(requests, items, strict=True)]
    for index, item, written in zip(legal, items, flags, strict=True):
        request = requests[index]
        message = request[0]
        results[index] = (message.transitioned(item[3], item[4], request[3]) if written
                          else StaleMessageError(message.id, message.version))
    return results


#: (message id, version read, its state at that version, to_state, now, changes, cause)
StagedRequest = tuple[int, int, MessageState, MessageState, datetime, Mapping[str, Any], str]


def transition_set(
    store: MessageStore,
    requests: Sequence[StagedRequest],
    connection: sa.Connection | None = None,
    *,
    node_id: str | None = None,
) -> list[bool | IllegalTransitionError]:
    """:func:`transition_many` set-based, for bulk jobs that know each message by (id, version, state) only.

    One result per request: True (written, with its ``message_transition`` row), False (the row is no longer at
    its version: nothing written, nothing overwritten) or the :class:`IllegalTransitionError` (nothing written).
    The legal ones are written by :meth:`Transitions.apply_many` with ``staged``: one staging table, one UPDATE and
    one INSERT for the whole list. A message may appear once (ValueError otherwise).
    """
    results: list[bool | IllegalTransitionError] = [False] * len(requests)
    legal: list[int] = []
    for index, (_id, _version, before, after, *_rest) in enumerate(requests):
        if is_legal(before, after):
            legal.append(index)
        else:
            results[index] = IllegalTransitionError(before, after)
    flags = store.transitions.apply_many(
        [(r[0], r[1], _as_state(r[2]), _as_state(r[3]), r[4], r[5]) for r in (requests[i] for i in legal)],
        connection, node_id=node_id, cause=[requests[i][6] for i in legal], staged=True,
    )
    for index, written in zip(legal, flags, strict=True):
        results[index] = written
    return results


def _as_state(state: MessageState | str) -> MessageState:
    # calling the enum costs a microsecond even for a member: the writer's hot path passes members
    return state if state.__class__ is MessageState else MessageState(state)


def claim(
    store: MessageStore,
    candidates: list[StoredMessage],
    node_id: str,
    now: datetime,
    connection: sa.Connection | None = None,
) -> list[StoredMessage]:
    """Claim ``candidates`` for ``node_id`` (-> PROCESSING); returns the snapshots this node won.

    A candidate not in a claimable state raises :class:`IllegalTransitionError` (a programming error:
    the caller emitted something that cannot be processed); one changed by another writer is simply
    not returned.
    """
    for message in candidates:
        check_transition(message.state, MessageState.PROCESSING)
    unique = list({(m.id, m.version): m for m in candidates}.values())
    won = store.transitions.claim(
        [(m.id, m.version) for m in unique], CLAIMABLE_STATES, MessageState.PROCESSING, node_id, now, connection,
        previous={m.id: m.state for m in unique},
    )
    return [
        m.evolve(state=MessageState.PROCESSING, version=m.version + 1, node_id=node_id, start_process_ts=now,
                 last_update_ts=now)
        for m in unique
        if m.id in won
    ]
