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

__all__ = ["InsertOutcome", "MessageFields", "NewMessage", "StoredMessage", "insert_values", "row_to_message"]

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
    def from_values(cls, message_id: int, values: Mapping[str, Any]) -> StoredMessage:
        """The snapshot of a row just inserted with ``values`` (every column but id), without __init__'s cost."""
        fields = dict(values)
        fields["id"] = message_id
        # the defaults (of the columns an insert does not write) as __init__ would set them: the snapshot's __dict__
        # holds every field, so a change can be compared with it whole (openroute.engine.states._changed)
        for name, default in _DEFAULTS.items():
            if name not in fields:
                fields[name] = default
        snapshot = object.__new__(cls)
        object.__setattr__(snapshot, "__dict__", fields)  # see transitioned
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
        if not _STORED_FIELDS.issuperset(changes):
            raise TypeError(f"StoredMessage has no field(s) {sorted(changes.keys() - _STORED_FIELDS)}")
        values = self.__dict__.copy()
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
        object.__setattr__(outcome, "__dict__", {"message": message, "duplicate": duplicate})
        return outcome


#: read once: a member read through its class is a call of the enum type's attribute hook each time (Python 3.11)
_NEW = MessageState.NEW


def insert_values(new: NewMessage) -> dict[str, Any]:
    """The column values of the ``message`` row that stores ``new`` (NEW, version 0)."""
    values: dict[str, Any] = {
        "correlation_id": new.correlation_id,
        "source_system": new.source_system,
        "process_id": new.process_id,
        "service": new.service,
        "operation": new.operation,
        "object_id": new.object_id,
        "entity_type": new.entity_type,
        "funnel_value": new.funnel_value,
        "payload": new.payload,
        "content_type": new.content_type,
        "headers": dict(new.headers),
        "state": _NEW,
        "failed_count": 0,
        "receive_ts": new.receive_ts,
        "msg_ts": new.msg_ts,
        "start_process_ts": None,
        "last_update_ts": new.receive_ts,
        "next_attempt_at": None,
        "node_id": None,
        "custom_data": {},
        "business_errors": [],
        "last_error_code": None,
        "last_error_text": None,
        "parent_id": new.parent_id,
        "version": 0,
        "traceparent": new.traceparent,
    }
    return values


def row_to_message(row: sa.Row[Any]) -> StoredMessage:
    """The :class:`StoredMessage` of a row selected with every column of :data:`message_table`."""
    values = dict(row._mapping)
    values["headers"] = values["headers"] or {}
    values["custom_data"] = values["custom_data"] or {}
    values["business_errors"] = values["business_errors"] or []
    return StoredMessage(**values)
