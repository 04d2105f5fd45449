"""The feeder: the node's processing queue pulls the messages the store holds ready when it has room.

Ready means due (PARTLY_FAILED or POSTPONED whose next attempt has come, parked messages a breaker released) or NEW
and queued by nobody (accepted while the queue was full, or by a node that died before queueing it). One writer
transaction reads them from the store's due index in order (``FOR UPDATE SKIP LOCKED`` on PostgreSQL, so nodes
feeding at once take different messages) and claims them for this node (``EngineWrites.claim_ready``); they are
queued past the bound, which their claim counted. A feed takes at most the room the queue has, and another feed
follows when room frees while the store still holds ready messages: a backlog drains at the pace the workers take
it, without a poll's wait, and work is linear in the backlog.

What asks for a feed: an accept that found the queue full (its message stays NEW in the store: accepting never
waits behind processing), a release of parked messages (here or, by a work signal, on another node), the due time of
a retry or postponement this node decided (a timer: it runs on time, not at the next repoll), repoll, and room freed
while the last feed left ready messages behind.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import datetime, timedelta

from openroute.definitions.clock import Clock
from openroute.engine.pipeline import CommitPipeline
from openroute.engine.queue import ProcessingQueue
from openroute.engine.settings import EngineSettings
from openroute.persistence import FunnelShare, MessageState
from openroute.runtime.logs import repeated_errors

__all__ = ["FUNNEL_SHARE_GRACE", "Feeder"]

log = logging.getLogger("openroute.engine")

#: how overdue a funnel message of another node's share must be before this node's feed takes it (``FunnelShare``)
FUNNEL_SHARE_GRACE = timedelta(seconds=1)


class Feeder:
    """Feeds one node's processing queue from the store (see the module docstring).

    Its claims go through the commit pipeline, which hears of each funnel message a claim put in its funnel's queue
    instead and gives back a claimed message the queue could not take (the node stopping).
    """

    def __init__(self, pipeline: CommitPipeline, queue: ProcessingQueue, clock: Clock,
                 settings: EngineSettings) -> None:
        self._pipeline = pipeline
        self._stats = pipeline.stats
        self._queue = queue
        self._clock = clock
        self._settings = settings
        #: the store may hold ready messages this node has not taken yet
        self._backlog = False
        #: this node accepted messages it could not queue: take NEW ones of any age
        self._new_left = False
        self._feeding: asyncio.Task[int] | None = None
        self._again = False
        # feed once this much room is free (claims in batches, not one by one)
        self._threshold = max(1, min(settings.concurrency, queue.limit // 4))
        # a feed's claim is one writer transaction: kept short, so that the accepts queued behind it wait little
        self._batch = max(1, min(settings.concurrency, settings.repoll_batch))
        self._stopped = False
        self._timer: tuple[datetime, asyncio.TimerHandle] | None = None
        #: this node's share of the funnel values (``FunnelShare``; set by the heartbeat; None: every value)
        self.share: FunnelShare | None = None

    # -- what asks for a feed ---------------------------------------------------------------------------------------
    def accepted_unqueued(self) -> None:
        """An accepted message found no room: it waits in the store as NEW."""
        self._new_left = True
        self.wanted()

    def wanted(self) -> None:
        """Ready messages may wait in the store: feed now if the queue has room, else when it frees."""
        self._backlog = True
        if self._queue.room >= self._threshold:
            self._start()

    def due_at(self, when: datetime) -> None:
        """A message of this node is due at ``when`` (a retry, a postponement): feed then."""
        if self._stopped:
            return
        if self._timer is not None:
            if self._timer[0] <= when:
                return
            self._timer[1].cancel()
        delay = max((when - self._clock.now()).total_seconds(), 0.0) + 0.002  # the loop's timers may fire early
        self._timer = (when, asyncio.get_running_loop().call_later(delay, self._due, when))

    def _due(self, when: datetime) -> None:
        self._timer = None
        if self._clock.now() < when:  # the loop's clock ran ahead of the wall clock
            self.due_at(when)
            return
        self.wanted()

    def room_freed(self) -> None:
        """A message left the queue: feed once enough room is free, if the store still holds ready messages."""
        if self._backlog and self._queue.room >= self._threshold:
            self._start()

    def _start(self) -> None:
        if self._stopped:
            return
        if self._feeding is not None:
            self._again = True
            return
        self._feeding = asyncio.ensure_future(self._run())
        self._feeding.add_done_callback(self._fed)

    def _fed(self, done: asyncio.Future[int]) -> None:
        self._feeding = None
        error = None if done.cancelled() else done.exception()
        if error is not None and not self._pipeline.store.outage.failed(error, "feeding the processing queue"):
            repeated_errors.log(log, "feeding the processing queue failed", error=error)
        if self._again and not self._stopped:
            self._again = False
            self.room_freed()

    def in_progress(self) -> set[asyncio.Future[int]]:
        """The feed running now (empty when none)."""
        return set() if self._feeding is None else {self._feeding}

    async def stop(self) -> None:
        """Feed no more; wait for a feed in progress."""
        self._stopped = True
        if self._timer is not None:
            self._timer[1].cancel()
            self._timer = None
        if self._feeding is not None:
            await asyncio.wait({self._feeding}, timeout=self._settings.stop_timeout)

    async def _run(self) -> int:
        queued = 0
        while not self._stopped:
            self._again = False
            room = min(self._queue.room, self._batch)
            if room < 1:
                break
            await self._while_busy()
            room = min(self._queue.room, self._batch)
            if room < 1:
                break
            now = self._clock.now()
            cutoff = now if self._new_left else now - self._settings.new_pickup_age
            fed = await self.feed_once(now, cutoff, room)
            queued += fed
            if fed < room:  # the store had no more (of what this feed may take)
                self._backlog = self._again
                self._new_left = self._new_left and self._again
                if not self._again:
                    break
        return queued

    async def _while_busy(self) -> None:
        """Wait while the event loop lags (the node's CPU is taken): the backlog gets what is left of the machine,
        never the share of the accepts (``ProcessingQueue.pressure``)."""
        if self._queue.pressure.busy:
            await self._queue.pressure.quiet()

    # -- one feed ---------------------------------------------------------------------------------------------------
    async def feed_once(self, now: datetime, new_cutoff: datetime | None, limit: int) -> int:
        """Claim up to ``limit`` ready messages for this node in one writer transaction and queue them; how many were
        taken (queued, or put in their funnel's queue)."""
        taken = await self._pipeline.claim_ready(now, new_cutoff, limit, self.share)
        for previous, message in taken:
            if message.state is not MessageState.PROCESSING:
                self._pipeline.waited(previous, message)
            elif self._queue.emit_claimed(previous, message):
                self._stats.reemitted += 1
            else:
                await self._pipeline.give_back(message)
        return len(taken)

    async def feed(self, new_cutoff: datetime | None) -> int:
        """One repoll's feed: as much as the queue has room for (``new_cutoff``: NEW messages received by then are
        taken too); how many were taken. A backlog beyond the room is taken as room frees."""
        room = min(self._queue.room, self._settings.repoll_batch)
        if room < 1 or self._stopped:
            self._backlog = True
            return 0
        taken = await self.feed_once(self._clock.now(), new_cutoff, room)
        if taken >= room:
            self._backlog = True
        return taken
