"""Work signals between nodes: a node that made messages ready for every node (parked messages released when a
breaker closed) tells the others, so that their feeders take a share of the backlog at once.

On PostgreSQL the signal is a ``NOTIFY`` on :data:`CHANNEL` (payload: the sender's node id; delivered at the
commit); every node listens on its own connection (psycopg's ``notifies()``) on a thread of its own. SQLite has one
node per store: nothing to tell. A lost signal costs only time: every node's repoll feeds its queue too.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Callable

import sqlalchemy as sa

from openroute.engine.feeder import Feeder
from openroute.persistence import MessageStore
from openroute.persistence.outage import StoreOutage, describe_error

__all__ = ["CHANNEL", "WorkSignal"]

log = logging.getLogger("openroute.engine")

#: the PostgreSQL NOTIFY channel of ready work
CHANNEL = "openroute_ready"


class WorkSignal:
    """Sends and hears the signal of ready work; the ``feeder`` hears on the loop when another node sent one."""

    def __init__(self, store: MessageStore, node_id: str, feeder: Feeder) -> None:
        self.store = store
        self.node_id = node_id
        self._feeder = feeder
        self._enabled = store.dialect == "postgresql"
        self._listener: _Listener | None = None
        self._sending: set[asyncio.Future[None]] = set()

    def start(self) -> None:
        """On PostgreSQL, start listening for other nodes' signals (on the running loop)."""
        if self._enabled and self._listener is None:
            self._listener = _Listener(self.store, self.node_id, asyncio.get_running_loop(), self._feeder.wanted)
            self._listener.start()

    async def stop(self) -> None:
        """Stop listening."""
        listener, self._listener = self._listener, None
        if listener is not None:
            await asyncio.get_running_loop().run_in_executor(None, listener.stop, self.store)
        if self._sending:
            await asyncio.wait(set(self._sending), timeout=5)

    def send(self) -> None:
        """Tell the other nodes that messages are ready (in the background; a failure is left to their repoll)."""
        if not self._enabled:
            return
        sending = asyncio.ensure_future(asyncio.to_thread(self._notify))
        self._sending.add(sending)
        sending.add_done_callback(self._sent)

    def _notify(self) -> None:
        self.store.run(lambda c: c.execute(sa.select(sa.func.pg_notify(CHANNEL, self.node_id))))

    def _sent(self, done: asyncio.Future[None]) -> None:
        self._sending.discard(done)
        error = None if done.cancelled() else done.exception()
        if error is not None and not self.store.outage.failed(error, "signalling ready messages"):
            log.warning("node %s could not signal ready messages: %s", self.node_id, describe_error(error))


class _Listener:
    """``LISTEN`` on its own psycopg connection (autocommit) on a thread; hands other nodes' signals to the loop.

    A lost connection is opened again every second (longer while the store stays away, :meth:`StoreOutage.delay`)
    until :meth:`stop`; signals sent meanwhile are left to repoll. An unreachable store is logged once per outage.
    """

    def __init__(self, store: MessageStore, node_id: str, loop: asyncio.AbstractEventLoop,
                 heard: Callable[[], None]) -> None:
        url = store.engine.url.set(drivername="postgresql")
        self._conninfo = url.render_as_string(hide_password=False)
        self._node_id = node_id
        self._loop = loop
        self._heard = heard
        self._stopping = threading.Event()
        #: whether the listener finds the store unreachable (persistence/outage.py)
        self.outage = StoreOutage.of_loop("work signal listener")
        self._thread = threading.Thread(target=self._run, name=f"openroute-signal-listener-{node_id}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, store: MessageStore) -> None:
        """Stop listening: a signal of this node's own wakes the listener at once (no wait for its poll)."""
        self._stopping.set()
        with contextlib.suppress(Exception):  # the database is gone: the listener ends at its next poll anyway
            store.run(lambda c: c.execute(sa.select(sa.func.pg_notify(CHANNEL, self._node_id))))
        self._thread.join(10)

    def _run(self) -> None:
        import psycopg

        while not self._stopping.is_set():
            try:
                with psycopg.connect(self._conninfo, autocommit=True, connect_timeout=5) as connection:
                    connection.execute(f"LISTEN {CHANNEL}")
                    self.outage.succeeded()
                    while not self._stopping.is_set():
                        for notification in connection.notifies(timeout=1.0, stop_after=1):
                            self._handle(notification.payload)
            except Exception as error:  # the database went away: listen again once it is back
                if not self.outage.failed(error):
                    log.warning("work signal listener of node %s stopped listening (%s); listening again in 1 s",
                                self._node_id, describe_error(error))
                self._stopping.wait(self.outage.delay(1.0))

    def _handle(self, sender: str) -> None:
        if sender == self._node_id:
            return  # this node fed its own queue already
        with contextlib.suppress(RuntimeError):  # the loop is closed: the node is gone
            self._loop.call_soon_threadsafe(self._heard)
