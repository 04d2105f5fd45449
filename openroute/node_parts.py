"""The pieces :class:`~openroute.node.Node` is put together from: what a part of its lifespan is (:class:`NodePart`,
a :class:`Step` started and stopped by calls, a background :class:`Loop`) and the builders of the optional parts
a configuration may ask for (channels, throttling) and of the WAL checkpoint at stop."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from openroute.engine import Engine
from openroute.persistence import MessageStore

if TYPE_CHECKING:
    from openroute.definitions.binding import ChannelBinding
    from openroute.inbound import InboundSettings
    from openroute.inbound.channel import ChannelInbound
    from openroute.inbound.throttling import ThrottleRule, Throttling

__all__ = ["Loop", "NodePart", "Step", "channel_inbound", "checkpoint_wal", "inbound_throttling"]

log = logging.getLogger("openroute.server")


class NodePart(Protocol):
    """One part of a node's lifespan: started in the node's order, stopped in the reverse one."""

    @property
    def name(self) -> str:
        """What the part is called in the log and in :attr:`Node.started <openroute.node.Node.started>`."""

    async def start(self, stopping: asyncio.Event) -> None:
        """Start the part; ``stopping`` is set when the node begins to stop (before any part's :meth:`stop`)."""

    async def stop(self) -> None:
        """Stop the part (called once, only after its :meth:`start` returned)."""


@dataclass(frozen=True)
class Step:
    """A part started by awaiting ``begin()`` and stopped by awaiting ``end()`` (either may be None: nothing)."""

    name: str
    begin: Callable[[], Awaitable[object]] | None = None
    end: Callable[[], Awaitable[object]] | None = None

    async def start(self, stopping: asyncio.Event) -> None:
        """Await ``begin()``."""
        if self.begin is not None:
            await self.begin()

    async def stop(self) -> None:
        """Await ``end()``."""
        if self.end is not None:
            await self.end()


@dataclass(eq=False)
class Loop:
    """A background task ``run(stopping)`` for as long as the node runs. Its stop waits for the round in flight to
    end; with ``timeout`` at most that many seconds, then it is logged and left (a hung send must not keep the
    server from stopping)."""

    name: str
    run: Callable[[asyncio.Event], Awaitable[None]]
    timeout: float | None = None
    _task: asyncio.Task[None] | None = field(default=None, init=False)

    async def start(self, stopping: asyncio.Event) -> None:
        """Start the task."""

        async def run() -> None:
            await self.run(stopping)

        self._task = asyncio.create_task(run(), name=self.name)

    async def stop(self) -> None:
        """Wait for the task (``stopping`` is set already)."""
        task, self._task = self._task, None
        if task is None:
            return
        if self.timeout is None:
            await task
            return
        try:
            await asyncio.wait_for(task, self.timeout)
        except (TimeoutError, Exception):
            log.exception("%s: the loop did not stop cleanly", self.name)


def channel_inbound(engine: Engine, channels: Iterable[ChannelBinding], messaging: Mapping[str, object],
                    settings: InboundSettings | None = None) -> ChannelInbound | None:
    """The :class:`~openroute.inbound.channel.ChannelInbound` serving the routes fed by ``channels``, or None when
    there are none (or only optional channels that the configuration binds to no connector).

    Raises :class:`~openroute.definitions.errors.DeploymentError` for channels the configuration cannot serve."""
    channels = list(channels)
    if not channels:
        return None
    from openroute.inbound.channel import ChannelInbound

    inbound = ChannelInbound(engine, channels, messaging, settings=settings)
    return inbound if inbound.channels else None


def inbound_throttling(rules: Sequence[ThrottleRule], store: MessageStore) -> Throttling | None:
    """The inbound throttling of ``rules`` (``[throttling]``) with counters shared through ``store``; None without
    rules (the default: nothing is counted)."""
    from openroute.inbound.throttling import Throttling
    from openroute.persistence import ThrottleCounters

    return Throttling(list(rules), ThrottleCounters(store)) if rules else None


def checkpoint_wal(store: MessageStore) -> bool:
    """Copy a SQLite store's write-ahead log into the database file and empty it (``PRAGMA
    wal_checkpoint(TRUNCATE)``), so the ``.db`` file alone is complete. Returns False for other databases or
    when a reader kept the checkpoint from finishing (logged; the WAL is then folded in at the next open)."""
    if store.engine.dialect.name != "sqlite":
        return False
    store.engine.dispose()  # pooled connections would hold the WAL open
    raw = store.engine.raw_connection()
    try:  # on the driver's connection, outside any transaction (the store's connections BEGIN IMMEDIATE)
        cursor = raw.cursor()
        busy, _, _ = cursor.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
        cursor.close()
    finally:
        raw.close()
    store.engine.dispose()
    if busy:
        log.warning("the SQLite checkpoint at stop was blocked by another connection; the -wal file stays")
    return not busy
