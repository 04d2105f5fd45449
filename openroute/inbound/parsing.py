"""Reading and parsing untrusted request bodies: size limit while streaming, secure XML, bounded JSON."""

from __future__ import annotations

import functools
import itertools
import json
import threading
from collections.abc import Awaitable, Callable, Mapping
from datetime import datetime
from typing import Any

from lxml import etree
from starlette.requests import ClientDisconnect

from openroute.auth.errors import (
    BodyTooLargeError,
    ForbiddenXmlError,
    InvalidCharacterError,
    MalformedPayloadError,
    NestingTooDeepError,
    NumberTooLongError,
    UnsupportedMediaTypeError,
)
from openroute.definitions.binding import InboundBinding, ParsedPayload
from openroute.definitions.clock import aware_datetime
from openroute.definitions.errors import ValidationError
from openroute.definitions.message import InboundMessage
from openroute.definitions.route import Route
from openroute.definitions.schema import secure_parser

_MAX_REASON = 300
#: libxml2 refuses XML nested deeper than this without huge_tree (off here): the effective limit of larger max_depth
LIBXML2_MAX_DEPTH = 256


_PARSER = secure_parser()
#: XML declarations after which libxml2 reads the body as UTF-8, as the byte scan for DOCTYPE reads it
_UTF8_DECLARATIONS = (b'<?xml version="1.0" encoding="UTF-8"?>', b'<?xml version="1.0" encoding="utf-8"?>')


class _FeedParsers(threading.local):
    """One secure parser per thread for the push (feed) interface: fed a whole body, it costs less than
    ``etree.fromstring`` (no new parser context per call) and keeps the GIL for its final step."""

    def __init__(self) -> None:
        self.parser = secure_parser()


_FEED = _FeedParsers()


def check_content_length(value: str | None, limit: int) -> None:
    """Reject a declared body larger than ``limit`` before reading any of it."""
    if value is None:
        return
    try:
        size = int(value)
    except ValueError:
        raise MalformedPayloadError(f"invalid Content-Length {value[:40]!r}") from None
    if size < 0:
        raise MalformedPayloadError(f"invalid Content-Length {value[:40]!r}")
    if size > limit:
        raise BodyTooLargeError(limit, size)


async def read_body(receive: Callable[[], Awaitable[Mapping[str, Any]]], content_length: str | None,
                    limit: int) -> bytes:
    """The body of an ASGI request, refused before any of it is read when its Content-Length header
    (``content_length``) declares more than ``limit`` bytes, then read from ``receive`` (:func:`receive_limited`)."""
    check_content_length(content_length, limit)
    return await receive_limited(receive, limit)


def check_json_type(content_type: str | None) -> None:
    """Refuse a JSON request whose ``content_type`` is not JSON (``application/json`` or ``application/*+json``) in
    UTF-8 (:class:`UnsupportedMediaTypeError`), before its body is read."""
    if not content_type:
        raise UnsupportedMediaTypeError("a JSON request needs Content-Type: application/json")
    media, _, rest = content_type.partition(";")
    media = media.strip().lower()
    if media != "application/json" and not (media.startswith("application/") and media.endswith("+json")):
        raise UnsupportedMediaTypeError(f"Content-Type {media!r} is not JSON (application/json)")
    for item in rest.split(";"):
        name, _, value = item.partition("=")
        if name.strip().lower() == "charset" and value.strip().strip('"').lower() not in {"utf-8", "utf8"}:
            raise UnsupportedMediaTypeError(f"JSON must be UTF-8, got charset {value.strip()!r}")


async def receive_limited(receive: Callable[[], Awaitable[Mapping[str, Any]]], limit: int) -> bytes:
    """The body of an ASGI request read from ``receive``, stopping with :class:`BodyTooLargeError` as soon as it
    exceeds ``limit`` bytes; Starlette's ``ClientDisconnect`` when the client goes first. Read from ``receive``
    directly: ``Request.stream()`` is an async generator per request."""
    parts: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        kind = message["type"]
        if kind == "http.request":
            chunk = message.get("body", b"")
            if chunk:
                size += len(chunk)
                if size > limit:
                    raise BodyTooLargeError(limit)
                parts.append(chunk)
            if not message.get("more_body", False):
                return parts[0] if len(parts) == 1 else b"".join(parts)
        elif kind == "http.disconnect":
            raise ClientDisconnect()


