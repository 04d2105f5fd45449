"""The checks of an inbound message at accept, before anything is stored (``Engine.check_inbound``), and the
answer and snapshot an accept gives."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from openroute.definitions.errors import PayloadTooLargeError, ValidationError
from openroute.definitions.message import InboundMessage
from openroute.definitions.route import Route, RouteRegistry
from openroute.persistence import MessageState, StoredMessage

__all__ = ["AcceptResult", "check_inbound", "stored_new"]


@dataclass(frozen=True)
class AcceptResult:
    """The answer to an accept: the stored message (or the one it duplicates) and its state: NEW for a message this
    accept stored (the state it entered the store in, also when the node claimed it in the same transaction), the
    current one of a duplicate."""

    message_id: int
    correlation_id: str
    duplicate: bool
    state: MessageState

    def __init__(self, message_id: int, correlation_id: str, duplicate: bool, state: MessageState) -> None:
        # written out: a frozen dataclass's own __init__ sets each field through object.__setattr__ (about 1,300
        # instructions a field), and every accept answers once (tests/engine/test_written_out_inits.py holds it to them)
        fields = self.__dict__
        fields["message_id"] = message_id
        fields["correlation_id"] = correlation_id
        fields["duplicate"] = duplicate
        fields["state"] = state


def check_inbound(inbound: InboundMessage, routes: RouteRegistry, max_payload_bytes: int) -> Route:
    """The route of ``inbound`` once every check of an accept passed (nothing is stored).

    Raises :class:`UnknownRouteError`, :class:`ValidationError` (:class:`~openroute.definitions.body.InvalidBodyError`
    with the field errors for a typed route's body) or :class:`PayloadTooLargeError` (over ``max_payload_bytes``).
    """
    if not isinstance(inbound, InboundMessage):
        raise ValidationError(f"expected an InboundMessage, got {type(inbound).__name__}")
    # every accept passes here: a text that is plainly fine is checked inline (a loop over the fields costs twice as
    # much), anything else by _check_text (the precise error; a str subclass passes); the texts that name the route
    # first, so a route of bad texts is not looked up
    service, operation = inbound.service, inbound.operation
    if not (service.__class__ is str and 0 < len(service) <= 100 and "\x00" not in service and not service.isspace()):
        _check_text("service", service, 100)
    if not (operation.__class__ is str and 0 < len(operation) <= 100 and "\x00" not in operation
            and not operation.isspace()):
        _check_text("operation", operation, 100)
    route = routes.get(service, operation)
    _check_other_texts(inbound)
    payload = inbound.payload
    if not isinstance(payload, str):
        raise ValidationError(f"payload must be text, got {type(payload).__name__}")
    limit = max_payload_bytes
    # a str of n characters is at most 4n bytes in UTF-8: only encode when it could be too large
    if len(payload) * 4 > limit:
        size = len(payload.encode("utf-8", "surrogatepass"))
        if size > limit:
            raise PayloadTooLargeError(size, limit)
    headers = inbound.headers
    if not (headers.__class__ is dict or isinstance(headers, Mapping)) or (headers and not all(
        isinstance(k, str) and isinstance(v, str) for k, v in headers.items()
    )):
        raise ValidationError("headers must map strings to strings")
    stamp = inbound.message_timestamp
    if stamp is not None and (not isinstance(stamp, datetime) or stamp.tzinfo is None):
        raise ValidationError(f"message_timestamp must be a timezone-aware datetime, got {stamp!r}")
    if route.validator is not None:
        route.validator(inbound)
    # a typed route: a body its model refuses is not stored (an endpoint hands over the body it bound)
    if route.body is not None and not route.body.bound(inbound.body, inbound.content_type):
        route.body.parse(inbound.payload, inbound.content_type)
    return route


#: the optional text fields of an inbound message and their column sizes (the required ones are checked inline in
#: check_inbound: service, operation, source system and content type 100 characters, correlation id 255)
_OPTIONAL_TEXTS = (("process_id", 255), ("object_id", 255), ("entity_type", 100), ("funnel_value", 255))


def _check_other_texts(inbound: InboundMessage) -> None:
    """The texts of ``inbound`` that do not name its route (checked as :func:`check_inbound` checks those)."""
    text = inbound.correlation_id
    if not (text.__class__ is str and 0 < len(text) <= 255 and "\x00" not in text and not text.isspace()):
        _check_text("correlation_id", text, 255)
    text = inbound.source_system
    if not (text.__class__ is str and 0 < len(text) <= 100 and "\x00" not in text and not text.isspace()):
        _check_text("source_system", text, 100)
    text = inbound.content_type
    if not (text.__class__ is str and 0 < len(text) <= 100 and "\x00" not in text and not text.isspace()):
        _check_text("content_type", text, 100)
    if (inbound.process_id is not None or inbound.object_id is not None or inbound.entity_type is not None
            or inbound.funnel_value is not None):
        for name, limit in _OPTIONAL_TEXTS:
            value = getattr(inbound, name)
            if value is not None:
                _check_text(name, value, limit)


def _check_text(name: str, value: Any, limit: int) -> None:
    if not isinstance(value, str) or not value or value.isspace():
        raise ValidationError(f"{name} must be a non-empty string, got {value!r}")
    if len(value) > limit:
        raise ValidationError(f"{name} is longer than {limit} characters")
    if "\x00" in value:  # no database column stores it (PostgreSQL refuses the row, SQLite cuts the text)
        raise ValidationError(f"{name} holds a NUL character")


def stored_new(claimed: StoredMessage) -> StoredMessage:
    """The NEW snapshot of a message its accept stored claimed (PROCESSING, version 1): what the transition listeners
    hear of the accept, as they did when the claim came after it."""
    return claimed.evolve(state=MessageState.NEW, version=0, node_id=None, start_process_ts=None,
                          last_update_ts=claimed.receive_ts)
