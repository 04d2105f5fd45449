"""The network under the outbound HTTP clients: httpcore's anyio streams, with a cheaper look at an idle connection.

Before every request, and again when its response is closed, httpcore's pool asks each idle connection whether the
server closed it (``get_extra_info("is_readable")``). The anyio stream answers by building every attribute of the
socket anew, with a ``getpeername`` system call, before it polls the socket: on a node draining a backlog through a
bulkhead of 16 connections that was a fifth of the client's time on the event loop. The streams made here keep
their socket and poll it directly (the same poll httpcore makes).
"""

from __future__ import annotations

import select
import socket
import ssl
from collections.abc import Iterable
from typing import Any

import httpcore
import httpx

__all__ = ["network_transport"]


def network_transport() -> httpx.AsyncHTTPTransport:
    """httpx's transport (its defaults) over :class:`KeptSocketBackend`.

    httpx builds its connection pool itself and takes no network backend, so the pool's backend is replaced after
    the fact; a later httpx without that attribute keeps its own backend (tests/outbound check the replacement)."""
    transport = httpx.AsyncHTTPTransport()
    pool = getattr(transport, "_pool", None)
    if pool is not None and hasattr(pool, "_network_backend"):
        pool._network_backend = KeptSocketBackend()
    return transport


class KeptSocketBackend(httpcore.AsyncNetworkBackend):
    """httpcore's anyio backend, whose streams keep their socket for the pool's look at idle connections."""

    def __init__(self) -> None:
        self._backend = httpcore.AnyIOBackend()

    async def connect_tcp(self, host: str, port: int, timeout: float | None = None, local_address: str | None = None,
                          socket_options: Iterable[Any] | None = None) -> httpcore.AsyncNetworkStream:
        return KeptSocketStream(await self._backend.connect_tcp(
            host, port, timeout=timeout, local_address=local_address, socket_options=socket_options))

    async def connect_unix_socket(self, path: str, timeout: float | None = None,
                                  socket_options: Iterable[Any] | None = None) -> httpcore.AsyncNetworkStream:
        return KeptSocketStream(await self._backend.connect_unix_socket(
            path, timeout=timeout, socket_options=socket_options))

    async def sleep(self, seconds: float) -> None:
        await self._backend.sleep(seconds)


class KeptSocketStream(httpcore.AsyncNetworkStream):
    """A stream of :class:`KeptSocketBackend`: the wrapped stream for everything, its socket for ``is_readable``."""

    def __init__(self, stream: httpcore.AsyncNetworkStream) -> None:
        self._stream = stream
        self._socket: socket.socket | None = stream.get_extra_info("socket")

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return await self._stream.read(max_bytes, timeout)

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        await self._stream.write(buffer, timeout)

    async def aclose(self) -> None:
        await self._stream.aclose()

    async def start_tls(self, ssl_context: ssl.SSLContext, server_hostname: str | None = None,
                        timeout: float | None = None) -> httpcore.AsyncNetworkStream:
        return KeptSocketStream(await self._stream.start_tls(ssl_context, server_hostname, timeout))

    def get_extra_info(self, info: str) -> Any:
        if info == "is_readable":
            return _readable(self._socket)
        return self._stream.get_extra_info(info)


def _readable(sock: socket.socket | None) -> bool:
    """Whether ``sock`` has something to read (or is closed) now: what httpcore asks of an idle connection."""
    if sock is None or sock.fileno() < 0:
        return True
    poll = getattr(select, "poll", None)
    if poll is None:  # Windows
        ready, _, _ = select.select([sock], [], [], 0)
        return bool(ready)
    look = poll()
    look.register(sock, select.POLLIN)
    return bool(look.poll(0))