def _short(text: str) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= _MAX_REASON else text[: _MAX_REASON - 3] + "..."


def parse_xml(body: bytes, max_depth: int) -> etree._Element:
    """Parse ``body`` as XML: any DOCTYPE is refused, entities are never expanded, depth is bounded."""
    if not body or body.isspace():  # what strip() would leave empty, without copying the body
        raise MalformedPayloadError("the request body is empty")
    # a DOCTYPE is the only way to declare entities: refuse it before libxml2 sees it
    if b"<!DOCTYPE" in body or b"<!ENTITY" in body:
        raise ForbiddenXmlError("DOCTYPE / entity declarations are not allowed")
    parser = _FEED.parser
    try:
        parser.feed(body)
        root = parser.close()
    except (etree.XMLSyntaxError, ValueError):
        # the push parser words some errors less well ("no element found" for an undefined entity): the errors,
        # and whatever it refused, are those of the one-shot parse
        root = _parse_whole(body, max_depth)
    if root is None:
        raise MalformedPayloadError("the request body holds no XML element")
    # the byte scan is conclusive for UTF-8 only: declared, or no declaration ("<" then neither "?" nor the NUL of
    # UTF-16 / UTF-32). Other encodings slip past it: UTF-16, or an ASCII declaration of UTF-7 ("+ADw-!DOCTYPE")
    if not body.startswith(_UTF8_DECLARATIONS) and (body[:1] != b"<" or body[1:2] in (b"?", b"\x00")):
        docinfo = root.getroottree().docinfo
        if docinfo.doctype or docinfo.internalDTD is not None:
            raise ForbiddenXmlError("DOCTYPE / entity declarations are not allowed")
    # a document of at most max_depth elements cannot nest deeper: small ones skip the XPath (and its GIL releases).
    # Each element has a start tag, so a body that starts with "<" (an ASCII-compatible encoding) and holds at most
    # max_depth of them has at most max_depth elements (comments and the like only add to the count)
    if (body[:1] != b"<" or body.count(b"<") > max_depth) and len(
            list(itertools.islice(root.iter(), max_depth + 1))) > max_depth and _deeper_than(max_depth)(root):
        raise NestingTooDeepError(max_depth)
    return root


def _parse_whole(body: bytes, max_depth: int) -> etree._Element | None:
    """``body`` parsed by ``etree.fromstring``, its errors as the inbound errors they are."""
    try:
        root: etree._Element | None = etree.fromstring(body, _PARSER)
    except etree.XMLSyntaxError as error:
        if "Excessive depth" in str(error):  # libxml2's own limit reached before ours was checked
            raise NestingTooDeepError(min(max_depth, LIBXML2_MAX_DEPTH)) from None
        raise MalformedPayloadError(f"malformed XML: {_short(str(error))}") from None
    except ValueError as error:  # e.g. an unsupported encoding declaration
        raise MalformedPayloadError(f"malformed XML: {_short(str(error))}") from None
    return root


@functools.lru_cache(maxsize=16)
def _deeper_than(max_depth: int) -> etree.XPath:
    """True when an element lies below level ``max_depth`` (the root is level 1): one pass of libxml2, in C."""
    return etree.XPath("boolean(" + "/*" * (max_depth + 1) + ")")


def _reject_constant(name: str) -> Any:
    raise MalformedPayloadError(f"malformed JSON: {name} is not a JSON number")


#: one decoder for every body: ``json.loads`` with an argument builds a new one per call
_JSON_DECODER = json.JSONDecoder(parse_constant=_reject_constant)


