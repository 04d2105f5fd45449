"""Messages parked on an open circuit breaker, and their release when the breaker lets calls through again.

A message whose call meets an OPEN (or full HALF_OPEN) breaker parks on the external system: POSTPONED with
``parked_on`` set and no due time, its failed count unchanged (``outcome.parked``). It is not claimed again while the
breaker stays open. :class:`Parking` watches each system this node has seen parked messages for:

- at the breaker's ``open_until`` (a timer), when the breaker may take trial calls, it releases **one** parked
  message, the oldest, whose call is the trial; a trial's result (this node's breaker change, heard through
  ``CallGuard.watch``) releases the next trial, or every parked message once the breaker is CLOSED;
- once the breaker is CLOSED (closed here, by another node or by an admin) it releases every parked message at once,
  in receive order (``store.parking.release``): they are due now, and the feeder queues them as far as the node has
  room, on every node (``signal``: PostgreSQL NOTIFY), while the system's bulkhead paces their calls.

Repoll runs :meth:`Parking.survey` every interval: the parked counts per system (the safety net for parked messages
no timer of any live node watches) and, while messages are parked, one INFO line per system per minute. Each
message's own park and release are DEBUG lines (the transition log).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from datetime import datetime, timedelta

from openroute.definitions.clock import Clock
from openroute.engine._work_signal import WorkSignal
from openroute.engine.exchange import CallGuard
from openroute.engine.feeder import Feeder
from openroute.engine.reads import StoreReads
from openroute.persistence import MessageStore
from openroute.persistence.breaker import BreakerOutlook, BreakerState, Verdict

__all__ = ["Parking"]

log = logging.getLogger("openroute.engine")

#: how long a released trial message is given to reach the breaker before another is released
TRIAL_PATIENCE = timedelta(seconds=30)
#: how often the summary line of a system with parked messages is written
SUMMARY_EVERY = timedelta(minutes=1)
#: a release of at least this many messages refreshes the table's statistics (the queues' plans depend on them)
BULK_RELEASE = 1000
#: the longest a timer waits before it looks at the breaker again (a forced breaker has no end)
LONGEST_WAIT = timedelta(minutes=1)


class Parking:
    """The parked messages of the systems this node watches (see the module docstring).

    Its reads run on the node's ``reads`` threads; a release tells the ``feeder`` that messages became due on this node
    and, through the work ``signal``, the other nodes (PostgreSQL NOTIFY; nothing on SQLite).
    """

    def __init__(self, store: MessageStore, clock: Clock, guard: CallGuard | None, reads: StoreReads, feeder: Feeder,
                 signal: WorkSignal) -> None:
        self.store = store
        self.clock = clock
        self.guard = guard
        self._reads = reads
        self._feeder = feeder
        self._signal = signal
        self._timers: dict[str, tuple[datetime, asyncio.TimerHandle]] = {}
        self._checking: dict[str, asyncio.Task[None]] = {}
        self._again: set[str] = set()
        self._trial_released: dict[str, datetime] = {}
        self._summarized: dict[str, datetime] = {}
        self._running = False
        #: parked messages released by this node (for a trial or because the breaker closed)
        self.released = 0
        #: the last counts of parked messages per system (read by survey)
        self.counts: dict[str, int] = {}

    def start(self) -> None:
        """Watch breakers (after the node started)."""
        self._running = True
        if self.guard is not None:
            self.guard.watch(self.changed)

    async def stop(self) -> None:
        """Stop the timers and wait for the checks in progress."""
        self._running = False
        for _at, handle in self._timers.values():
            handle.cancel()
        self._timers.clear()
        if self._checking:
            await asyncio.wait(set(self._checking.values()), timeout=5)

    def in_progress(self) -> set[asyncio.Task[None]]:
        """The checks of breakers running now."""
        return set(self._checking.values())

    # -- events -----------------------------------------------------------------------------------------------------
    def parked(self, system: str, retry_at: datetime | None) -> None:
        """A message of this node parked on ``system``, or failed on a call of it: look at the breaker at
        ``retry_at``.

        A park is a refusal: the breaker is not waiting for a trial released earlier (that one reached it and parked
        again, or another message's trial holds the places), so the next look may release another."""
        self._trial_released.pop(system, None)
        self._schedule(system, retry_at)

    def changed(self, system: str) -> None:
        """This node changed the breaker of ``system`` (listener of ``CallGuard.watch``): look at it now."""
        if system == "" or not self._running:
            return
        self._trial_released.pop(system, None)  # the trial reached the breaker: its result decides the next step
        self.check_soon(system)

    def check_soon(self, system: str) -> None:
        """Look at the breaker of ``system`` now (once at a time per system; a request meanwhile runs it again)."""
        if not self._running:
            return
        if system in self._checking:
            self._again.add(system)
            return
        task = asyncio.ensure_future(self._check(system))
        self._checking[system] = task
        task.add_done_callback(functools.partial(self._checked, system))

    def _checked(self, system: str, done: asyncio.Future[None]) -> None:
        self._checking.pop(system, None)
        error = None if done.cancelled() else done.exception()
        if error is not None:
            if not self.store.outage.failed(error, f"releasing messages parked on {system}"):
                log.warning("messages parked on %s: the breaker could not be read: %s: %s", system,
                            type(error).__name__, error)
            self._schedule(system, self.clock.now() + timedelta(seconds=5))
        if system in self._again:
            self._again.discard(system)
            self.check_soon(system)

    def _schedule(self, system: str, at: datetime | None) -> None:
        if not self._running:
            return
        now = self.clock.now()
        at = min(at if at is not None else now + LONGEST_WAIT, now + LONGEST_WAIT)
        current = self._timers.get(system)
        if current is not None:
            if current[0] <= at:
                return
            current[1].cancel()
        loop = asyncio.get_running_loop()
        delay = max((at - now).total_seconds(), 0.0)
        self._timers[system] = (at, loop.call_later(delay, self._fire, system))

    def _fire(self, system: str) -> None:
        self._timers.pop(system, None)
        self.check_soon(system)

    # -- the decision -----------------------------------------------------------------------------------------------
    async def _check(self, system: str) -> None:
        outlook = await self.guard.outlook(system) if self.guard is not None else None
        now = self.clock.now()
        if outlook is None or outlook.verdict is Verdict.ALLOW:
            # with the parked ones, the messages whose call failed before the breaker closed are retried at once
            # (a breaker CLOSED since its row was made, or none, never held them back: their retries keep their time)
            failed_before = None if outlook is None else outlook.closed_at
            released = await self._release(system, now, None, failed_before=failed_before)
            if released:
                state = "CLOSED" if outlook is not None else "without a breaker"
                log.info("%d message(s) parked on %s released (breaker %s)", released, system, state)
            return
        if outlook.verdict is Verdict.TRIAL:
            await self._release_trial(system, outlook, now)
            return
        self._schedule(system, outlook.retry_at)  # REFUSE: look again when the breaker may let calls through

    async def _release_trial(self, system: str, outlook: BreakerOutlook, now: datetime) -> None:
        """One parked message, the oldest, makes the next trial call (unless a trial released lately has not yet
        reached the breaker)."""
        earlier = self._trial_released.get(system)
        if earlier is not None and now - earlier < TRIAL_PATIENCE:
            self._schedule(system, earlier + TRIAL_PATIENCE)
            return
        # the oldest waiting message: parked, or failed on the system (when every message failed before the breaker
        # opened, none parked: one of them makes the trial rather than its hour's retry)
        # marked before the release: a breaker change heard while it runs (``changed``) must clear the mark, or the
        # next look would wait TRIAL_PATIENCE for a trial that met a breaker opened again by another message's trial
        self._trial_released[system] = now
        released = await self._release(system, now, 1, failed_before=now)
        if released:
            log.debug("breaker %s %s: one parked message released for a trial call", system, outlook.state.value)
            self._schedule(system, now + TRIAL_PATIENCE)
        elif self._trial_released.get(system) == now:
            del self._trial_released[system]

    async def _release(self, system: str, now: datetime, limit: int | None,
                       failed_before: datetime | None = None) -> int:
        released: int = await self._reads.run(
            lambda: self.store.parking.release(system, now, limit, failed_before=failed_before))
        if released:
            self.released += released
            if released >= BULK_RELEASE:  # before the drain: its first hand-offs plan on the new statistics
                await self._reads.run(self.store.refresh_statistics)
            self._feeder.wanted()
            if limit is None:
                self._signal.send()
        return released

    # -- the repoll's look ------------------------------------------------------------------------------------------
    async def survey(self) -> None:
        """Read the parked counts per system; check each system's breaker (the safety net for messages parked by a
        node that is gone) and write its summary line once a minute."""
        counts: dict[str, int] = await self._reads.run(self.store.parking.counts)
        self.counts = counts
        now = self.clock.now()
        for system, count in counts.items():
            self.check_soon(system)
            last = self._summarized.get(system)
            if last is None or now - last >= SUMMARY_EVERY:
                self._summarized[system] = now
                await self._summary(system, count)
        for system in set(self._summarized) - set(counts):
            del self._summarized[system]

    async def _summary(self, system: str, count: int) -> None:
        outlook = await self.guard.outlook(system) if self.guard is not None else None
        if outlook is None or outlook.state is BreakerState.CLOSED:
            log.info("%d message(s) waiting for %s (breaker CLOSED: being released)", count, system)
            return
        log.info("%d message(s) waiting for %s, breaker %s since %s", count, system, outlook.state.value,
                 outlook.since.isoformat(timespec="seconds"))
