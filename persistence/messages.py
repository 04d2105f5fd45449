"""What a message is to the store: the fields it arrives with, what is inserted, the snapshot of a stored row.

These are plain values (frozen dataclasses); the SQL that reads and writes them is :class:`MessageStore`'s
(:mod:`openroute.persistence.store`) and, for state changes, ``store.transitions``
(:mod:`openroute.persistence.transitions`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import MISSING, dataclass, field
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from openroute.persistence.models import MessageState

__all__ = [
    "InsertOutcome", "MessageFields", "NewMessage", "StoredMessage", "claimed_row", "insert_values", "row_to_message",
]

@dataclass(frozen=True)
class MessageFields:
    """What every message has from the moment it arrives: its route key, its payload and the sender's trace.

    ``openroute.InboundMessage`` (what an endpoint accepts) and :class:`NewMessage` (what the store inserts)
    are both these fields plus their own (the optional ones keep each class's positional order).
    """

    service: str
    operation: str
    payload: str
    content_type: str
    correlation_id: str
    source_system: str


@dataclass(frozen=True)
class NewMessage(MessageFields):
    """What :meth:`~openroute.persistence.MessageStore.insert_message` stores as a NEW message."""

    receive_ts: datetime
    process_id: str | None = None
    msg_ts: datetime | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    object_id: str | None = None
    entity_type: str | None = None
    funnel_value: str | None = None
    parent_id: int | None = None
    #: the W3C traceparent its later spans hang under (``openroute.runtime.tracing``; None while tracing is off)
    traceparent: str | None = None

    @classmethod
    def from_values(cls, values: Mapping[str, Any]) -> NewMessage:
        """The message of ``values`` (every field, already checked) without __init__'s cost: a frozen dataclass sets
        each of its 15 fields through ``object.__setattr__``, and every accepted message is built once."""
        message = object.__new__(cls)
        message.__dict__.update(values)
        return message


@dataclass(frozen=True)
class StoredMessage:
    """An immutable snapshot of one ``message`` row (as of ``version``)."""

    id: int
    correlation_id: str
    source_system: str
    process_id: str | None
    service: str
    operation: str
    object_id: str | None
    entity_type: str | None
    funnel_value: str | None
    payload: str
    content_type: str
    headers: dict[str, str]
    state: MessageState
    failed_count: int
    receive_ts: datetime
    msg_ts: datetime | None
    start_process_ts: datetime | None
    last_update_ts: datetime
    next_attempt_at: datetime | None
    node_id: str | None
    custom_data: dict[str, Any]
    business_errors: list[dict[str, Any]]
    last_error_code: str | None
    last_error_text: str | None
    parent_id: int | None
    version: int
    #: the traceback of the unexpected error of the current state (None for expected errors and no error)
    last_error_trace: str | None = None
    #: the W3C traceparent of the span that accepted it: the parent of its attempts and confirmation (None: untraced)
    traceparent: str | None = None
    #: the external system whose open breaker this POSTPONED message is parked on (None: not parked)
    parked_on: str | None = None

    @classmethod
    def from_values(cls, message_id: int, values: dict[str, Any]) -> StoredMessage:
        """The snapshot of a row just inserted with ``values`` (:func:`insert_values`': every field but the id),
        without __init__'s cost. The snapshot takes the dict as its own (the caller leaves it alone): a copy of its
        29 entries cost as much again as the rest."""
        values["id"] = message_id
        if len(values) != len(_STORED_FIELDS):
            # the defaults (of the columns an insert does not write) as __init__ would set them: the snapshot's
            # __dict__ holds every field, so a change can be compared with it whole (openroute.engine.states._changed)
            for name, default in _DEFAULTS.items():
                values.setdefault(name, default)
        snapshot = object.__new__(cls)
        object.__setattr__(snapshot, "__dict__", values)  # see transitioned
        return snapshot

    def evolve(self, **changes: Any) -> StoredMessage:
        """A copy with ``changes`` applied (used to follow a write without re-reading the row)."""
        if not _STORED_FIELDS.issuperset(changes):
            raise TypeError(f"StoredMessage has no field(s) {sorted(changes.keys() - _STORED_FIELDS)}")
        # a frozen dataclass: copying its __dict__ costs a fraction of __init__ with 28 fields (the writer's hot path)
        values = self.__dict__.copy()
        values.update(changes)
        copy = object.__new__(StoredMessage)
        object.__setattr__(copy, "__dict__", values)  # see transitioned
        return copy

    def transitioned(self, state: MessageState, at: datetime, changes: Mapping[str, Any]) -> StoredMessage:
        """The snapshot after a transition to ``state`` at ``at`` writing ``changes``: ``evolve(state=state,
        version=version + 1, last_update_ts=at, **changes)`` without building its keywords (every outcome of the
        writer's hot path makes one)."""
        values = self.__dict__.copy()
        # an attempt's plain OK changes nothing but the state (an empty mapping proxy, which the field check and
        # dict.update each take through the generic mapping protocol: ~4,000 instructions for nothing)
        if changes:
            if not _STORED_FIELDS.issuperset(changes):
                raise TypeError(f"StoredMessage has no field(s) {sorted(changes.keys() - _STORED_FIELDS)}")
            values.update(changes)
        values["state"] = state
        values["version"] = self.version + 1
        values["last_update_ts"] = at
        # the new snapshot takes the dict as its __dict__ (a frozen dataclass: set as its own __init__ sets a field):
        # a dict built whole is copied again at one memory copy of its table (dict.copy of a dict without deleted
        # entries), one filled entry by entry through a new instance's __dict__ is not
        copy = object.__new__(StoredMessage)
        object.__setattr__(copy, "__dict__", values)
        return copy


_STORED_FIELDS = frozenset(StoredMessage.__dataclass_fields__)
#: the fields of a snapshot that have a default, and their defaults
_DEFAULTS: dict[str, Any] = {
    name: spec.default for name, spec in StoredMessage.__dataclass_fields__.items() if spec.default is not MISSING
}


@dataclass(frozen=True)
class InsertOutcome:
    """Result of ``MessageStore.insert_message``: the stored message, or the one it duplicates."""

    message: StoredMessage
    duplicate: bool

    @classmethod
    def of(cls, message: StoredMessage, duplicate: bool) -> InsertOutcome:
        """``InsertOutcome(message, duplicate)`` without a frozen dataclass's __init__ (an ``object.__setattr__`` call
        a field, half its cost): the insert makes one for every accepted message."""
        outcome = object.__new__(cls)
        fields = outcome.__dict__  # set in place: replacing it (object.__setattr__) costs half as much again
        fields["message"] = message
        fields["duplicate"] = duplicate
        return outcome


#: the values of a new message's row that are not the message's own: NEW, version 0, nothing tried yet; every field of
#: its snapshot but the id (the message's own are set over them by insert_values)
_NEW_ROW: dict[str, Any] = {name: None for name in StoredMessage.__dataclass_fields__ if name != "id"} | {
    "state": MessageState.NEW, "failed_count": 0, "version": 0,
}


def claimed_row(node_id: str, claimed_at: datetime) -> dict[str, Any]:
    """The base of :func:`insert_values` for the rows of messages claimed at their insert by ``node_id`` at
    ``claimed_at`` (as if claimed at that time in the same transaction): PROCESSING, version 1, the claim's node and
    start time."""
    return _NEW_ROW | {"state": MessageState.PROCESSING, "version": 1, "node_id": node_id,
                       "start_process_ts": claimed_at, "last_update_ts": claimed_at}


def insert_values(new: NewMessage, base: dict[str, Any] | None = None) -> dict[str, Any]:
    """The column values of the ``message`` row that stores ``new``: NEW, version 0 (every field of its snapshot but
    the id); over ``base`` (:func:`claimed_row`), claimed at its insert."""
    # a copy of the base (one memory copy of its table) with the message's values set in it: a third of the cost of
    # building the dict entry by entry (every accepted message makes one)
    values = (_NEW_ROW if base is None else base).copy()
    values["correlation_id"] = new.correlation_id
    values["source_system"] = new.source_system
    values["process_id"] = new.process_id
    values["service"] = new.service
    values["operation"] = new.operation
    values["object_id"] = new.object_id
    values["entity_type"] = new.entity_type
    values["funnel_value"] = new.funnel_value
    values["payload"] = new.payload
    values["content_type"] = new.content_type
    values["headers"] = dict(new.headers)
    values["receive_ts"] = new.receive_ts
    values["msg_ts"] = new.msg_ts
    values["custom_data"] = {}
    values["business_errors"] = []
    values["parent_id"] = new.parent_id
    values["traceparent"] = new.traceparent
    if base is None:
        values["last_update_ts"] = new.receive_ts
    return values


def row_to_message(row: sa.Row[Any]) -> StoredMessage:
    """The :class:`StoredMessage` of a row selected with every column of :data:`message_table`."""
    values = dict(row._mapping)
    values["headers"] = values["headers"] or {}
    values["custom_data"] = values["custom_data"] or {}
    values["business_errors"] = values["business_errors"] or []
    return StoredMessage(**values)
