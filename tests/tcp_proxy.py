"""A TCP proxy a test can cut and restore: a database outage without touching the database server.

It runs its own asyncio loop on a thread, so the code under test (threads or loops of its own) is never blocked
by it. ``cut()`` closes every open connection and answers new ones by closing them at once (as a server that went
away does); ``restore()`` forwards again.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator

import sqlalchemy as sa


class TcpProxy:
    """Forwards ``127.0.0.1:<port>`` to ``target_host:target_port`` until :meth:`close`."""

    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self.port = 0
        self._cut = False
        self._writers: set[asyncio.StreamWriter] = set()
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.Server | None = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tcp-proxy", daemon=True)
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("the TCP proxy did not start within 10 s")

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._server = self._loop.run_until_complete(asyncio.start_server(self._serve, "127.0.0.1", 0))
        self.port = self._server.sockets[0].getsockname()[1]
        self._ready.set()
        self._loop.run_forever()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._cut:
            writer.close()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.close()
            return
        self._writers.update((writer, up_writer))

        async def pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
            with contextlib.suppress(OSError, asyncio.CancelledError):
                while data := await source.read(65536):
                    sink.write(data)
                    await sink.drain()
            sink.close()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))
        self._writers.difference_update((writer, up_writer))

    def url(self, database_url: str) -> str:
        """``database_url`` pointed at the proxy."""
        return sa.engine.make_url(database_url).set(host="127.0.0.1", port=self.port).render_as_string(
            hide_password=False)

    def cut(self) -> None:
        """Drop every connection and refuse new ones (accepted, then closed at once)."""
        def drop() -> None:
            self._cut = True
            for writer in list(self._writers):
                writer.transport.abort()
            self._writers.clear()
        self._call(drop)

    def restore(self) -> None:
        """Forward new connections again."""
        def restore() -> None:
            self._cut = False
        self._call(restore)

    def _call(self, work: object) -> None:
        done = threading.Event()

        def run() -> None:
            try:
                work()  # type: ignore[operator]
            finally:
                done.set()
        self._loop.call_soon_threadsafe(run)
        done.wait(10)

    def close(self) -> None:
        """Stop forwarding, end the connections' tasks and the thread, and close the loop (a task left pending
        is reported by asyncio when the collector meets it, as an error record in whichever test runs then)."""
        self.cut()

        async def shut_down() -> None:
            if self._server is not None:
                self._server.close()
            # cut() aborted every connection: each connection's task ends by itself (a cancelled one would be
            # reported by asyncio's stream callback); one still opening its upstream connection is waited for
            tasks = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
            if tasks:
                await asyncio.wait(tasks, timeout=5)
            self._loop.stop()

        self._loop.call_soon_threadsafe(lambda: self._loop.create_task(shut_down()))
        self._thread.join(10)
        if not self._thread.is_alive():
            self._loop.close()


@contextlib.contextmanager
def proxy_to(database_url: str) -> Iterator[TcpProxy]:
    """A :class:`TcpProxy` in front of the database of ``database_url``, closed afterwards."""
    parsed = sa.engine.make_url(database_url)
    proxy = TcpProxy(parsed.host or "127.0.0.1", parsed.port or 5432)
    try:
        yield proxy
    finally:
        proxy.close()
