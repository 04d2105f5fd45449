"""The broker connection of a channel-fed node cut and restored (a TCP proxy the test controls): nothing lost,
nothing stored twice, the channel reconnects by itself and /health says so meanwhile."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import pytest
import sqlalchemy as sa

from tests.channels.amqp_helpers import delete, publish, ready, unique
from tests.channels.run_config import with_schema
from tests.channels.test_amqp_channel import Node, until

pytestmark = pytest.mark.rabbitmq


class Proxy:
    """Forwards 127.0.0.1:<port> to the broker; :meth:`cut` drops every connection and refuses new ones until
    :meth:`restore`."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.open = True
        self._pipes: set[asyncio.StreamWriter] = set()
        self._server: asyncio.Server | None = None

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return int(self._server.sockets[0].getsockname()[1])

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if not self.open:
            writer.close()
            return
        upstream_reader, upstream_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        self._pipes |= {writer, upstream_writer}

        async def pump(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
            with contextlib.suppress(Exception):
                while data := await source.read(65536):
                    sink.write(data)
                    await sink.drain()
            sink.close()

        await asyncio.gather(pump(reader, upstream_writer), pump(upstream_reader, writer))

    def cut(self) -> None:
        self.open = False
        for pipe in self._pipes:
            pipe.transport.abort()
        self._pipes.clear()

    def restore(self) -> None:
        self.open = True

    async def close(self) -> None:
        self.cut()
        if self._server is not None:
            self._server.close()


async def test_a_cut_broker_connection_loses_and_doubles_nothing(sqlite_url: str, rabbitmq_url: str) -> None:
    queue, dlq = unique("cut"), unique("cut-dlq")
    proxy = Proxy(int(rabbitmq_url.rsplit(":", 1)[1].strip("/")))
    port = await proxy.start()
    via_proxy = f"amqp://guest:guest@127.0.0.1:{port}/?reconnect_interval=0.5"
    messages = [({"customer": {"id": f"C{i}"}}, f"m-{i}") for i in range(150)]
    node: Any = None
    try:
        await publish(rabbitmq_url, queue, messages)
        node = Node(with_schema(sqlite_url), {}, via_proxy, queue, dlq, concurrency=32)
        await node.start()
        stats = node.channels.stats("crm-in")
        await until(lambda: stats.accepted >= 30)
        proxy.cut()
        await until(lambda: node.channels.health() == {"crm-in": "disconnected"}, timeout=10)
        await asyncio.sleep(1.0)  # a few failed reconnects
        proxy.restore()
        await until(lambda: node.count() == 150 and node.channels.health() == {"crm-in": "connected"}, timeout=60)
        await until(lambda: ready_is_zero(rabbitmq_url, queue), timeout=30)
        with node.store.engine.connect() as connection:
            ids = connection.execute(sa.text("SELECT correlation_id FROM message")).scalars().all()
        assert sorted(ids) == sorted(m for _, m in messages)
    finally:
        if node is not None:
            await node.stop()
        await proxy.close()
        await delete(rabbitmq_url, queue, dlq)



async def ready_is_zero(url: str, queue: str) -> bool:
    return await ready(url, queue) == 0


