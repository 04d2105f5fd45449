"""A deadline for each HTTP request to arrive whole: uvicorn's HTTP protocol classes with a per-request timer.

uvicorn's keep-alive timeout is re-armed by every byte received, so a client that sends its headers or body a byte
at a time holds a connection (and a slot of the server) for ever; no ASGI middleware can help, because it runs only
once the headers are parsed. These subclasses of uvicorn's two HTTP implementations (``httptools`` and ``h11``)
start a timer when a connection opens and when the first byte of a request arrives, and cancel it once the request
(headers and body) is complete. When the timer fires first, the client gets ``408 Request Timeout`` (if no answer
was started), the connection is closed and one line is logged::

    import uvicorn
    from openroute.wire.request_deadline import request_deadline_protocol

    uvicorn.Config(app, http=request_deadline_protocol(30.0))

The time the application takes to answer is not limited here: only the client's sending is.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

log = logging.getLogger("openroute.server")

def _timeout_response(seconds: float) -> bytes:
    body = f"the request did not arrive completely within {seconds:g} s".encode()
    return (b"HTTP/1.1 408 Request Timeout\r\ncontent-type: text/plain; charset=utf-8\r\n"
            b"content-length: " + str(len(body)).encode() + b"\r\nconnection: close\r\n\r\n" + body)


class _Deadline:
    """The timer of one connection: armed while a request is arriving, fires :meth:`_expired` once."""

    deadline: float = 30.0
    transport: asyncio.Transport
    loop: asyncio.AbstractEventLoop
    client: tuple[str, int] | None
    _timer: asyncio.TimerHandle | None = None

    def _arm(self) -> None:
        if self._timer is None:
            self._timer = self.loop.call_later(self.deadline, self._expired)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _answer_started(self) -> bool:
        cycle = getattr(self, "cycle", None)
        return cycle is not None and bool(getattr(cycle, "response_started", False))

    def _expired(self) -> None:
        self._timer = None
        if self.transport.is_closing():
            return
        client = f"{self.client[0]}:{self.client[1]}" if self.client else "unknown client"
        log.warning("request from %s did not arrive completely within %g s: connection closed", client,
                    self.deadline)
        if not self._answer_started():
            self.transport.write(_timeout_response(self.deadline))
        self.transport.close()


def request_deadline_protocol(seconds: float, implementation: str = "auto") -> type[asyncio.Protocol]:
    """A uvicorn HTTP protocol class (``uvicorn.Config(http=...)``) that closes a connection whose request has
    not arrived whole ``seconds`` after its first byte (or after the connection opened).

    ``implementation`` is ``"httptools"``, ``"h11"`` or ``"auto"`` (httptools when installed, as uvicorn picks).
    Raises ValueError for a deadline that is not positive or an unknown implementation.
    """
    if not seconds > 0:
        raise ValueError(f"the request deadline must be positive, got {seconds!r}")
    if implementation == "auto":
        try:
            import httptools  # noqa: F401  (uvicorn's own choice: the C parser when it is there)
        except ImportError:
            implementation = "h11"
        else:
            implementation = "httptools"
    if implementation == "httptools":
        base: type[Any] = _httptools_class()
    elif implementation == "h11":
        base = DeadlineH11Protocol
    else:
        raise ValueError(f"implementation must be httptools, h11 or auto, got {implementation!r}")
    return type(f"{base.__name__}{seconds:g}s", (base,), {"deadline": float(seconds)})


class DeadlineH11Protocol(_Deadline, H11Protocol):
    """uvicorn's pure-Python (h11) protocol with the request deadline."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]  # uvicorn's own signature
        """Arm the deadline as soon as the connection opens."""
        super().connection_made(transport)
        self._arm()  # a connection that sends nothing is cut too

    def connection_lost(self, exc: Exception | None) -> None:
        """Cancel the timer of the closed connection."""
        self._disarm()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        """Feed ``data`` to h11; the first byte of a request arms the deadline, and the timer stops once the request is
        whole."""
        if self.conn.their_state is h11.IDLE:
            self._arm()
        super().data_received(data)
        self._check_complete()

    def on_response_complete(self) -> None:
        """After an answer, arm the deadline for a pipelined request already partly received, else stop the timer once
        the client is done."""
        super().on_response_complete()
        # a pipelined request only partly received is arriving now: its time runs
        if self.conn.their_state is h11.SEND_BODY or (self.conn.their_state is h11.IDLE and self.conn.trailing_data[0]):
            self._arm()
        else:
            self._check_complete()

    def _check_complete(self) -> None:
        if self.conn.their_state in (h11.DONE, h11.MUST_CLOSE, h11.CLOSED, h11.ERROR) or self.transport.is_closing():
            self._disarm()


def _httptools_class() -> type[Any]:
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    class DeadlineHttpToolsProtocol(_Deadline, HttpToolsProtocol):
        """uvicorn's httptools protocol with the request deadline."""

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]  # uvicorn's own
            super().connection_made(transport)
            self._arm()  # a connection that sends nothing is cut too

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._arm()

        def on_message_complete(self) -> None:
            self._disarm()
            super().on_message_complete()

    return DeadlineHttpToolsProtocol
