"""The engine of one node: accept, queue, claim, process, outcome; it assembles the parts of ``openroute.engine``.

Two seams carry the node's work: the processing queue (``queue.py``, what the node takes: permits, the queued ids,
the workers) and the commit pipeline (``pipeline.py``, what it writes: the group-commit writer, several operations
per commit, and what follows each commit). ``Engine.__init__`` hands them to the parts that need them (``feeder.py``,
``funnel.py``, ``parking.py``, ``obsolete.py``, ``repoll.py``); no part calls back into the engine. The node's other
store work (reads, register, heartbeat) runs on a small thread pool (``reads.py``). See docs/lifecycle.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from datetime import datetime
from typing import Any

from openroute.definitions.clock import Clock, SystemClock
from openroute.definitions.errors import (
    ConfigurationError,
    IllegalTransitionError,
    NodeNotAcceptingError,
    StaleMessageError,
    StoreUnavailableError,
)
from openroute.definitions.interceptors import MessageInterceptor, check_interceptors
from openroute.definitions.message import InboundMessage
from openroute.definitions.route import Route, RouteRegistry
from openroute.engine import outcome as outcomes
from openroute.engine import states
from openroute.engine._work_signal import WorkSignal
from openroute.engine.accept import AcceptResult, check_inbound, stored_new
from openroute.engine.attempt import IN_BACKGROUND, Attempts, InBackground, Processed, to_end
from openroute.engine.exchange import AttemptRuntime, CallGuard
from openroute.engine.feeder import Feeder
from openroute.engine.funnel import FunnelQueue
from openroute.engine.hooks import EngineHooks
from openroute.engine.obsolete import ObsoleteCheck
from openroute.engine.parking import Parking
from openroute.engine.pipeline import CommitPipeline
from openroute.engine.queue import PROCESSING_CHANNEL, ProcessingQueue
from openroute.engine.reads import StoreReads
from openroute.engine.repoll import Repoll
from openroute.engine.settings import EngineSettings
from openroute.persistence import MessageState, MessageStore, NewMessage, NodeState, StoredMessage
from openroute.runtime import tracing
from openroute.runtime.logs import repeated_errors

__all__ = ["PROCESSING_CHANNEL", "Engine"]

log = logging.getLogger("openroute.engine")

# the states every message meets here: Python 3.11's EnumType.__getattr__ makes each ``MessageState.X`` a lookup of
# about 900 instructions, a module name costs a tenth of that
_NEW, _PROCESSING = MessageState.NEW, MessageState.PROCESSING


async def _at_once(value: StoredMessage) -> StoredMessage:
    return value


class Engine(EngineHooks):
    """One node of the message lifecycle.

    ``store`` is a :class:`~persistence.MessageStore` or a database URL (the schema must exist: run
    ``openroute db upgrade`` or ``MessageStore.create_schema()``). Parts hear of its changes through the
    methods of :class:`~openroute.engine.hooks.EngineHooks` (``on_final_state`` after the commit that made a message
    final, ``on_final_state_in_transaction`` inside it, ``on_transition`` after every change).
    ``external_calls`` guards the calls of ``ext_call(..., system=...)`` steps (breaker, call records): an
    :class:`openroute.outbound.ExternalCalls`.
    """

    def __init__(
        self,
        store: MessageStore | str,
        routes: RouteRegistry,
        settings: EngineSettings | None = None,
        *,
        clock: Clock | None = None,
        node_id: str | None = None,
        interceptors: Sequence[MessageInterceptor] = (),
        external_calls: CallGuard | None = None,
    ) -> None:
        if not isinstance(routes, RouteRegistry):
            raise ConfigurationError(f"routes must be a RouteRegistry, got {routes!r}")
        routes.check()
        #: engine-wide interceptors, run around every delivery and step before the route's own
        self.interceptors: tuple[MessageInterceptor, ...] = check_interceptors(interceptors, "engine")
        settings = settings or EngineSettings()
        if node_id is not None:
            settings = dataclasses.replace(settings, node_id=node_id)
        self.settings = settings
        self.node_id = settings.node_id
        self.store = store if isinstance(store, MessageStore) else MessageStore(store)
        self._owns_store = not isinstance(store, MessageStore)
        self.routes = routes
        self.clock: Clock = clock or SystemClock()
        EngineHooks.__init__(self)
        #: breaker and records of calls to declared external systems (``ext_call(..., system=...)``)
        self.external_calls = external_calls
        self._reads = StoreReads(settings.db_threads, self.node_id)
        # the two seams: the processing queue (what this node takes) and the commit pipeline (what it writes)
        self._queue = ProcessingQueue(settings.concurrency, settings.queue_size)
        self._funnel = FunnelQueue(self.store, routes, self.clock, self.node_id)
        self._pipeline = CommitPipeline(self.store, self.clock, settings, self._queue, self._funnel,
                                        self._final_state_hooks, self._final_state_tx_hooks,
                                        self._transition_listeners)
        #: the counters of this node (the commit pipeline's own)
        self.stats = self._pipeline.stats
        # what every exchange may ask of this engine: the same for all of them, so built once
        self._runtime = AttemptRuntime(
            self.store, self.clock, self.routes, settings.processing_lease, self._reads.run, self._pipeline.submit,
            self._pipeline.start_call, self._pipeline.end_call, self.node_id, external_calls,
            self._pipeline.add_call_record,
        )
        # how messages wait: the feeder takes the ready ones as room frees, parking holds them on open breakers
        self._feeder = Feeder(self._pipeline, self._queue, self.clock, settings)
        self._queue.when_room_frees(self._feeder.room_freed)
        self._signal = WorkSignal(self.store, self.node_id, self._feeder)
        self._parking = Parking(self.store, self.clock, external_calls, self._reads, self._feeder, self._signal)
        self._obsolete = ObsoleteCheck(self.store, self.clock, self._reads, self._pipeline)
        self._attempts = Attempts(routes, self._runtime, self.interceptors, settings, self.clock,
                                  pipeline=self._pipeline, obsolete=self._obsolete, parking=self._parking,
                                  feeder=self._feeder, run_children=self._run_children)
        # the scheduled jobs: repoll and heartbeat
        self._repoll = Repoll(self.store, routes, self.clock, settings, reads=self._reads, pipeline=self._pipeline,
                              queue=self._queue, feeder=self._feeder, funnel=self._funnel, parking=self._parking)
        #: ``await transact(work)``: ``work(connection)`` in one of this node's group-commit transactions
        #: (:meth:`CommitPipeline.transact <openroute.engine.pipeline.CommitPipeline.transact>`)
        self.transact = self._pipeline.transact
        self._running = False
        self._stopping = False
        self._closed = False

    # -- lifecycle of the node ------------------------------------------------------------------
    @property
    def running(self) -> bool:
        """True between :meth:`start` and :meth:`stop`."""
        return self._running

    @property
    def node_state(self) -> NodeState:
        """What an operator lets this node do (read at start and with every heartbeat; see :meth:`set_node_state`)."""
        return self._queue.node_state

    async def start(self) -> None:
        """Register the node, recover its own abandoned messages, pick up work, start workers and repoll."""
        if self._running:
            return
        if self._closed:
            raise RuntimeError("this engine was stopped; an Engine starts once (create a new one)")
        await self._queue.start(self._consume)
        self._stopping = False
        now = self.clock.now()
        await self._reads.run(lambda: self.store.nodes.register(self.node_id, now))
        stored: NodeState | None = await self._reads.run(lambda: self.store.nodes.state_of(self.node_id))
        self._queue.node_state = stored or NodeState.RUN
        self._running = True
        self._signal.start()
        self._parking.start()
        # this node just started, so nothing it marked PROCESSING can still be running: repair it now
        await self._repoll.repair_stuck(now, node_id=self.node_id, cutoff=None)
        await self._repoll.share_funnels()
        await self.repoll_once(new_cutoff=now)
        self._repoll.start_jobs()

    async def stop(self) -> None:
        """Stop taking work; let messages in flight finish (up to ``stop_timeout``); close the node.

        Queued messages that were not claimed stay NEW / PARTLY_FAILED / POSTPONED in the store and are
        picked up by any node's repoll; queued messages claimed for this node are given back (due at once).
        """
        if not self._running:
            await self._queue.stop(0)  # a start that failed after the workers started: they end with it
            await self._close_resources()
            return
        self._stopping = True
        self._queue.close()
        await self._repoll.stop_jobs(self.settings.stop_timeout)
        await self._feeder.stop()
        await self._parking.stop()
        # queued messages reach the consumer, which skips them now (they stay in the store); messages in
        # flight get stop_timeout to finish, then they are cancelled (PROCESSING, repaired later)
        await self._queue.stop(self.settings.stop_timeout)
        await self._pipeline.give_back_claimed()
        self._running = False
        await self._signal.stop()
        with contextlib.suppress(Exception):
            await self._reads.run(lambda: self.store.nodes.stopped(self.node_id, self.clock.now()))
        await self._close_resources()

    async def _close_resources(self) -> None:
        self._closed = True
        await self._pipeline.aclose()
        self._reads.close()
        if self._owns_store:
            self.store.dispose()

    @property
    def queued(self) -> int:
        """Messages emitted to the processing channel and not yet started."""
        return self._queue.queued

    @property
    def in_flight(self) -> int:
        """Messages a worker of this node is processing now (at most ``settings.concurrency``)."""
        return self._queue.in_flight

    async def wait_idle(self, timeout: float) -> None:
        """Wait until nothing is queued or in flight on this node, and no feed or release of parked messages is under
        way (they would queue more); TimeoutError after ``timeout`` seconds."""
        async with asyncio.timeout(timeout):
            while True:
                await self._queue.wait_idle(timeout)
                busy = self._feeder.in_progress() | self._parking.in_progress()
                if not busy:
                    if self._queue.queued == 0 and self._queue.in_flight == 0:
                        return
                    continue
                await asyncio.wait(busy)

    # -- accept ---------------------------------------------------------------------------------
    def check_inbound(self, inbound: InboundMessage) -> Route:
        """The checks of :meth:`accept` without storing anything; returns the route.

        Raises :class:`UnknownRouteError`, :class:`ValidationError`
        (:class:`~openroute.definitions.body.InvalidBodyError` with the field errors for a typed route's body) or
        :class:`PayloadTooLargeError`.
        """
        return check_inbound(inbound, self.routes, self.settings.max_payload_bytes)

    def accept(self, inbound: InboundMessage) -> Coroutine[Any, Any, AcceptResult]:
        """Validate and store ``inbound`` as NEW, then queue it for processing.

        When this node's queue has room for it and it has no funnel value, it is claimed for this node in the same
        transaction (stored PROCESSING, with both transition rows) and queued claimed; the answer's ``state`` is NEW
        all the same, the state the message entered the store in. Returns after the commit. A repeated (source
        system, correlation id) is answered with ``duplicate=True`` and the existing message; nothing is stored twice
        (nor claimed). Raises
        :class:`UnknownRouteError`, :class:`ValidationError` or :class:`PayloadTooLargeError` (nothing stored),
        :class:`NodeNotAcceptingError` when an operator drained or stopped this node,
        :class:`StoreUnavailableError` while the database cannot be reached (nothing stored; logged once per outage).
        When this node's queue is full the call does not wait: the message stays NEW in the store and the feeder
        queues it once room frees (a backlog is the store's to hold, not the sender's).
        While tracing is on (:mod:`openroute.runtime.tracing`) the accept is a span, child of ``inbound.traceparent``,
        and that span's traceparent is stored with the message: the parent of its attempts and confirmation.
        """
        # the accept's coroutine, returned rather than awaited in one of this call's own: one coroutine fewer a message
        if tracing.ENABLED:
            return tracing.traced_accept(inbound, lambda traceparent: self._accept(inbound, traceparent))
        return self._accept(inbound, None)

    async def _accept(self, inbound: InboundMessage, traceparent: str | None) -> AcceptResult:
        if not self._queue.accepting:
            raise NodeNotAcceptingError(self.node_id, self._queue.node_state.value)
        check_inbound(inbound, self.routes, self.settings.max_payload_bytes)
        new = inbound.to_new_message(self.clock.now(), traceparent=traceparent)
        # the queue has room and no funnel turn is to be taken: claimed for this node in the same transaction, it goes
        # to a worker claimed (one writer round and one statement fewer than a claim of its own)
        claiming = new.funnel_value is None and self._running and not self._stopping and self._queue.reserve()
        try:
            message, duplicate = await (self._pipeline.insert_claimed(new) if claiming else self._pipeline.insert(new))
        except asyncio.CancelledError:
            if claiming:  # the insert may still commit, claimed for this node: its message is queued all the same
                self._claimed_insert_orphaned(new)
            raise
        except Exception as error:
            if claiming:
                self._queue.release(unused=True)
            if self.store.outage.failed(error, "storing an inbound message"):
                raise StoreUnavailableError(self.settings.store_retry_after) from None
            raise
        self.store.outage.succeeded()
        if duplicate:
            if claiming:
                self._queue.release(unused=True)
            self.stats.duplicates += 1
            return AcceptResult(message.id, message.correlation_id, True, message.state)
        self.stats.accepted += 1
        if not claiming:
            self._pipeline.notify(None, message)
            if not self._queue.emit(message) and self._running and not self._stopping:
                self._feeder.accepted_unqueued()  # it waits in the store: accepting never waits behind processing
            return AcceptResult(message.id, message.correlation_id, False, _NEW)
        if self._transition_listeners:  # they hear NEW, then PROCESSING when the worker takes it, as for any claim
            self._pipeline.notify(None, stored_new(message))
        self._queued_claimed(message)
        # the sender is told NEW, the state the accept stored its message in, wherever the node claimed it too
        return AcceptResult(message.id, message.correlation_id, False, _NEW)

    def _queued_claimed(self, claimed: StoredMessage) -> None:
        """Hand the message an accept stored claimed for this node to a worker (its reservation ends), or give it
        back when the node stopped taking work meanwhile."""
        self.stats.claimed_at_accept += 1
        if not self._queue.emit_claimed(_NEW, claimed, reserved=True):
            self._pipeline.give_back_soon(claimed, "after its accept claimed it while the node stopped")

    def _claimed_insert_orphaned(self, new: NewMessage) -> None:
        """The accept of ``new`` was cancelled while its claimed insert was under way, and the insert's future with it.
        The same insert is queued again behind it, unawaited: when the first one committed, this one is its
        duplicate and names the message, which is then queued here as the accept would have (a message claimed for
        this node and queued nowhere would wait for the processing lease)."""
        again = self._pipeline.insert_claimed(new)
        again.add_done_callback(self._orphan_stored)

    def _orphan_stored(self, done: asyncio.Future[tuple[StoredMessage, bool]]) -> None:
        error = None if done.cancelled() else done.exception()
        if error is not None:
            self._queue.release(unused=True)
            if not self.store.outage.failed(error, "storing an inbound message"):
                log.warning("message of a cancelled accept not queued: %s: %s", type(error).__name__, error)
            return
        message, duplicate = done.result()
        if duplicate and not (message.state is MessageState.PROCESSING and message.node_id == self.node_id
                              and message.version == 1 and message.id not in self._queue.ids):
            self._queue.release(unused=True)  # stored before by another accept, or processed already
            return
        self.stats.accepted += 1  # stored by this node's accept (the cancelled one, or this insert)
        if self._transition_listeners:
            self._pipeline.notify(None, stored_new(message))
        self._queued_claimed(message)

    # -- operator actions -----------------------------------------------------------------------
    async def cancel(self, message_id: int, cause: str = "engine", *, reason: str | None = None) -> StoredMessage:
        """Cancel a message that is NEW, PARTLY_FAILED, POSTPONED or waiting for children (-> CANCEL).

        ``cause`` says who asked (e.g. ``admin:<user>``); the message keeps error code ``CANCELLED`` and
        ``reason`` (default "cancelled") as its last error text. Stats, transition listeners and the
        final-state hooks hear of it as of any other outcome.

        Raises :class:`LookupError` for an unknown id, :class:`IllegalTransitionError` from any other state,
        :class:`StaleMessageError` if it changed meanwhile. The final-state hooks run as for any final state.
        """
        return await self._change_by_operator(message_id, "cancel", lambda _now: outcomes.cancelled(reason),
                                              cause)

    async def restart(self, message_id: int, cause: str = "engine") -> StoredMessage:
        """Give a FAILED or CANCEL message a new chance: PARTLY_FAILED, due now, failed count reset to 0 and
        business errors cleared (a new attempt history; the transition rows keep the old one). Its next final state
        is confirmed again, with the new outcome.

        ``cause`` is recorded with the transition (e.g. ``admin:<user>``).

        Raises :class:`LookupError`, :class:`IllegalTransitionError` (not FAILED/CANCEL) or
        :class:`StaleMessageError`.
        The message is emitted at once when this node runs, else the next repoll of any node takes it.
        """
        updated = await self._change_by_operator(message_id, "restart", outcomes.restarted, cause)
        if self._running and not self._stopping and not self._queue.emit(updated):
            self._feeder.wanted()
        return updated

    async def _change_by_operator(
        self, message_id: int, trigger: str, decide: Callable[[datetime], outcomes.Decision], cause: str
    ) -> StoredMessage:
        """Move ``message_id`` by the operator's ``trigger`` (``restart``, ``cancel``) with the decision
        ``decide(now)``: LookupError, IllegalTransitionError or StaleMessageError when it cannot."""
        message = await self._reads.run(lambda: self.store.get(message_id))
        if message is None:
            raise LookupError(f"no message {message_id}")
        states.check_trigger(trigger, message.state)
        now = self.clock.now()
        updated = await self._pipeline.apply(message, decide(now), now, cause)
        if updated is None:
            raise StaleMessageError(message.id, message.version)
        return updated

    async def set_node_state(self, node_id: str, state: NodeState) -> None:
        """Give ``node_id`` (this node or another) the ``state``: HANDLES_EXISTING_MESSAGES drains it (new
        messages refused, stored ones still processed), STOPPED also stops it picking up work, RUN resumes.

        This node obeys at once; another node at its next heartbeat. Raises :class:`LookupError` for an unknown
        node, :class:`ValueError` for an unknown state.
        """
        state = NodeState(state)
        if not await self._reads.run(lambda: self.store.nodes.set_state(node_id, state)):
            raise LookupError(f"no node {node_id!r}")
        if node_id == self.node_id:
            self._queue.node_state = state
        log.info("node %s is now %s", node_id, state.value)

    # -- the processing channel -----------------------------------------------------------------------------
    def _consume(self, message: StoredMessage) -> Coroutine[Any, Any, None] | None:
        """The incoming function of the processing channel (never raises: every outcome is in the store): None when
        the message is done with here, else the coroutine of the rest (``ProcessingQueue.start``). A message claimed
        before it was queued whose attempt ends at once (``attempt.py``) costs no coroutine.

        The worker is free as soon as the attempt's outcome is handed to the writer: the commit and the final-state
        hooks complete in the background while the worker takes its next message, so one commit carries the
        outcomes of some messages with the claims of the next ones (each message costs a worker one commit's wait
        instead of two). Until its outcome is committed the message keeps its room in the queue bound, and
        :meth:`wait_idle` and :meth:`stop` wait for it (``CommitPipeline.apply_in_background``).
        """
        started: Awaitable[Processed] | InBackground | None = None
        try:
            if not self._stopping:
                taken = self._queue.claimed.pop(message.id, None)  # claimed before it was queued: no claim here
                # the snapshot's parts by position: a call with *args and a keyword builds a tuple and a dict
                started = (self._process(message, background=True) if taken is None
                           else self._run_claimed(taken[0], taken[1], True))
        except Exception as error:
            self._not_processed(message, error)
        finally:
            if started is None:
                self._queue.done_with(message.id)
        if started is None or started is IN_BACKGROUND:  # `is`, not isinstance: mypy does not narrow by it
            return None
        return self._consumed(message, started)  # type: ignore[arg-type]

    async def _consumed(self, message: StoredMessage, started: Awaitable[Processed]) -> None:
        """The rest of :meth:`_consume` once the attempt waits."""
        in_background = False
        try:
            in_background = await started is IN_BACKGROUND
        except Exception as error:
            self._not_processed(message, error)
        finally:
            if not in_background:
                self._queue.done_with(message.id)

    def _not_processed(self, message: StoredMessage, error: Exception) -> None:
        if self.store.outage.failed(error, "processing"):
            log.debug("message %s left for repoll: the store is unreachable", message.id)
        else:
            repeated_errors.log(log, "processing message %s failed outside the route", message.id, error=error)

    # -- processing -----------------------------------------------------------------------------
    async def _process(
        self, message: StoredMessage, *, background: bool = False
    ) -> Processed:
        """Claim ``message``, run its route and store the outcome; None if another writer had it.

        With ``background`` an outcome that needs nothing more of this call (any but WAITING_FOR_CHILDREN) is handed
        to the writer and ``IN_BACKGROUND`` returned at once (see :meth:`_consume`).
        """
        taken = self._queue.claimed.pop(message.id, None)  # claimed for this node by the feeder or a funnel's release
        if taken is None:
            if self._stopping:
                return None
            try:
                claimed = await self._pipeline.claim(message)
            except IllegalTransitionError:
                log.debug("message %s in %s is not claimable", message.id, message.state)
                return None
            # None: another writer had it, or the feeder claimed it for this node meanwhile
            taken = (message.state, claimed) if claimed is not None else self._queue.claimed.pop(message.id, None)
            if taken is None:
                self.stats.lost_claims += 1
                # another writer had it, or (PostgreSQL) its row was locked for a moment (SKIP LOCKED): if it is still
                # waiting, the feeder takes it from the store rather than the minute's repoll of unclaimed messages
                if message.state is MessageState.NEW:
                    self._feeder.accepted_unqueued()
                else:
                    self._feeder.wanted()
                return None
        return await to_end(self._run_claimed, *taken, background)

    def _run_claimed(self, previous: MessageState, claimed: StoredMessage,
                     background: bool) -> Awaitable[Processed] | InBackground:
        """The attempt of ``claimed`` (claimed for this node from ``previous``), begun (``Attempts.begin``); the
        snapshot, to await, when its funnel is held (it waits in the funnel's queue)."""
        if claimed.state is not _PROCESSING:
            self._pipeline.waited(previous, claimed)
            return _at_once(claimed)
        self.stats.claimed += 1
        if self._transition_listeners:
            self._pipeline.notify(previous, claimed)
        if tracing.ENABLED:  # the whole attempt in its span
            return tracing.traced_attempt(claimed, self.node_id, to_end(self._attempts.begin, claimed, background))
        return self._attempts.begin(claimed, background)

    async def _run_children(self, parent: StoredMessage) -> None:
        """First attempt of a split: process the parent's NEW children one after the other, in order."""
        for child in await self._reads.run(lambda: self.store.children_of(parent.id)):
            if child.state is MessageState.NEW and not self._stopping:
                await self._process(child)
        # children already final before the parent waited (a split run again) complete it here
        await self._pipeline.complete_parent(parent.id)

    # -- repoll ---------------------------------------------------------------------------------
    async def repoll_once(self, new_cutoff: datetime | None = None) -> None:
        """One run of the repoll job.

        Repairs PROCESSING messages past the lease (-> PARTLY_FAILED, or FAILED when that exhausts the retry policy),
        then queues due PARTLY_FAILED / POSTPONED messages and NEW ones received before ``now - new_pickup_age`` (or
        ``new_cutoff``), as far as the queue has room (the rest waits for the next run).
        """
        await self._repoll.run_once(new_cutoff, feed=self._running)
