"""The network under the outbound clients (openroute/outbound/_connections.py): the pool's look at an idle connection
asks the kept socket, and a connection the server closed is not used again."""

from __future__ import annotations

import asyncio

import httpcore
import pytest

from openroute.outbound import ExternalHttpClient, ExternalSystem, network_transport
from openroute.outbound._connections import KeptSocketBackend, KeptSocketStream


def test_the_transport_of_the_clients_runs_on_the_kept_socket_backend() -> None:
    """Fails when httpx stops building its pool the way network_transport replaces the backend of."""
    transport = network_transport()
    assert isinstance(transport._pool._network_backend, KeptSocketBackend)


class ClosingServer:
    """An HTTP/1.1 server that answers each connection's first request with a keep-alive answer, then closes it when
    told (as a server whose keep-alive time ran out does)."""

    def __init__(self) -> None:
        self.connections = 0
        self.close_now = asyncio.Event()

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        head = await reader.readuntil(b"\r\n\r\n")
        length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                       if line.lower().startswith(b"content-length:")), 0)
        await reader.readexactly(length)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 11\r\n\r\n{\"ok\":true}")
        await writer.drain()
        await self.close_now.wait()
        writer.close()
        await writer.wait_closed()


async def test_a_connection_the_server_closed_is_seen_readable_and_replaced() -> None:
    server = ClosingServer()
    listening = await asyncio.start_server(server.handle, "127.0.0.1", 0)
    port = listening.sockets[0].getsockname()[1]
    try:
        async with ExternalHttpClient(ExternalSystem("BILLING", base_url=f"http://127.0.0.1:{port}/")) as client:
            assert await client.post_json("/charges", {"n": 1}) == {"ok": True}
            idle = client._client._transport._pool.connections  # type: ignore[attr-defined]
            assert len(idle) == 1
            stream = idle[0]._connection._network_stream
            assert isinstance(stream, KeptSocketStream)
            assert not stream.get_extra_info("is_readable")  # kept alive, nothing sent: reusable

            server.close_now.set()
            await asyncio.wait_for(_until_readable(stream), 5)  # the server's FIN: the pool must not reuse it
            assert await client.post_json("/charges", {"n": 2}) == {"ok": True}
        assert server.connections == 2
    finally:
        listening.close()
        await listening.wait_closed()


async def _until_readable(stream: httpcore.AsyncNetworkStream) -> None:
    while not stream.get_extra_info("is_readable"):
        await asyncio.sleep(0.01)


@pytest.mark.parametrize("info", ["client_addr", "server_addr", "socket"])
async def test_the_kept_socket_stream_answers_the_other_questions_as_the_stream_it_wraps(info: str) -> None:
    listening = await asyncio.start_server(lambda _r, w: w.close(), "127.0.0.1", 0)
    port = listening.sockets[0].getsockname()[1]
    try:
        stream = await KeptSocketBackend().connect_tcp("127.0.0.1", port, timeout=5)
        assert isinstance(stream, KeptSocketStream)
        assert stream.get_extra_info(info) == stream._stream.get_extra_info(info)
        await stream.aclose()
        assert stream.get_extra_info("is_readable")  # a closed socket: nothing to reuse
    finally:
        listening.close()
        await listening.wait_closed()
