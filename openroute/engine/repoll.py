"""The engine's scheduled work: the repoll job and the node's heartbeat, run by an APScheduler job each while the
node runs.

Repoll is the safety net of waiting on events, not the way messages wait: it repairs PROCESSING messages past their
lease (a dead node's; the repair's transaction hands their funnels on), feeds the queue with what became due by time
(``feeder.py``), hands on funnel queues left without a holder (``funnel.py``) and surveys the messages parked on
open breakers (``parking.py``).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable
from dataclasses import KW_ONLY, dataclass, field
from datetime import datetime, timedelta
from typing import Any

from openroute.definitions.clock import Clock
from openroute.definitions.errors import UnknownRouteError
from openroute.definitions.route import Route, RouteRegistry
from openroute.engine import outcome as outcomes
from openroute.engine.feeder import FUNNEL_SHARE_GRACE, Feeder
from openroute.engine.funnel import FunnelQueue
from openroute.engine.parking import Parking
from openroute.engine.pipeline import CommitPipeline
from openroute.engine.queue import ProcessingQueue
from openroute.engine.reads import StoreReads
from openroute.engine.settings import EngineSettings
from openroute.persistence import FunnelShare, MessageState, MessageStore
from openroute.runtime.logs import repeated_errors

__all__ = ["Repoll"]

log = logging.getLogger("openroute.engine")


@dataclass(eq=False)
class Repoll:
    """Repoll and heartbeat of one node (``Engine.repoll_once`` runs one repoll by hand).

    The engine hands over the parts the jobs work with: the node's ``reads`` threads, the commit ``pipeline`` (repairs
    and hand-ons are written through it, its counters), the processing ``queue`` (the operator's node state, the ids
    in the pipeline), the ``feeder``, the ``funnel`` queues and the ``parking``.
    """

    store: MessageStore
    routes: RouteRegistry
    clock: Clock
    settings: EngineSettings
    _: KW_ONLY
    reads: StoreReads
    pipeline: CommitPipeline
    queue: ProcessingQueue
    feeder: Feeder
    funnel: FunnelQueue
    parking: Parking
    _scheduler: Any = field(default=None, init=False, repr=False)
    #: the job runs in progress, awaited by ``stop_jobs``
    _runs: set[asyncio.Task[None]] = field(default_factory=set, init=False, repr=False)
    #: store outages whose stranded PROCESSING messages were repaired
    _outages_recovered: int = field(default=0, init=False, repr=False)

    def start_jobs(self) -> None:
        """Start the repoll and heartbeat jobs (none when ``settings.repoll_interval`` is None)."""
        if self.settings.repoll_interval is None:
            return
        from apscheduler.schedulers.asyncio import AsyncIOScheduler

        self._scheduler = AsyncIOScheduler()
        self._scheduler.add_job(
            self._tracked, "interval", args=[self._repoll_job],
            seconds=self.settings.repoll_interval.total_seconds(), max_instances=1, coalesce=True, id="repoll",
        )
        self._scheduler.add_job(
            self._tracked, "interval", args=[self.heartbeat],
            seconds=max(self.settings.heartbeat_interval.total_seconds(), 1.0), max_instances=1, coalesce=True,
            id="heartbeat",
        )
        self._scheduler.start()

    async def stop_jobs(self, timeout: float) -> None:
        """Stop the jobs: no new run starts; a run in progress gets ``timeout`` seconds to finish, then is cancelled.

        APScheduler's own shutdown cancels a run at once and logs the cancellation as the job's error, with a
        traceback: each run is therefore its own task (see ``_tracked``), awaited here.
        """
        if self._scheduler is not None:
            self._scheduler.shutdown(wait=False)
            self._scheduler = None
        runs = set(self._runs)
        if not runs:
            return
        _done, late = await asyncio.wait(runs, timeout=timeout)
        for run in late:
            run.cancel()
        if late:
            await asyncio.wait(late)

    async def _tracked(self, job: Callable[[], Awaitable[None]]) -> None:
        """Run one job as a task of its own, which ``stop_jobs`` awaits; APScheduler's cancellation at its shutdown
        ends only this wrapper, quietly."""
        run: asyncio.Task[None] = asyncio.ensure_future(job())
        self._runs.add(run)
        run.add_done_callback(self._runs.discard)
        try:
            await asyncio.shield(run)
        except asyncio.CancelledError:
            if self._scheduler is not None:  # not the scheduler's shutdown: the cancellation is someone else's
                run.cancel()
                raise
            log.debug("%s goes on while the node stops", getattr(job, "__name__", "a job run"))

    async def run_once(self, new_cutoff: datetime | None = None, *, feed: bool = True) -> None:
        """One run of the repoll job (see ``Engine.repoll_once``); without ``feed`` (the node does not run) it only
        repairs."""
        if not self.queue.node_state.picks_up_work:  # an operator stopped this node: it picks up no work, repairs too
            return
        now = self.clock.now()
        stats = self.pipeline.stats
        repaired = stats.repaired
        await self.repair_stuck(now, node_id=None, cutoff=now - self.settings.processing_lease)
        if not feed:
            return
        cutoff = new_cutoff if new_cutoff is not None else now - self.settings.new_pickup_age
        taken = await self.feeder.feed(cutoff)
        handed = await self.hand_on_stalled()
        await self.parking.survey()
        if await self.reads.run(self.store.refresh_stale_statistics):
            log.info("repoll: the message table's statistics refreshed (a tenth of it changed since its last analysis)")
        if stats.repaired > repaired or taken or handed:
            log.info("repoll: %d stuck message(s) repaired, %d due or unclaimed message(s) queued%s",
                     stats.repaired - repaired, taken,
                     f", {handed} funnel(s) without a holder handed on" if handed else "")

    async def hand_on_stalled(self) -> int:
        """The funnels' safety net: hand on the funnels whose queue waits while none of their messages is PROCESSING or
        about to run (:meth:`FunnelStore.stalled`), each in a writer transaction, and run here what that claimed.
        Returns how many were handed on."""
        limit, now = self.settings.repoll_batch, self.clock.now()
        stalled = await self.pipeline.submit(lambda connection: self.store.funnels.stalled(limit, now, connection))
        count = 0
        for funnel in stalled:
            claimed = await self.pipeline.submit(functools.partial(self.funnel.hand_on, funnel))
            if claimed is None:
                continue
            count += 1
            if not self.queue.emit_claimed(MessageState.POSTPONED, claimed):
                await self.pipeline.give_back(claimed)
        return count

    async def repair_stuck(
        self, now: datetime, node_id: str | None, cutoff: datetime | None, skip: frozenset[int] = frozenset()
    ) -> None:
        """Give PROCESSING messages started at or before ``cutoff`` (None: any; of ``node_id`` when given), but those
        in ``skip``, their next state as abandoned attempts."""
        limit = self.settings.repoll_batch
        far = cutoff if cutoff is not None else now + timedelta(days=36500)
        stuck = await self.reads.run(
            lambda: self.store.started_before(MessageState.PROCESSING, far, limit, node_id=node_id)
        )
        for message in stuck:
            if message.id in skip:
                continue
            try:
                route: Route | None = self.routes.get(message.service, message.operation)
            except UnknownRouteError:
                route = None
            decision = outcomes.abandoned(message, self.settings.retry_policy_for(route), now)
            if await self.pipeline.apply(message, decision, now, "repair") is not None:
                self.pipeline.stats.repaired += 1

    async def _repoll_job(self) -> None:
        try:
            await self._recover_after_outage()
            await self.run_once()
        except Exception as error:
            if not self.store.outage.failed(error, "repoll"):
                repeated_errors.log(log, "repoll failed", error=error)
        else:
            self.store.outage.succeeded()

    async def share_funnels(self) -> None:
        """Give the feeder this node's share of the funnel values (``FunnelShare``) among the nodes that pick up work
        and beat within two heartbeat intervals; none when this node is not among them."""
        node_id = self.settings.node_id
        since = self.clock.now() - 2 * self.settings.heartbeat_interval - FUNNEL_SHARE_GRACE
        working: list[str] = await self.reads.run(lambda: self.store.nodes.working(since))
        self.feeder.share = (FunnelShare(working.index(node_id), len(working), FUNNEL_SHARE_GRACE)
                             if node_id in working else None)

    async def _recover_after_outage(self) -> None:
        """After an outage: repair this node's PROCESSING messages that are no longer in its pipeline (their outcome
        could not be written), instead of leaving them to the processing lease.

        Only messages claimed before this run began are candidates, and those then in the pipeline are skipped: a
        message accepted and claimed while the run reads (the store is back, requests come in) is in flight, not
        abandoned, even though it is not in the pipeline's snapshot."""
        outages = self.store.outage.outages
        if outages == self._outages_recovered:
            return
        now = self.clock.now()
        await self.repair_stuck(now, node_id=self.settings.node_id, cutoff=now, skip=frozenset(self.queue.ids))
        self._outages_recovered = outages

    async def heartbeat(self) -> None:
        """The heartbeat job: refresh this node's row, obey the state an operator gave it meanwhile, and take this
        node's share of the funnel values among the nodes that beat lately (:meth:`share_funnels`)."""
        node_id = self.settings.node_id
        try:
            state = await self.reads.run(lambda: self.store.nodes.heartbeat(node_id, self.clock.now()))
            if state is not None and state is not self.queue.node_state:
                log.info("node %s is now %s (set by an operator)", node_id, state.value)
                self.queue.node_state = state
            await self.share_funnels()
        except Exception as error:
            if not self.store.outage.failed(error, "heartbeat"):
                repeated_errors.log(log, "heartbeat failed", error=error)
        else:
            self.store.outage.succeeded()
