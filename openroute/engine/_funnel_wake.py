"""Funnel wake-up: when the message holding a funnel leaves PROCESSING, the next message waiting for it runs at once.

A message that finds its funnel held goes POSTPONED (error code ``FUNNEL``) and would be taken again by repoll only
after ``postpone_interval``. Instead, the transaction that moves the holder out of PROCESSING also reads the next
message this node postponed for the funnel, which is queued right after the commit, and on PostgreSQL sends
``NOTIFY`` on the channel :data:`CHANNEL` (payload: sender node id and funnel value; delivered at the commit), so
every other node wakes the messages it postponed itself. A node listens on its own connection (psycopg's
``notifies()``) on a thread of its own.

A wake-up can be missed when the holder ends while the waiting message is being postponed (the wake-up's query
runs before the postponement is committed): every postponement is therefore checked once after its commit, and
the message is woken at once when its holder has already left PROCESSING. Repoll stays the safety net (a node
that died, a notification lost while the listener reconnected).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import sqlalchemy as sa

from openroute.engine.outcome import ErrorCode
from openroute.logs import repeated_errors
from openroute.persistence import MessageState, MessageStore, StoredMessage, message_table
from openroute.persistence.outage import StoreOutage, describe_error

log = logging.getLogger("openroute.engine")

T = TypeVar("T")

#: the PostgreSQL NOTIFY channel of funnel releases
CHANNEL = "openroute_funnel"
#: between the sender node id and the funnel value in a notification's payload
_SEPARATOR = "\x1f"
#: messages woken per release (the first takes the funnel, the others are postponed again by it)
_WAKE_BATCH = 1


class FunnelWake:
    """Wakes the messages ``node_id`` postponed for a funnel when the funnel is released (see the module doc).

    ``run_db(work)`` runs blocking database work off the loop; ``emit(message)`` queues a message for processing
    (False when it is already queued or the node has no room: repoll then takes it). With ``claim``, the messages a
    release finds are handed to it in the release's transaction (writer thread) and it returns them as they are to
    be emitted (claimed ones PROCESSING); ``unclaim(message)`` gives back a claimed message that could not be
    emitted.
    """

    def __init__(
        self,
        store: MessageStore,
        node_id: str,
        run_db: Callable[[Callable[[], Any]], Awaitable[Any]],
        emit: Callable[[StoredMessage], Awaitable[bool]],
        *,
        claim: Callable[[list[StoredMessage], sa.Connection], list[StoredMessage]] | None = None,
        unclaim: Callable[[StoredMessage], Awaitable[None]] | None = None,
    ) -> None:
        self.store = store
        self.node_id = node_id
        self._run_db = run_db
        self._emit = emit
        self._claim = claim
        self._unclaim = unclaim
        self._notify = store.dialect == "postgresql"
        self._tasks: set[asyncio.Future[Any]] = set()
        # messages to wake, found in a release's transaction, by the releasing message's id (set by the writer thread)
        self._found: dict[int, list[StoredMessage]] = {}
        self._listener: _Listener | None = None
        #: wake-ups that queued a message (in-process, from another node, after a missed release)
        self.woken = 0

    # -- node lifecycle ------------------------------------------------------------------------------------------
    def start(self) -> None:
        """On PostgreSQL, start listening for other nodes' releases (on the running loop)."""
        if self._notify and self._listener is None:
            self._listener = _Listener(self.store, self.node_id, asyncio.get_running_loop(), self._from_other_node)
            self._listener.start()

    async def stop(self) -> None:
        """Stop listening and wait for wake-ups in progress."""
        listener, self._listener = self._listener, None
        if listener is not None:
            await asyncio.get_running_loop().run_in_executor(None, listener.stop, self.store)
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=5)

    # -- events ----------------------------------------------------------------------------------------------------
    @staticmethod
    def releases(previous: MessageState, message: StoredMessage) -> bool:
        """Whether this change of a funnel message frees its funnel: it leaves PROCESSING, and not because the
        funnel itself held it back."""
        if message.funnel_value is None or previous is not MessageState.PROCESSING:
            return False
        if message.state is MessageState.POSTPONED:
            return message.last_error_code != ErrorCode.FUNNEL.value
        return message.state is not MessageState.PROCESSING

    def released_in(self, message: StoredMessage, connection: sa.Connection) -> None:
        """Writer thread, in the transaction that frees ``message``'s funnel: notify the other nodes (at the commit)
        and find the message to wake, queued by :meth:`committed` once the transaction is committed."""
        assert message.funnel_value is not None  # noqa: S101  narrows an Optional for mypy: set before this point
        found = self._released(message.funnel_value, connection)
        if found and self._claim is not None:
            found = self._claim(found, connection)
        self._found[message.id] = found

    def committed(self, message: StoredMessage) -> None:
        """On the loop, after the commit of a change of ``message``: wake what its release found."""
        found = self._found.pop(message.id, None)
        if found:
            self._spawn(self._wake(found))

    def discard(self, message_id: int) -> None:
        """The change of ``message_id`` was not committed: forget what its release found."""
        self._found.pop(message_id, None)

    def held(self, message: StoredMessage, blocker: int) -> None:
        """``message`` was just postponed behind ``blocker``: wake it at once if the blocker has already left
        PROCESSING (its release ran before this postponement was committed). Call it while ``message`` is still
        in the node's pipeline; the check runs once the caller has given it up."""
        self._spawn(self._recheck(message, blocker))

    def _spawn(self, work: Awaitable[None]) -> None:
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Future[Any]) -> None:
        self._tasks.discard(task)
        error = None if task.cancelled() else task.exception()
        if error is not None and not self.store.outage.failed(error, "funnel wake-up"):
            repeated_errors.log(log, "funnel wake-up failed", error=error)

    # -- work ------------------------------------------------------------------------------------------------------
    def _released(self, funnel: str, connection: sa.Connection) -> list[StoredMessage]:
        if self._notify:
            connection.execute(sa.select(sa.func.pg_notify(CHANNEL, f"{self.node_id}{_SEPARATOR}{funnel}")))
        return self._waiting(funnel, connection)

    def _waiting(self, funnel: str, connection: sa.Connection | None = None) -> list[StoredMessage]:
        c = message_table.c
        return self.store.find(
            c.funnel_value == funnel, c.state == MessageState.POSTPONED, c.node_id == self.node_id,
            c.last_error_code == ErrorCode.FUNNEL.value, limit=_WAKE_BATCH, connection=connection,
        )

    async def _recheck(self, message: StoredMessage, blocker: int) -> None:
        holder = await self._run_db(lambda: self.store.get(blocker))
        if holder is None or holder.state is not MessageState.PROCESSING:
            await self._wake([message])

    async def _wake(self, messages: list[StoredMessage]) -> None:
        for message in messages:
            if await self._emit(message):
                self.woken += 1
            elif message.state is MessageState.PROCESSING and self._unclaim is not None:
                await self._unclaim(message)

    def _from_other_node(self, funnel: str) -> None:
        self._spawn(self._wake_from_notification(funnel))

    async def _wake_from_notification(self, funnel: str) -> None:
        await self._wake(await self._run_db(lambda: self._waiting(funnel)))


