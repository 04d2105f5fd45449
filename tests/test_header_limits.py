"""Header limits (openroute/wire/header_limits.py): real uvicorn (httptools and h11), real sockets."""

from __future__ import annotations

import json
import logging
import socket
from collections.abc import Iterator

import pytest
from openroute.persistence import MessageStore

from openroute.engine import Engine, EngineSettings
from openroute.wire.header_limits import HeaderLimits, limit_headers
from openroute.wire.request_deadline import request_deadline_protocol
from tests._support.servers import read_until_closed, serving_on_socket
from tests.inbound.conftest import AUTH, BINDINGS, basic, routes
from tests.inbound.conftest import SETTINGS as INBOUND_SETTINGS

LIMITS = HeaderLimits(max_bytes=4096, max_headers=20)
ORDER = json.dumps({"orderId": "O-1", "customer": {"id": "C-7"}}).encode()


def _request(correlation: str, extra: bytes = b"") -> bytes:
    """A whole order request (8 headers, about 250 bytes of head) with ``extra`` header lines."""
    return (f"POST /api/orders/create HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Authorization: {basic()['Authorization']}\r\nX-Correlation-Id: {correlation}\r\n"
            f"Content-Length: {len(ORDER)}\r\n").encode() + extra + b"\r\n" + ORDER


class Node:
    def __init__(self, address: tuple[str, int], store: MessageStore) -> None:
        self.address, self.store = address, store

    def stored(self) -> int:
        return len(self.store.find())


@pytest.fixture(params=["httptools", "h11"])
def node(request: pytest.FixtureRequest, sqlite_url: str) -> Iterator[Node]:
    from openroute.server import create_app

    store = MessageStore(sqlite_url)
    store.create_schema()
    engine = Engine(store, routes(), EngineSettings(repoll_interval=None, node_id="headers-test"))
    app = create_app(engine, BINDINGS, inbound_auth=AUTH, settings=INBOUND_SETTINGS)
    try:
        with serving_on_socket(app, limit_headers(request_deadline_protocol(10, request.param), LIMITS)) as address:
            yield Node(address, store)
    finally:
        store.dispose()


def _headers(count: int, size: int = 1) -> bytes:
    return b"".join(f"X-H{n}: {'v' * size}\r\n".encode() for n in range(count))


@pytest.mark.parametrize(("extra", "reason"), [
    (_headers(16), b"more than 20 headers"),  # 5 of the request + 16
    (b"X-Big: " + b"v" * 4000 + b"\r\n", b"over 4096 bytes"),
    (_headers(12, 400), b"over 4096 bytes"),  # each header small, all of them too many bytes
])
def test_a_request_over_a_limit_is_answered_431_closed_and_not_stored(
    node: Node, extra: bytes, reason: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    with socket.create_connection(node.address, timeout=10) as conn:
        conn.sendall(_request("c-big", extra))
        answer = read_until_closed(conn)  # the server closes the connection after its answer
    assert answer.startswith(b"HTTP/1.1 431 Request Header Fields Too Large\r\n"), answer[:200]
    assert b"connection: close" in answer and b'"error": "HEADERS_TOO_LARGE"' in answer and reason in answer
    assert node.stored() == 0
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and "refused with 431" in warnings[0] and "127.0.0.1:" in warnings[0], warnings


def test_requests_within_the_limits_are_served_and_a_pipelined_one_over_them_is_refused(node: Node) -> None:
    """At the limits a request is served; a second request on the same connection (pipelined, sent at once with the
    first) that is over them gets 431 after the first one's answer, and is not stored."""
    head = len(_request("c-1").split(b"\r\n\r\n")[0])  # the request line and headers, the last line end not
    filler = 4096 - head - len(b"X-Fill: \r\n") - len(_headers(14))
    at_limit = _request("c-1", b"X-Fill: " + b"f" * filler + b"\r\n" + _headers(14))  # 4096 bytes, 20 headers
    assert len(at_limit.split(b"\r\n\r\n")[0]) == 4096
    with socket.create_connection(node.address, timeout=10) as conn:
        conn.sendall(at_limit + _request("c-2", _headers(16)))
        answers = read_until_closed(conn)
    assert answers.startswith(b"HTTP/1.1 202 "), answers[:200]
    assert b"HTTP/1.1 431 " in answers and answers.count(b"HTTP/1.1 ") == 2
    assert [m.correlation_id for m in node.store.find()] == ["c-1"]


def test_a_header_streamed_without_end_is_cut_as_it_arrives(node: Node) -> None:
    """A client sending one endless header value is answered 431 once the bytes passed the limit, long before the
    value would end: the server does not wait for (and keep) the whole header."""
    with socket.create_connection(node.address, timeout=10) as conn:
        conn.sendall(b"POST /api/orders/create HTTP/1.1\r\nHost: x\r\nX-Endless: ")
        sent = 0
        try:
            for _ in range(1000):  # up to 64 MB, a megabyte's tenth at a time
                conn.sendall(b"e" * 65536)
                sent += 65536
        except (BrokenPipeError, ConnectionResetError):
            pass
        answer = read_until_closed(conn)
    assert answer.startswith(b"HTTP/1.1 431 ") or answer == b"", answer[:100]  # a reset may drop the answer
    assert sent < 8 * 1024 * 1024, f"the server took {sent} bytes of one header"
    assert node.stored() == 0


def test_limits_must_be_positive_and_the_class_a_uvicorn_protocol() -> None:
    with pytest.raises(ValueError, match="max_bytes must be a positive integer"):
        HeaderLimits(max_bytes=0)
    with pytest.raises(ValueError, match="max_headers"):
        HeaderLimits(max_headers=True)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="not a uvicorn httptools or h11 protocol"):
        limit_headers(object, LIMITS)  # type: ignore[arg-type]
