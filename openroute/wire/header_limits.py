"""Limits on a request's headers: total bytes and count, checked by uvicorn's HTTP protocol before the application.

uvicorn's ``httptools`` protocol takes headers of any size (llhttp sets no limit) and its ``h11`` protocol only
refuses a header block over 16 KiB with a bare 400; no ASGI middleware can help, since it runs once the headers are
whole in memory. :func:`limit_headers` extends a uvicorn protocol class: a request whose request line and headers
exceed ``max_bytes``, or that has more than ``max_headers`` headers, is answered ``431 Request Header Fields Too
Large`` (``{"error": "HEADERS_TOO_LARGE", ...}``) before the application sees it (nothing is stored), the connection
is closed and one WARNING line is logged. The bytes of a header block still arriving are counted as they come, so a
client streaming a huge header is cut once the limit is passed, not when its header is complete::

    import uvicorn
    from openroute.wire.header_limits import HeaderLimits, limit_headers
    from openroute.wire.request_deadline import request_deadline_protocol

    uvicorn.Config(app, http=limit_headers(request_deadline_protocol(30.0), HeaderLimits(max_bytes=65536)))
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from dataclasses import dataclass
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

__all__ = ["HeaderLimits", "limit_headers"]

log = logging.getLogger("openroute.server")

#: the bytes each header adds besides its name and value (": " and the line end), as counted on the wire
_PER_HEADER = 4


@dataclass(frozen=True)
class HeaderLimits:
    """How large a request's head may be (``[inbound] max_header_bytes``, ``max_headers``)."""

    #: the request line and every header (names, values, separators) together, in bytes
    max_bytes: int = 64 * 1024
    #: how many header lines a request may have
    max_headers: int = 100

    def __post_init__(self) -> None:
        for name in ("max_bytes", "max_headers"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")


def limit_headers(protocol: type[asyncio.Protocol], limits: HeaderLimits) -> type[asyncio.Protocol]:
    """``protocol`` (uvicorn's ``httptools`` or ``h11`` protocol class, or a subclass such as
    :func:`~openroute.wire.request_deadline.request_deadline_protocol`'s) answering ``431`` to a request over
    ``limits``.

    Raises ValueError for a class that derives from neither."""
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    if issubclass(protocol, HttpToolsProtocol):
        mixin: type[Any] = _HttpToolsLimits
    elif issubclass(protocol, H11Protocol):
        mixin = _H11Limits
    else:
        raise ValueError(f"{protocol.__name__} is not a uvicorn httptools or h11 protocol class")
    return type(f"{protocol.__name__}Headers", (mixin, protocol), {"header_limits": limits})


def _answer(reason: str) -> bytes:
    body = json.dumps({"error": "HEADERS_TOO_LARGE", "reason": reason}).encode()
    return (b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-type: application/json\r\n"
            b"content-length: " + str(len(body)).encode() + b"\r\nconnection: close\r\n\r\n" + body)


class _Refusal:
    """What both protocols share: the refusal, once per connection."""

    header_limits: HeaderLimits
    transport: asyncio.Transport
    client: tuple[str, int] | None
    _refused: str | None = None
    _answered = False

    def _refuse(self, reason: str) -> None:
        """Read nothing more of this connection; answer 431 once the answers of earlier requests are sent."""
        if self._refused is not None:
            return
        self._refused = reason
        if self._may_answer():
            self._answer()

    def _may_answer(self) -> bool:
        return True

    def _answer(self) -> None:
        if self._answered or self._refused is None:
            return
        self._answered = True
        client = f"{self.client[0]}:{self.client[1]}" if self.client else "unknown client"
        log.warning("request from %s refused with 431: %s; connection closed", client, self._refused)
        if not self.transport.is_closing():
            self.transport.write(_answer(self._refused))
            self.transport.close()

    def _too_many(self, count: int) -> str:
        return f"more than {self.header_limits.max_headers} headers ({count} so far)"

    def _too_large(self, size: int) -> str:
        return f"the request line and headers are over {self.header_limits.max_bytes} bytes ({size} so far)"


class _HttpToolsLimits(_Refusal):
    """The limits on uvicorn's httptools protocol: the parser's callbacks count each header as it completes and
    :meth:`data_received` the bytes of a head still arriving (llhttp hands a header over only once it is whole)."""

    _in_head = True
    _arriving = 0
    _head_bytes = 0
    _headers = 0

    def data_received(self, data: bytes) -> None:
        if self._refused is not None:
            return
        if self._in_head:
            self._arriving += len(data)
        super().data_received(data)  # type: ignore[misc]  # uvicorn's protocol, after this class in the MRO
        if self._in_head and self._arriving > self.header_limits.max_bytes:
            self._refuse(self._too_large(self._arriving))

    def on_message_begin(self) -> None:
        if self._refused is not None:
            return
        self._in_head, self._head_bytes, self._headers = True, 0, 0
        super().on_message_begin()  # type: ignore[misc]

    def on_url(self, url: bytes) -> None:
        if self._refused is not None:
            return
        self._head_bytes += len(url)
        if self._head_bytes > self.header_limits.max_bytes:
            self._refuse(self._too_large(self._head_bytes))
            return
        super().on_url(url)  # type: ignore[misc]

    def on_header(self, name: bytes, value: bytes) -> None:
        if self._refused is not None:
            return
        self._headers += 1
        self._head_bytes += len(name) + len(value) + _PER_HEADER
        if self._headers > self.header_limits.max_headers:
            self._refuse(self._too_many(self._headers))
        elif self._head_bytes > self.header_limits.max_bytes:
            self._refuse(self._too_large(self._head_bytes))
        else:
            super().on_header(name, value)  # type: ignore[misc]

    def on_headers_complete(self) -> None:
        if self._refused is not None:
            return  # no request cycle: the application never sees it
        self._in_head, self._arriving = False, 0
        super().on_headers_complete()  # type: ignore[misc]

    def on_body(self, body: bytes) -> None:
        if self._refused is None:
            super().on_body(body)  # type: ignore[misc]

    def on_message_complete(self) -> None:
        if self._refused is not None:
            return
        self._in_head, self._arriving = True, 0
        super().on_message_complete()  # type: ignore[misc]

    def _may_answer(self) -> bool:
        # a request refused behind pipelined ones is answered after them, in order
        cycle = getattr(self, "cycle", None)
        return cycle is None or bool(cycle.response_complete)

    def on_response_complete(self) -> None:
        super().on_response_complete()  # type: ignore[misc]
        if self._refused is not None and not getattr(self, "pipeline", None):
            self._answer()


# the end of a head: an empty line (h11 accepts a bare "\n" as a line end)
_HEAD_END = re.compile(rb"\r?\n\r?\n")


class _H11Limits(_Refusal):
    """The limits on uvicorn's h11 protocol: before h11 reads a new request, its buffered bytes are measured up to
    the head's end (bounded: a head over the limit is refused as it arrives)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # h11's own limit (uvicorn's default 16 KiB) would answer a bare 400 before this one: one chunk above ours
        self.conn = h11.Connection(h11.SERVER, max_incomplete_event_size=self.header_limits.max_bytes + 65536)

    def data_received(self, data: bytes) -> None:
        if self._refused is None:
            super().data_received(data)  # type: ignore[misc]

    def handle_events(self) -> None:
        if self._refused is None and self.conn.their_state is h11.IDLE:
            buffered = self.conn.trailing_data[0]
            end = _HEAD_END.search(buffered)
            head = buffered if end is None else buffered[:end.start()]
            # a line end per header (the request line's is counted, the head's closing one is not); a head still
            # arriving that ends with a line end has one more
            lines = head.count(b"\n") - (1 if end is None and head.endswith(b"\n") else 0)
            if len(head) > self.header_limits.max_bytes:
                self._refuse(self._too_large(len(head)))
            elif lines > self.header_limits.max_headers:
                self._refuse(self._too_many(lines))
            if self._refused is not None:
                return
        super().handle_events()  # type: ignore[misc]