class _Listener:
    """``LISTEN`` on its own psycopg connection (autocommit) on a thread; hands other nodes' releases to the loop.

    A lost connection is opened again every second (longer while the store stays away, :meth:`StoreOutage.delay`)
    until :meth:`stop`; releases sent meanwhile are left to repoll. An unreachable store is logged once per outage
    (``outage``).
    """

    def __init__(self, store: MessageStore, node_id: str, loop: asyncio.AbstractEventLoop,
                 released: Callable[[str], None]) -> None:
        url = store.engine.url.set(drivername="postgresql")
        self._conninfo = url.render_as_string(hide_password=False)
        self._node_id = node_id
        self._loop = loop
        self._released = released
        self._stopping = threading.Event()
        #: whether the listener finds the store unreachable (persistence/outage.py)
        self.outage = StoreOutage.of_loop("funnel listener")
        self._thread = threading.Thread(target=self._run, name=f"openroute-funnel-listener-{node_id}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, store: MessageStore) -> None:
        """Stop listening: a notification of this node's own wakes the listener at once (no wait for its poll)."""
        self._stopping.set()
        with contextlib.suppress(Exception):  # the database is gone: the listener ends at its next poll anyway
            store.run(lambda c: c.execute(sa.select(sa.func.pg_notify(CHANNEL, f"{self._node_id}{_SEPARATOR}"))))
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
                    log.warning("funnel listener of node %s stopped listening (%s); listening again in 1 s",
                                self._node_id, describe_error(error))
                self._stopping.wait(self.outage.delay(1.0))

    def _handle(self, payload: str) -> None:
        sender, separator, funnel = payload.partition(_SEPARATOR)
        if not separator or sender == self._node_id:
            return  # this node woke its own messages already
        with contextlib.suppress(RuntimeError):  # the loop is closed: the node is gone
            self._loop.call_soon_threadsafe(self._released, funnel)
