"""The inbound message: what an endpoint (HTTP, SOAP, a split step) hands to the engine to be stored NEW.

It is the one description of a message before it has an id; :meth:`InboundMessage.to_new_message` turns it
into the store's :class:`~openroute.persistence.NewMessage` (the same fields plus the receive time and the
parent), so the defaults (e.g. the entity type) are decided in one place.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from types import MappingProxyType
from typing import Any

from openroute.persistence import MessageFields, NewMessage

__all__ = ["InboundMessage"]

#: the default of ``InboundMessage.headers``: each message without headers gets a dict of its own
_NO_HEADERS: Mapping[str, str] = MappingProxyType({})


@dataclass(frozen=True)
class InboundMessage(MessageFields):
    """What an inbound endpoint (HTTP/SOAP) hands to :meth:`Engine.accept <openroute.engine.Engine.accept>`: the
    message's fields (see :class:`~openroute.persistence.MessageFields`) and what the binding extracted."""

    process_id: str | None = None
    message_timestamp: datetime | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    object_id: str | None = None
    #: with an object id, None means the operation (an entity is entity type + object id)
    entity_type: str | None = None
    funnel_value: str | None = None
    #: the payload already bound to its route's body model by the endpoint that parsed it (not stored): accept
    #: then does not parse the text again (:mod:`openroute.definitions.body`)
    body: Any = field(default=None, compare=False, repr=False)
    #: the sender's W3C ``traceparent`` (HTTP header, SOAP trace header, broker header), read by the endpoints only
    #: while tracing is on (:mod:`openroute.runtime.tracing`): the parent of the span that accepts the message
    traceparent: str | None = None

    def __init__(self, service: str, operation: str, payload: str, content_type: str, correlation_id: str,
                 source_system: str, process_id: str | None = None, message_timestamp: datetime | None = None,
                 headers: Mapping[str, str] = _NO_HEADERS, object_id: str | None = None,
                 entity_type: str | None = None, funnel_value: str | None = None, body: Any = None,
                 traceparent: str | None = None) -> None:
        # the dataclass's own __init__ of a frozen class sets each of these 14 fields through object.__setattr__
        # (about 1,300 instructions a field): written out (the fields put in its __dict__ in one update: item by item,
        # the dict stays one whose attribute reads 3.11 does not specialise, three times the cost of a read), every
        # message an endpoint accepts costs a sixth of that (tests/engine/test_written_out_inits.py holds it to them)
        self.__dict__.update({
            "service": service, "operation": operation, "payload": payload, "content_type": content_type,
            "correlation_id": correlation_id, "source_system": source_system, "process_id": process_id,
            "message_timestamp": message_timestamp, "headers": {} if headers is _NO_HEADERS else headers,
            "object_id": object_id, "entity_type": entity_type, "funnel_value": funnel_value, "body": body,
            "traceparent": traceparent,
        })

    def to_new_message(self, receive_ts: datetime, parent_id: int | None = None,
                       traceparent: str | None = None) -> NewMessage:
        """The row the store inserts for this message, received at ``receive_ts`` (a child: of ``parent_id``);
        ``traceparent`` is the stored trace context (the accepting span's, not the sender's)."""
        # an entity is (entity type, object id); the entity type defaults to the operation
        entity_type = self.entity_type or (self.operation if self.object_id is not None else None)
        return NewMessage.from_values({
            "service": self.service, "operation": self.operation, "payload": self.payload,
            "content_type": self.content_type, "correlation_id": self.correlation_id,
            "source_system": self.source_system, "receive_ts": receive_ts, "process_id": self.process_id,
            "msg_ts": self.message_timestamp, "headers": dict(self.headers) if self.headers else {},
            "object_id": self.object_id, "entity_type": entity_type, "funnel_value": self.funnel_value,
            "parent_id": parent_id, "traceparent": traceparent,
        })
