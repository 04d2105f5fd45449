"""The engine of one node: accept, queue, claim, process, outcome; it assembles the parts of ``openroute.engine``.

The parts: ``accept.py`` (the checks before storing), ``delivery.py`` (the steps and interceptor chains of an
attempt), ``writes.py`` (what the writer does in a transaction: claims, outcomes, funnels, parents), ``repoll.py``
(the repoll and heartbeat jobs), ``settings.py`` (``EngineSettings``, ``EngineStats``).

Database work runs off the event loop: writes of the hot path (insert, claim, outcome) through a
:class:`~openroute.engine._writer.GroupCommitWriter` (one thread, many operations per commit), reads and
the exchange's external-call bookkeeping on a small thread pool. See docs/lifecycle.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import dataclasses
import functools
import logging
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from typing import Any, TypeVar

from openroute import states, tracing
from openroute.clock import Clock, SystemClock
from openroute.engine import outcome as outcomes
from openroute.engine._funnel_wake import FunnelWake
from openroute.engine._writer import GroupCommitWriter, Grouped
from openroute.engine.accept import AcceptResult, check_inbound
from openroute.engine.committed import AfterCommit, FinalStateHook, TransitionListener
from openroute.engine.delivery import deliver
from openroute.engine.exchange import AttemptRuntime, CallGuard, Exchange
from openroute.engine.hold_back import HoldBack
from openroute.engine.repoll import Repoll
from openroute.engine.settings import EngineSettings, EngineStats
from openroute.engine.writes import EngineWrites, FinalStateTxHook
from openroute.errors import (
    ConfigurationError,
    IllegalTransitionError,
    MessageDroppedByInterceptor,
    NodeNotAcceptingError,
    StaleMessageError,
    StoreUnavailableError,
    UnknownRouteError,
    ValidationError,
)
from openroute.interceptors import MessageInterceptor, check_interceptors
from openroute.logs import repeated_errors
from openroute.message import InboundMessage
from openroute.messaging import Emitter, Message, MessagingApp, OnOverflow
from openroute.persistence import InsertOutcome, MessageState, MessageStore, NewMessage, NodeState, StoredMessage
from openroute.route import Route, RouteRegistry

__all__ = ["PROCESSING_CHANNEL", "Engine"]

log = logging.getLogger("openroute.engine")

T = TypeVar("T")

#: the in-process channel between accept / repoll (emitter) and the workers (incoming, concurrency=N)
PROCESSING_CHANNEL = "processing"


class Engine:
    """One node of the message lifecycle.

    ``store`` is a :class:`~persistence.MessageStore` or a database URL (the schema must exist: run
    ``openroute db upgrade`` or ``MessageStore.create_schema()``). ``final_state_hooks`` are awaited once
    per message after the commit that made it final (OK, FAILED, SKIPPED, CANCEL); ``final_state_tx_hooks``
    run inside that very transaction (e.g. to insert the confirmation row), so they commit or fail with it.
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
        self.final_state_hooks: list[FinalStateHook] = []
        self.final_state_tx_hooks: list[FinalStateTxHook] = []
        #: called on the event loop after every committed state change of this node (tracing, demos, metrics)
        self.transition_listeners: list[TransitionListener] = []
        self.stats = EngineStats()
        #: what an operator lets this node do (read at start and with every heartbeat; see set_node_state)
        self.node_state = NodeState.RUN
        self._queued: set[int] = set()
        # what the writer does in a transaction (claims, outcomes, funnels, parents), and what it leaves for the loop
        self._writes = EngineWrites(self.store, routes, self.clock, self.node_id, self.final_state_tx_hooks,
                                    self._queued, lambda message, conn: self._funnel_wake.released_in(message, conn))
        self._writer = GroupCommitWriter(self.store.engine, settings.write_batch,
                                         name=f"openroute-writer-{self.node_id}")
        self._insert_group: Grouped[NewMessage, InsertOutcome] = Grouped(
            lambda connection, batch: list(self.store.insert_messages(batch, connection, node_id=self.node_id)),
            "insert")
        self._claim_group = Grouped(self._writes.claim_many, "claim")
        self._finish_group = Grouped(self._writes.finish_many, "finish")
        self._executor = ThreadPoolExecutor(settings.db_threads, thread_name_prefix=f"openroute-db-{self.node_id}")
        # what every exchange may ask of this engine: the same for all of them, so built once
        #: breaker and records of calls to declared external systems (``ext_call(..., system=...)``)
        self.external_calls = external_calls
        self._runtime = AttemptRuntime(
            self.store, self.clock, self.routes, settings.processing_lease, self._run_db, self.node_id, external_calls
        )
        # wakes the next message of a funnel when its holder ends (in-process; other nodes by NOTIFY on PostgreSQL)
        self._funnel_wake = FunnelWake(self.store, self.node_id, self._run_db, lambda m: self._emit(m, wait=False),
                                       claim=self._writes.claim_woken,
                                       unclaim=lambda message: self._hold_back.unclaim_woken(message))
        self._after_commit = AfterCommit(self.stats, self._writes, self._funnel_wake, self.final_state_hooks,
                                         self.transition_listeners)
        self._hold_back = HoldBack(self.store, self.clock, settings.postpone_interval, self._writes, self._writer,
                                   self._funnel_wake, self._run_db, self._apply)
        self._app: MessagingApp | None = None
        self._emitter: Emitter[StoredMessage] | None = None
        self._permits: asyncio.Semaphore | None = None
        self._writing: set[asyncio.Future[Any]] = set()  # outcomes written in the background (see _consume)
        self._pending = 0
        self._in_flight = 0
        self._idle: asyncio.Event | None = None
        # the scheduled jobs: repoll and heartbeat
        self._repoll = Repoll(
            self.store, routes, self.clock, settings, self.stats, run_db=self._run_db, apply=self._apply,
            emit=lambda message: self._emit(message, wait=False), is_running=lambda: self._running,
            queued=self._queued, node_state=lambda: self.node_state,
            obey=lambda state: setattr(self, "node_state", state),
        )
        self._running = False
        self._stopping = False
        self._closed = False

    # -- lifecycle of the node ------------------------------------------------------------------
    @property
    def running(self) -> bool:
        """True between :meth:`start` and :meth:`stop`."""
        return self._running

    async def start(self) -> None:
        """Register the node, recover its own abandoned messages, pick up work, start workers and repoll."""
        if self._running:
            return
        if self._closed:
            raise RuntimeError("this engine was stopped; an Engine starts once (create a new one)")
        settings = self.settings
        app = MessagingApp({}, environ={})
        # the semaphore is the bound (queued + in flight); the emitter's buffer only has to hold the queued part
        self._permits = asyncio.Semaphore(settings.queue_size + settings.concurrency)
        self._emitter = app.emitter(PROCESSING_CHANNEL, overflow=OnOverflow.BUFFER,
                                    buffer_size=settings.queue_size + settings.concurrency)

        async def process(message):  # type: ignore[no-untyped-def]  # a payload consumer, acked when it returns
            await self._consume(message)

        app.incoming(PROCESSING_CHANNEL, concurrency=settings.concurrency)(process)
        await app.start()
        self._app = app
        self._idle = asyncio.Event()
        self._idle.set()
        self._stopping = False
        now = self.clock.now()
        await self._run_db(lambda: self.store.nodes.register(self.node_id, now))
        stored: NodeState | None = await self._run_db(lambda: self.store.nodes.state_of(self.node_id))
        self.node_state = stored or NodeState.RUN
        self._running = True
        self._funnel_wake.start()
        # this node just started, so nothing it marked PROCESSING can still be running: repair it now
        await self._repoll.repair_stuck(now, node_id=self.node_id, cutoff=None)
        await self.repoll_once(new_cutoff=now)
        self._repoll.start_jobs()

    async def stop(self) -> None:
        """Stop taking work; let messages in flight finish (up to ``stop_timeout``); close the node.

        Queued messages that were not claimed stay NEW / PARTLY_FAILED / POSTPONED in the store and are
        picked up by any node's repoll.
        """
        if not self._running:
            await self._close_resources()
            return
        self._stopping = True
        await self._repoll.stop_jobs(self.settings.stop_timeout)
        assert self._app is not None and self._permits is not None  # noqa: S101  narrows an Optional for mypy: set before this point
        # queued messages reach the consumer, which skips them now (they stay in the store); messages in
        # flight get stop_timeout to finish, then they are cancelled (PROCESSING, repaired later)
        await self._app.stop(timeout=self.settings.stop_timeout)
        if self._writing:  # outcomes handed to the writer by workers that have returned
            await asyncio.wait(set(self._writing), timeout=self.settings.stop_timeout)
        self._app = None
        self._emitter = None
        for _ in range(self.settings.queue_size + self.settings.concurrency):
            self._permits.release()  # wake accepts waiting for room: they see the node stopping
        self._queued.clear()
        self._pending = 0
        if self._idle is not None:
            self._idle.set()
        self._running = False
        await self._funnel_wake.stop()
        with contextlib.suppress(Exception):
            await self._run_db(lambda: self.store.nodes.stopped(self.node_id, self.clock.now()))
        await self._close_resources()

    async def _close_resources(self) -> None:
        self._closed = True
        await asyncio.get_running_loop().run_in_executor(None, self._writer.close)
        self._executor.shutdown(wait=True)
        if self._owns_store:
            self.store.dispose()

    @property
    def queued(self) -> int:
        """Messages emitted to the processing channel and not yet started (at most ``settings.queue_size``)."""
        return self._pending - self._in_flight

    @property
    def in_flight(self) -> int:
        """Messages a worker of this node is processing now (at most ``settings.concurrency``)."""
        return self._in_flight

    async def wait_idle(self, timeout: float) -> None:
        """Wait until nothing is queued or in flight on this node; TimeoutError after ``timeout`` seconds."""
        if self._idle is None:
            return
        await asyncio.wait_for(self._idle.wait(), timeout)

    # -- accept ---------------------------------------------------------------------------------
    def check_inbound(self, inbound: InboundMessage) -> Route:
        """The checks of :meth:`accept` without storing anything; returns the route.

        Raises :class:`UnknownRouteError`, :class:`ValidationError` (:class:`~openroute.body.InvalidBodyError` with
        the field errors for a typed route's body) or :class:`PayloadTooLargeError`.
        """
        return check_inbound(inbound, self.routes, self.settings.max_payload_bytes)

    async def accept(self, inbound: InboundMessage) -> AcceptResult:
        """Validate and store ``inbound`` as NEW, then queue it for processing.

        Returns after the commit. A repeated (source system, correlation id) is answered with
        ``duplicate=True`` and the existing message; nothing is stored twice. Raises
        :class:`UnknownRouteError`, :class:`ValidationError` or :class:`PayloadTooLargeError` (nothing stored),
        :class:`NodeNotAcceptingError` when an operator drained or stopped this node,
        :class:`StoreUnavailableError` while the database cannot be reached (nothing stored; logged once per outage).
        When this node's queue is full the call waits for room: that is the back-pressure on the sender.
        While tracing is on (:mod:`openroute.tracing`) the accept is a span, child of ``inbound.traceparent``, and
        that span's traceparent is stored with the message: the parent of its attempts and confirmation.
        """
        if tracing.ENABLED:
            return await tracing.traced_accept(inbound, lambda traceparent: self._accept(inbound, traceparent))
        return await self._accept(inbound, None)

    async def _accept(self, inbound: InboundMessage, traceparent: str | None) -> AcceptResult:
        if self.node_state is not NodeState.RUN:
            raise NodeNotAcceptingError(self.node_id, self.node_state.value)
        self.check_inbound(inbound)
        new = inbound.to_new_message(self.clock.now(), traceparent=traceparent)
        try:
            outcome = await self._writer.enqueue_grouped(self._insert_group, new)
        except Exception as error:
            if self.store.outage.failed(error, "storing an inbound message"):
                raise StoreUnavailableError(self.settings.store_retry_after) from None
            raise
        self.store.outage.succeeded()
        message = outcome.message
        if outcome.duplicate:
            self.stats.duplicates += 1
        else:
            self.stats.accepted += 1
            self._after_commit.notify(None, message)
            await self._emit(message, wait=True)
        return AcceptResult(message.id, message.correlation_id, outcome.duplicate, message.state)

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
        await self._emit(updated, wait=False)
        return updated

    async def _change_by_operator(
        self, message_id: int, trigger: str, decide: Callable[[datetime], outcomes.Decision], cause: str
    ) -> StoredMessage:
        """Move ``message_id`` by the operator's ``trigger`` (``restart``, ``cancel``) with the decision
        ``decide(now)``: LookupError, IllegalTransitionError or StaleMessageError when it cannot."""
        message = await self._run_db(lambda: self.store.get(message_id))
        if message is None:
            raise LookupError(f"no message {message_id}")
        states.check_trigger(trigger, message.state)
        now = self.clock.now()
        updated = await self._apply(message, decide(now), now, cause)
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
        if not await self._run_db(lambda: self.store.nodes.set_state(node_id, state)):
            raise LookupError(f"no node {node_id!r}")
        if node_id == self.node_id:
            self.node_state = state
        log.info("node %s is now %s", node_id, state.value)

    # -- the processing channel -----------------------------------------------------------------
    async def _emit(self, message: StoredMessage, wait: bool) -> bool:
        """Emit ``message`` to the processing channel; False if not running, already queued, or (``wait``
        False) no room. With ``wait`` the caller waits for room: queued + in flight never exceed
        ``queue_size + concurrency``.
        """
        if not self._running or self._stopping or message.id in self._queued or not self.node_state.picks_up_work:
            return False
        permits = self._permits
        assert permits is not None and self._idle is not None  # noqa: S101  narrows an Optional for mypy: set before this point
        if not wait and permits.locked():
            return False
        self._queued.add(message.id)  # before waiting, so repoll does not emit it a second time meanwhile
        await permits.acquire()
        emitter = self._emitter
        if self._stopping or emitter is None:
            self._queued.discard(message.id)
            permits.release()
            return False
        self._pending += 1
        self._idle.clear()
        try:
            # no ack callback: the room is given back by _done_with, once the outcome is committed
            emitter.send_message(Message(message, nack=functools.partial(self._refused, message.id)))
        except Exception:
            self._done_with(message.id)
            raise
        return True

    def _refused(self, message_id: int, reason: BaseException) -> None:
        """The nack of a queued message: its room is free again (the message stays in the store for repoll)."""
        self._done_with(message_id)
        log.warning("processing channel refused message %s: %r", message_id, reason)

    def _done_with(self, message_id: int) -> None:
        """``message_id`` left this node's pipeline (outcome committed, skipped or refused): its room is free."""
        self._queued.discard(message_id)
        self._pending = max(self._pending - 1, 0)
        if self._permits is not None:
            self._permits.release()
        if self._pending == 0 and self._idle is not None:
            self._idle.set()

    async def _consume(self, message: StoredMessage) -> None:
        """The incoming function of the processing channel (never raises: every outcome is in the store).

        The worker is free as soon as the attempt's outcome is handed to the writer: the commit and the final-state
        hooks complete in the background while the worker takes its next message, so one commit carries the
        outcomes of some messages with the claims of the next ones (each message costs a worker one commit's wait
        instead of two). Until its outcome is committed the message keeps its room in the queue bound, and
        :meth:`wait_idle` and :meth:`stop` wait for it.
        """
        self._in_flight += 1
        written: asyncio.Future[Any] | None = None
        try:
            if not self._stopping:
                result = await self._process(message, background=True)
                if isinstance(result, asyncio.Future):
                    written = result
        except Exception as error:
            self._writes.funnels_taken.pop(message.id, None)  # its claim may have been committed before the failure
            if self.store.outage.failed(error, "processing"):
                log.debug("message %s left for repoll: the store is unreachable", message.id)
            else:
                repeated_errors.log(log, "processing message %s failed outside the route", message.id, error=error)
        finally:
            self._in_flight -= 1
            if written is None:
                self._done_with(message.id)
            else:
                self._writing.add(written)
                written.add_done_callback(functools.partial(self._written, message.id))

    def _written(self, message_id: int, done: asyncio.Future[Any]) -> None:
        """A background outcome write (see :meth:`_consume`) is over."""
        self._writing.discard(done)
        error = None if done.cancelled() else done.exception()
        if error is not None and not self.store.outage.failed(error, "writing an outcome"):
            repeated_errors.log(log, "processing message %s failed outside the route", message_id, error=error)
        self._done_with(message_id)

    # -- processing -----------------------------------------------------------------------------
    async def _process(
        self, message: StoredMessage, *, background: bool = False
    ) -> StoredMessage | asyncio.Future[StoredMessage | None] | None:
        """Claim ``message``, run its route and store the outcome; None if another writer had it.

        With ``background`` an outcome that needs nothing more of this call (any but WAITING_FOR_CHILDREN) is handed
        to the writer and the future of its completion returned at once (see :meth:`_consume`).
        """
        preclaimed = message.id in self._writes.preclaimed
        self._writes.preclaimed.discard(message.id)  # (an id left by a rolled back release transaction goes too)
        if preclaimed and message.state is MessageState.PROCESSING:  # claimed by its funnel's release
            claimed: StoredMessage | None = message
            previous = MessageState.POSTPONED
        else:
            previous = message.state
            try:
                claimed = await self._writer.enqueue_grouped(self._claim_group, message)
            except IllegalTransitionError:
                log.debug("message %s in %s is not claimable", message.id, message.state)
                return None
        if claimed is None:
            self._writes.funnels_taken.pop(message.id, None)  # left by a claim group that was rolled back
            self.stats.lost_claims += 1
            return None
        self.stats.claimed += 1
        self._after_commit.notify(previous, claimed)
        attempt = self._attempt(claimed, background)
        return await (tracing.traced_attempt(claimed, self.node_id, attempt) if tracing.ENABLED else attempt)

    async def _attempt(
        self, claimed: StoredMessage, background: bool
    ) -> StoredMessage | asyncio.Future[StoredMessage | None] | None:
        """The attempt of a claimed message: obsolete check and funnel, the route's steps, the outcome (see
        :meth:`_process`)."""
        try:
            route: Route | None = self.routes.get(claimed.service, claimed.operation)
        except UnknownRouteError:
            route = None
        exchange = Exchange(
            message=claimed,
            payload=claimed.payload,
            headers=dict(claimed.headers),
            custom_data=copy.deepcopy(claimed.custom_data) if claimed.custom_data else {},
            business_errors=list(claimed.business_errors),
            route=route,
            runtime=self._runtime,
        )
        error: BaseException | None = None
        if route is None:
            error = ValidationError(f"no route for {claimed.service}/{claimed.operation} any more")
        else:
            if (route.obsolete_check and claimed.object_id is not None) or claimed.funnel_value is not None:
                held = await self._hold_back.check(claimed, route)
                if held is not None:
                    return held
            try:
                await deliver(route, exchange, self.interceptors)
            except MessageDroppedByInterceptor as dropped:
                return await self._apply(
                    claimed, outcomes.dropped(claimed, dropped.reason, exchange.custom_data), self.clock.now()
                )
            except Exception as caught:
                error = caught
        now = self.clock.now()
        decision = outcomes.after_attempt(
            claimed, error, custom_data=exchange.custom_data, business_errors=exchange.business_errors,
            no_effect=exchange.no_effect, postponed_for=exchange.postponed_for, has_children=bool(exchange.children),
            policy=self.settings.retry_policy_for(route), postpone_interval=self.settings.postpone_interval, now=now,
            error_policies=route.error_policies if route is not None else ())
        if tracing.ENABLED:
            tracing.attempt_ended(decision.target.value, decision.changes.get("last_error_code"), error)
        if background and decision.target is not MessageState.WAITING_FOR_CHILDREN:
            return asyncio.ensure_future(
                self._after_commit.written(claimed, decision.target, self._write(claimed, decision, now))
            )
        finished = await self._apply(claimed, decision, now)
        if finished is not None and finished.state is MessageState.WAITING_FOR_CHILDREN:
            await self._run_children(finished)
        return finished

    async def _run_children(self, parent: StoredMessage) -> None:
        """First attempt of a split: process the parent's NEW children one after the other, in order."""
        for child in await self._run_db(lambda: self.store.children_of(parent.id)):
            if child.state is MessageState.NEW and not self._stopping:
                await self._process(child)
        # children already final before the parent waited (a split run again) complete it here
        now = self.clock.now()
        completed = await self._writer.submit(lambda c: self._writes.complete_parent(parent.id, now, c))
        if completed is not None:
            await self._after_commit.parent_completed(completed)

    async def _apply(
        self, message: StoredMessage, decision: outcomes.Decision, now: datetime, cause: str = "engine"
    ) -> StoredMessage | None:
        """Write ``decision`` (see :mod:`openroute.engine.outcome`) with its transition row's ``cause``; None if
        another writer changed the message first."""
        return await self._after_commit.written(message, decision.target, self._write(message, decision, now, cause))

    def _write(
        self, message: StoredMessage, decision: outcomes.Decision, now: datetime, cause: str = "engine"
    ) -> asyncio.Future[StoredMessage]:
        """Hand ``decision`` to the writer; the future of the new snapshot, settled after its commit."""
        return self._writer.enqueue_grouped(
            self._finish_group, (message, decision.target, now, dict(decision.changes), cause)
        )

    # -- repoll ---------------------------------------------------------------------------------
    async def repoll_once(self, new_cutoff: datetime | None = None) -> None:
        """One run of the repoll job.

        Repairs PROCESSING messages past the lease (-> PARTLY_FAILED, or FAILED when that exhausts the retry policy),
        then queues due PARTLY_FAILED / POSTPONED messages and NEW ones received before ``now - new_pickup_age`` (or
        ``new_cutoff``), as far as the queue has room (the rest waits for the next run).
        """
        await self._repoll.run_once(new_cutoff)

    # -- helpers --------------------------------------------------------------------------------
    async def _run_db(self, work: Callable[[], T]) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._executor, work)

