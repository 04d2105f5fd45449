"""A request must arrive whole within the deadline: real uvicorn (httptools and h11), real slow sockets."""

from __future__ import annotations

import json
import logging
import socket
import time
from collections.abc import Iterator

import pytest
from openroute.persistence import MessageStore

from openroute.engine import Engine, EngineSettings
from openroute.wire.request_deadline import request_deadline_protocol
from tests._support.servers import read_until_closed, serving_on_socket
from tests.inbound.conftest import AUTH, BINDINGS, basic, routes
from tests.inbound.conftest import SETTINGS as INBOUND_SETTINGS

DEADLINE = 1.0
ORDER = json.dumps({"orderId": "O-1", "customer": {"id": "C-7"}}).encode()


def _request(body: bytes = ORDER, length: int | None = None) -> bytes:
    auth = basic()["Authorization"]
    return (f"POST /api/orders/create HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Authorization: {auth}\r\nContent-Length: {len(body) if length is None else length}\r\n\r\n"
            ).encode() + body


@pytest.fixture(params=["httptools", "h11"])
def server(request: pytest.FixtureRequest, sqlite_url: str) -> Iterator[tuple[str, int]]:
    from openroute.server import create_app

    store = MessageStore(sqlite_url)
    store.create_schema()
    engine = Engine(store, routes(), EngineSettings(repoll_interval=None, node_id="deadline-test"))
    app = create_app(engine, BINDINGS, inbound_auth=AUTH, settings=INBOUND_SETTINGS)
    try:
        with serving_on_socket(app, request_deadline_protocol(DEADLINE, request.param)) as address:
            yield address
    finally:
        store.dispose()


def _response(conn: socket.socket) -> bytes:
    """One whole HTTP response (status line, headers and a Content-Length body)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        assert chunk, f"the server closed after {data!r}"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                  if line.lower().startswith(b"content-length"))
    while len(body) < length:
        body += conn.recv(65536)
    return head + b"\r\n\r\n" + body


@pytest.mark.parametrize("part", ["headers", "body"])
def test_a_client_sending_a_byte_at_a_time_is_cut_off(
    server: tuple[str, int], part: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    request = _request()
    head = request.index(b"\r\n\r\n") + 4
    with socket.create_connection(server, timeout=10) as conn:
        if part == "body":
            conn.sendall(request[:head])  # the headers at once, then the body a byte at a time
            request = request[head:]
        started = time.monotonic()
        sent = 0
        closed = False
        for byte in request:
            try:
                conn.sendall(bytes([byte]))
            except (BrokenPipeError, ConnectionResetError):
                closed = True
                break
            sent += 1
            conn.settimeout(0.1)  # the slow client's pace: one byte per 100 ms, unless the server answers first
            try:
                answer = conn.recv(65536)
            except TimeoutError:
                continue
            except ConnectionResetError:
                closed = True
                break
            closed = True
            conn.settimeout(10)
            answer += read_until_closed(conn)
            assert answer == b"" or answer.startswith(b"HTTP/1.1 408"), answer
            break
        elapsed = time.monotonic() - started
    assert closed and sent < len(request), f"the server took all {sent} bytes over {elapsed:.1f} s"
    assert sent < 8 * DEADLINE * 10 + 5  # cut off near the deadline (10 bytes a second), not at the end
    lines = [r for r in caplog.records if "did not arrive completely" in r.getMessage()]
    assert len(lines) == 1 and "127.0.0.1" in lines[0].getMessage()
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == [lines[0].getMessage()]


def test_a_connection_that_sends_nothing_is_closed(server: tuple[str, int]) -> None:
    with socket.create_connection(server, timeout=10) as conn:
        assert read_until_closed(conn).startswith(b"HTTP/1.1 408")  # within the deadline, long before the 10 s timeout


def test_whole_requests_are_served_and_the_body_limit_stays(server: tuple[str, int]) -> None:
    with socket.create_connection(server, timeout=10) as conn:
        conn.sendall(_request())
        first = _response(conn)
        assert first.startswith(b"HTTP/1.1 202"), first
        time.sleep(DEADLINE * 1.5)  # idle between two requests on one connection is the keep-alive's business
        conn.sendall(_request(json.dumps({"orderId": "O-2", "customer": {"id": "C"}}).encode()))
        second = _response(conn)
        assert second.startswith(b"HTTP/1.1 202"), second
    with socket.create_connection(server, timeout=10) as conn:
        conn.sendall(_request(b"{" + b" " * 70_000 + b"}"))
        assert _response(conn).startswith(b"HTTP/1.1 413")


def test_the_deadline_must_be_positive() -> None:
    with pytest.raises(ValueError, match="positive"):
        request_deadline_protocol(0)
    with pytest.raises(ValueError, match="implementation"):
        request_deadline_protocol(1, "zttp")
