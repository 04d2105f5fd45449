"""Serving an ASGI app with real uvicorn on a free loopback port, in the test's event loop or in a thread."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import uvicorn


def free_port() -> int:
    """A loopback port no one listens on at the moment of the call."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def serving(app: Any, wait: float = 20) -> Iterator[str]:
    """Serve ``app`` with uvicorn in a thread on a free loopback port (its lifespan on) for the block; yields the
    base URL. Asserts that uvicorn started within ``wait`` seconds and that it stopped after the block."""
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    started = threading.Event()

    def watch() -> None:
        while thread.is_alive() and not server.started:
            started.wait(0.01)  # uvicorn offers no event for "started": poll its flag, bounded below
        started.set()

    threading.Thread(target=watch, daemon=True).start()
    assert started.wait(wait) and server.started, "uvicorn did not start"
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(30)
        assert not thread.is_alive(), "uvicorn did not stop"


@contextlib.contextmanager
def serving_on_socket(app: Any, http: Any) -> Iterator[tuple[str, int]]:
    """Serve ``app`` with uvicorn in a thread, with the HTTP protocol ``http`` (a name or a protocol class), on a
    loopback socket bound before it starts, its lifespan on and uvicorn's logging left to the test (``caplog``);
    yields the address. Asserts that uvicorn started within 20 seconds."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_config=None, lifespan="on", http=http))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started and thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.01)  # uvicorn offers no event for "started": poll its flag, bounded
    assert server.started, "uvicorn did not start"
    try:
        yield "127.0.0.1", int(sock.getsockname()[1])
    finally:
        server.should_exit = True
        thread.join(30)
        sock.close()


def read_until_closed(conn: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection (bounded by the socket's timeout)."""
    chunks = []
    while True:
        try:
            chunk = conn.recv(65536)
        except (ConnectionResetError, TimeoutError):
            break
        if not chunk:
            break
        chunks.append(chunk)
    return b"".join(chunks)


@contextlib.asynccontextmanager
async def served(app: Any) -> AsyncIterator[str]:
    """Serve ``app`` with uvicorn in the running event loop on a free loopback port (no lifespan) for the block;
    yields the base URL."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
    server.capture_signals = contextlib.nullcontext  # type: ignore[method-assign]
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        async with asyncio.timeout(10):
            while not server.started:  # uvicorn has no event for it: a bounded poll
                await asyncio.sleep(0.01)
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 10)
        sock.close()
