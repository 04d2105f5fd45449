"""The inbound message: what an endpoint (HTTP, SOAP, a split step) hands to the engine to be stored NEW.

It is the one description of a message before it has an id; :meth:`InboundMessage.to_new_message` turns it
into the store's :class:`~openroute.persistence.NewMessage` (the same fields plus the receive time and the
parent), so the defaults (e.g. the entity type) are decided in one place.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from datetime import datetime

from openroute.persistence import MessageFields, NewMessage

__all__ = ["InboundMessage"]


@dataclass(frozen=True)
class InboundMessage(MessageFields):
    """What an inbound endpoint (HTTP/SOAP) hands to :meth:`Engine.accept <openroute.engine.Engine.accept>`: the
    message's fields (see :class:`~openroute.persistence.MessageFields`) and the sender's own timestamp."""

    message_timestamp: datetime | None = None

    def to_new_message(self, receive_ts: datetime, parent_id: int | None = None) -> NewMessage:
        """The row the store inserts for this message, received at ``receive_ts`` (a child: of ``parent_id``)."""
        shared = {name: getattr(self, name) for name in _SHARED}
        shared["headers"] = dict(self.headers)
        # an entity is (entity type, object id); the entity type defaults to the operation
        shared["entity_type"] = self.entity_type or (self.operation if self.object_id is not None else None)
        return NewMessage(**shared, receive_ts=receive_ts, msg_ts=self.message_timestamp, parent_id=parent_id)


_SHARED = tuple(f.name for f in fields(MessageFields))
