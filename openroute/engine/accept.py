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



def check_inbound(inbound: InboundMessage, routes: RouteRegistry, max_payload_bytes: int) -> Route:
    """The route of ``inbound`` once every check of an accept passed (nothing is stored).

    Raises :class:`UnknownRouteError`, :class:`ValidationError` (:class:`~openroute.definitions.body.InvalidBodyError`
    with the field errors for a typed route's body) or :class:`PayloadTooLargeError` (over ``max_payload_bytes``).
    """
    if not isinstance(inbound, InboundMessage):
        raise ValidationError(f"expected an InboundMessage, got {type(inbound).__name__}")
    _check_texts(inbound, _ROUTE_TEXTS)
    route = routes.get(inbound.service, inbound.operation)
    _check_texts(inbound, _REQUIRED_TEXTS)
    for name, limit in _OPTIONAL_TEXTS:
        value = getattr(inbound, name)
        if value is not None:
            _check_text(name, value, limit)
    if not isinstance(inbound.payload, str):
        raise ValidationError(f"payload must be text, got {type(inbound.payload).__name__}")
    limit = max_payload_bytes
    # a str of n characters is at most 4n bytes in UTF-8: only encode when it could be too large
    if len(inbound.payload) * 4 > limit:
        size = len(inbound.payload.encode("utf-8", "surrogatepass"))
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


#: the text fields of an inbound message that name its route, checked before the route is looked up, and the other
#: required ones, with their column sizes
_ROUTE_TEXTS = (("service", 100), ("operation", 100))
_REQUIRED_TEXTS = (("correlation_id", 255), ("source_system", 100), ("content_type", 100))
#: the optional text fields of an inbound message and their column sizes
_OPTIONAL_TEXTS = (("process_id", 255), ("object_id", 255), ("entity_type", 100), ("funnel_value", 255))


def _check_texts(inbound: InboundMessage, fields: tuple[tuple[str, int], ...]) -> None:
    """The required text ``fields`` of ``inbound`` (name, column size): every accept passes here, so a text that is
    plainly fine is checked inline, anything else by :func:`_check_text` (the precise error; a str subclass passes)."""
    for name, limit in fields:
        value = getattr(inbound, name)
        if not (value.__class__ is str and value and len(value) <= limit and "\x00" not in value
                and not value.isspace()):
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