def _depth_ok(document: Any, max_depth: int) -> bool:
    stack: list[tuple[Any, int]] = [(document, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, dict):
            if depth > max_depth:
                return False
            stack.extend((v, depth + 1) for v in value.values())
        elif isinstance(value, list):
            if depth > max_depth:
                return False
            stack.extend((v, depth + 1) for v in value)
    return True


def parse_json(body: bytes, max_depth: int) -> tuple[str, Any]:
    """Decode ``body`` (UTF-8 JSON object) and return (text, document); depth and NaN/Infinity are refused."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as error:
        reason = f"malformed JSON: the body is not UTF-8 ({error.reason} at byte {error.start})"
        raise MalformedPayloadError(reason) from None
    if not text.strip():
        raise MalformedPayloadError("the request body is empty")
    if text.startswith("\ufeff"):  # json.loads says so too; the decoder alone would say "Expecting value"
        raise MalformedPayloadError("malformed JSON: the body starts with a UTF-8 byte order mark")
    try:
        document = _JSON_DECODER.decode(text)
    except json.JSONDecodeError as error:
        where = f"line {error.lineno} column {error.colno}"
        raise MalformedPayloadError(f"malformed JSON: {error.msg} at {where}") from None
    except RecursionError:
        raise NestingTooDeepError(max_depth) from None
    except ValueError as error:  # int() refuses a number of more than sys.get_int_max_str_digits() digits
        raise NumberTooLongError(f"malformed JSON: a number is too long ({_short(str(error))})") from None
    if not isinstance(document, dict):
        raise MalformedPayloadError(f"the JSON body must be an object, got {type(document).__name__}")
    # each level of nesting opens with a bracket: a text with at most max_depth of them cannot nest deeper
    if text.count("{") + text.count("[") > max_depth and not _depth_ok(document, max_depth):
        raise NestingTooDeepError(max_depth)
    # raw NUL bytes are refused by the decoder and UTF-8 carries no surrogates: only an escape can bring them
    if "\\u" in text:
        _check_characters(document)
    return text, document


def _check_characters(document: Any) -> None:
    """Raises InvalidCharacterError when a key or string of ``document`` holds NUL or a lone surrogate."""
    stack = [document]
    while stack:
        value = stack.pop()
        if isinstance(value, dict):
            for key, item in value.items():
                _check_text(key)
                stack.append(item)
        elif isinstance(value, list):
            stack.extend(value)
        elif isinstance(value, str):
            _check_text(value)


def _check_text(text: str) -> None:
    if "\x00" in text:
        raise InvalidCharacterError("a JSON string holds a NUL character (\\u0000), which no database stores")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        raise InvalidCharacterError(
            f"a JSON string holds a lone surrogate (\\u{ord(text[error.start]):04x}), which is no character"
        ) from None


def parse_timestamp(value: str | None) -> datetime | None:
    """The sender's timestamp of a message (trace header, SOAP trace element or broker header): an aware ISO 8601
    date-time, or None when absent. Raises ValidationError (nothing stored) for text that is not one."""
    if value is None:
        return None
    return aware_datetime(
        value, ValidationError,
        not_iso=f"timestamp {value[:60]!r} is not an ISO 8601 date-time",
        no_zone=f"timestamp {value[:60]!r} has no time zone",
    )


def checked_message(
    binding: InboundBinding, route: Route, payload: ParsedPayload, *, content_type: str, correlation_id: str,
    source_system: str, process_id: str | None, message_timestamp: datetime | None, headers: dict[str, str],
    traceparent: str | None,
) -> InboundMessage:
    """The message handed to ``Engine.accept`` once ``binding``'s checks passed on ``payload``: what they extracted,
    and the payload bound to ``route``'s model from the document already parsed, so that the accept does not parse
    the text again. ``route`` is the binding's, resolved once when the endpoint or channel was set up: the accept
    looks it up for each message, this does not. The HTTP and SOAP endpoints and the channel-fed routes build
    their messages here. Raises ValidationError (InvalidBodyError for a typed route's body)."""
    extracted = binding.check(payload)
    model = route.body
    body: Any = None
    if model is not None:
        body = model.from_xml(payload.xml) if payload.xml is not None else model.from_json(payload.json)
    return InboundMessage(
        service=binding.service,
        operation=binding.operation,
        payload=payload.text,
        content_type=content_type,
        correlation_id=correlation_id,
        source_system=source_system,
        process_id=process_id,
        message_timestamp=message_timestamp,
        headers=headers,
        object_id=extracted.object_id,
        entity_type=extracted.entity_type,
        funnel_value=extracted.funnel_value,
        body=body,
        traceparent=traceparent,
    )
