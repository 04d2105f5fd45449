"""AMQP message bodies: how a payload becomes a body and a content type, and a body a payload again.

``bytes`` go as they are, ``str`` as UTF-8 ``text/plain``, anything else as JSON; an incoming body is decoded by its
content type (JSON, text) and stays ``bytes`` otherwise.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any


def encode(payload: Any, content_type: str | None = None) -> tuple[bytes, str]:
    """Body and content type of a payload."""
    if isinstance(payload, bytes | bytearray | memoryview):
        return bytes(payload), content_type or "application/octet-stream"
    if isinstance(payload, str):
        return payload.encode("utf-8"), content_type or "text/plain"
    return json.dumps(payload).encode("utf-8"), content_type or "application/json"


def decode(body: bytes, content_type: str | None) -> Any:
    """Payload of a body, by content type."""
    decoder = _DECODERS.get(content_type)
    if decoder is None:
        decoder = _decoder(content_type)
        if len(_DECODERS) < 256:  # content types are few; a sender that varies them gets no cache, not a leak
            _DECODERS[content_type] = decoder
    return decoder(body)


def _decoder(content_type: str | None) -> Callable[[bytes], Any]:
    kind = (content_type or "").split(";")[0].strip().lower()
    if kind == "application/json" or kind.endswith("+json"):
        return _json
    if kind.startswith("text/"):
        return _text
    return _raw


def _json(body: bytes) -> Any:
    # json.loads guesses UTF-16/32 and BOMs from the first bytes; plain UTF-8 skips that guess
    if b"\x00" in body[:4] or body[:1] in (b"\xef", b"\xfe", b"\xff"):
        return json.loads(body)
    return _JSON_DECODER.decode(body.decode("utf-8"))


def _text(body: bytes) -> str:
    return body.decode("utf-8")


def _raw(body: bytes) -> bytes:
    return body


_JSON_DECODER = json.JSONDecoder()
_DECODERS: dict[str | None, Callable[[bytes], Any]] = {}
