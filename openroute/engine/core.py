"""The engine of one node: accept, queue, claim, process, outcome, repoll.

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
import inspect
import logging
import os
import socket
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, TypeVar

import sqlalchemy as sa

from openroute import states
from openroute.clock import Clock, SystemClock
from openroute.engine import outcome as outcomes
from openroute.engine._funnel_wake import FunnelWake
from openroute.engine._writer import Failure, GroupCommitWriter, Grouped
from openroute.engine.exchange import AttemptRuntime, CallGuard, Exchange
from openroute.errors import (
    BusinessError,
    ConfigurationError,
    IllegalTransitionError,
    MessageDroppedByInterceptor,
    NodeNotAcceptingError,
    PayloadTooLargeError,
    StaleMessageError,
    StoreUnavailableError,
    UnknownRouteError,
    ValidationError,
)
from openroute.interceptors import InterceptionContext, MessageInterceptor, check_interceptors, run_chain
from openroute.message import InboundMessage
from openroute.messaging import Emitter, Message, MessagingApp, OnOverflow
from openroute.persistence import InsertOutcome, MessageState, MessageStore, NewMessage, NodeState, StoredMessage
from openroute.retry import DEFAULT_RETRY_POLICY, RetryPolicy
from openroute.route import Route, RouteRegistry

log = logging.getLogger("openroute.engine")

T = TypeVar("T")
FinalStateHook = Callable[[StoredMessage], Awaitable[None]]
FinalStateTxHook = Callable[[StoredMessage, sa.Connection], None]
#: ``listener(previous_state, message)`` after a committed change (previous None: just accepted)
TransitionListener = Callable[["MessageState | None", StoredMessage], None]

#: the in-process channel between accept / repoll (emitter) and the workers (incoming, concurrency=N)
PROCESSING_CHANNEL = "processing"


@dataclass(frozen=True)
class AcceptResult:
    """The answer to an accept: the stored message (or the one it duplicates) and its current state."""

    message_id: int
    correlation_id: str
    duplicate: bool
    state: MessageState


def default_node_id() -> str:
    """``host-pid``: unique per process on a host."""
    return f"{socket.gethostname()}-{os.getpid()}"


@dataclass(frozen=True)
class EngineSettings:
    """Configuration of one engine node (all intervals are configuration, none is hard-coded)."""

    node_id: str = field(default_factory=default_node_id)
    #: messages whose route runs at the same time on this node (workers). A worker is a coroutine, and it holds its
    #: slot from the claim's group commit until its outcome is handed to the writer: with 32, short routes left the
    #: node waiting on commits a third full (docs/performance.md); lower it to spare a fragile external system
    concurrency: int = 64
    #: messages queued on this node beyond the workers' ones; the bound ``queue_size + concurrency`` counts a message
    #: from its emission until its outcome is committed and its final-state hooks ran; at the bound accept waits
    #: (back-pressure)
    queue_size: int = 256
    #: UTF-8 size limit of a payload at accept
    max_payload_bytes: int = 1024 * 1024
    #: used by routes that have no retry policy of their own
    default_retry_policy: RetryPolicy = DEFAULT_RETRY_POLICY
    #: how often the repoll job runs; None: no scheduler (call :meth:`Engine.repoll_once` yourself)
    repoll_interval: timedelta | None = timedelta(seconds=10)
    #: a message PROCESSING for longer than this is considered abandoned by a dead node and repaired
    processing_lease: timedelta = timedelta(minutes=5)
    #: a NEW message older than this is picked up by repoll (its node died between commit and emit)
    new_pickup_age: timedelta = timedelta(minutes=1)
    #: wait before retrying a POSTPONED message when the route did not give a delay
    postpone_interval: timedelta = timedelta(seconds=30)
    #: at most this many messages are picked up per repoll query
    repoll_batch: int = 1000
    #: at most this many writes share one commit
    write_batch: int = 256
    #: threads for reads and external-call records
    db_threads: int = 4
    #: how long stop() waits for messages in flight before cancelling them (they are then repaired)
    stop_timeout: float = 30.0
    #: how often the node refreshes its heartbeat row
    heartbeat_interval: timedelta = timedelta(seconds=30)
    #: seconds a sender is told to wait (``Retry-After``) while the database is unreachable
    store_retry_after: int = 5

    def __post_init__(self) -> None:
        for name in ("concurrency", "queue_size", "max_payload_bytes", "repoll_batch", "write_batch", "db_threads",
                     "store_retry_after"):
            if getattr(self, name) < 1:
                raise ConfigurationError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("processing_lease", "new_pickup_age", "postpone_interval", "heartbeat_interval"):
            if getattr(self, name) < timedelta(0):
                raise ConfigurationError(f"{name} must not be negative, got {getattr(self, name)}")
        if self.repoll_interval is not None and self.repoll_interval <= timedelta(0):
            raise ConfigurationError(f"repoll_interval must be positive or None, got {self.repoll_interval}")
        if not self.node_id or len(self.node_id) > 100:
            raise ConfigurationError(f"node_id must be 1-100 characters, got {self.node_id!r}")
        if not isinstance(self.default_retry_policy, RetryPolicy):
            raise ConfigurationError("default_retry_policy must be a RetryPolicy")
        if self.stop_timeout < 0:
            raise ConfigurationError(f"stop_timeout must not be negative, got {self.stop_timeout}")


@dataclass
class EngineStats:
    """Counters of one node since it was created."""

    accepted: int = 0
    duplicates: int = 0
    claimed: int = 0
    lost_claims: int = 0
    stale_writes: int = 0
    repaired: int = 0
    reemitted: int = 0
    outcomes: Counter[MessageState] = field(default_factory=Counter)


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
        # parent messages a child's final transition completed, by child id (set in the writer thread)
        self._completed_parents: dict[int, StoredMessage] = {}
        # the holder of the funnel each claimed funnel message met in its claim's transaction (None: it took it)
        self._funnels_taken: dict[int, int | None] = {}
        self._writer = GroupCommitWriter(
            self.store.engine, settings.write_batch, name=f"openroute-writer-{self.node_id}"
        )
        self._insert_group: Grouped[NewMessage, InsertOutcome] = Grouped(
            lambda connection, batch: list(self.store.insert_messages(batch, connection, node_id=self.node_id)),
            "insert",
        )
        self._claim_group: Grouped[StoredMessage, StoredMessage | None] = Grouped(self._claim_many, "claim")
        self._finish_group: Grouped[states.TransitionRequest, StoredMessage] = Grouped(self._finish_many, "finish")
        self._executor = ThreadPoolExecutor(settings.db_threads, thread_name_prefix=f"openroute-db-{self.node_id}")
        # what every exchange may ask of this engine: the same for all of them, so built once
        #: breaker and records of calls to declared external systems (``ext_call(..., system=...)``)
        self.external_calls = external_calls
        self._runtime = AttemptRuntime(
            self.store, self.clock, self.routes, settings.processing_lease, self._run_db, self.node_id, external_calls
        )
        # wakes the next message of a funnel when its holder ends (in-process; other nodes by NOTIFY on PostgreSQL)
        self._funnel_wake = FunnelWake(self.store, self.node_id, self._run_db, lambda m: self._emit(m, wait=False),
                                       claim=self._claim_woken, unclaim=self._unclaim_woken)
        # funnel messages claimed in their funnel's release transaction, not yet taken by a worker
        self._preclaimed: set[int] = set()
        self._app: MessagingApp | None = None
        self._emitter: Emitter[StoredMessage] | None = None
        self._permits: asyncio.Semaphore | None = None
        self._queued: set[int] = set()
        self._writing: set[asyncio.Future[Any]] = set()  # outcomes written in the background (see _consume)
        self._pending = 0
        self._in_flight = 0
        self._idle: asyncio.Event | None = None
        self._scheduler: Any = None
        self._outages_recovered = 0  # store outages whose stranded PROCESSING messages were repaired
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
        await self._repair_stuck(now, node_id=self.node_id, cutoff=None)
        await self.repoll_once(new_cutoff=now)
        if self.settings.repoll_interval is not None:
            from apscheduler.schedulers.asyncio import AsyncIOScheduler

            self._scheduler = AsyncIOScheduler()
            self._scheduler.add_job(
                self._repoll_job, "interval", seconds=self.settings.repoll_interval.total_seconds(),
                max_instances=1, coalesce=True, id="repoll",
            )
            self._scheduler.add_job(
                self._heartbeat_job, "interval", seconds=max(self.settings.heartbeat_interval.total_seconds(), 1.0),
                max_instances=1, coalesce=True, id="heartbeat",
            )
            self._scheduler.start()

    async def stop(self) -> None:
        """Stop taking work; let messages in flight finish (up to ``stop_timeout``); close the node.

        Queued messages that were not claimed stay NEW / PARTLY_FAILED / POSTPONED in the store and are
        picked up by any node's repoll.
        """
        if not self._running:
            await self._close_resources()
            return
        self._stopping = True
        if self._scheduler is not None:
            self._scheduler.shutdown(wait=False)
            self._scheduler = None
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
        if not isinstance(inbound, InboundMessage):
            raise ValidationError(f"expected an InboundMessage, got {type(inbound).__name__}")
        _check_text("service", inbound.service, 100)
        _check_text("operation", inbound.operation, 100)
        route = self.routes.get(inbound.service, inbound.operation)
        _check_text("correlation_id", inbound.correlation_id, 255)
        _check_text("source_system", inbound.source_system, 100)
        _check_text("content_type", inbound.content_type, 100)
        for name, limit in _OPTIONAL_TEXTS:
            value = getattr(inbound, name)
            if value is not None:
                _check_text(name, value, limit)
        if not isinstance(inbound.payload, str):
            raise ValidationError(f"payload must be text, got {type(inbound.payload).__name__}")
        limit = self.settings.max_payload_bytes
        # a str of n characters is at most 4n bytes in UTF-8: only encode when it could be too large
        if len(inbound.payload) * 4 > limit:
            size = len(inbound.payload.encode("utf-8", "surrogatepass"))
            if size > limit:
                raise PayloadTooLargeError(size, limit)
        headers = inbound.headers
        if not isinstance(headers, Mapping) or (headers and not all(
            isinstance(k, str) and isinstance(v, str) for k, v in headers.items()
        )):
            raise ValidationError("headers must map strings to strings")
        stamp = inbound.message_timestamp
        if stamp is not None and (not isinstance(stamp, datetime) or stamp.tzinfo is None):
            raise ValidationError(f"message_timestamp must be a timezone-aware datetime, got {stamp!r}")
        if route.validator is not None:
            route.validator(inbound)
        # a typed route: a body its model refuses is not stored (an endpoint hands over the body it bound)
        if route.body is not None and not route.body.bound(inbound.body, inbound.content_type):
            route.body.parse(inbound.payload, inbound.content_type)
        return route

    async def accept(self, inbound: InboundMessage) -> AcceptResult:
        """Validate and store ``inbound`` as NEW, then queue it for processing.

        Returns after the commit. A repeated (source system, correlation id) is answered with
        ``duplicate=True`` and the existing message; nothing is stored twice. Raises
        :class:`UnknownRouteError`, :class:`ValidationError` or :class:`PayloadTooLargeError` (nothing stored),
        :class:`NodeNotAcceptingError` when an operator drained or stopped this node,
        :class:`StoreUnavailableError` while the database cannot be reached (nothing stored; logged once per outage).
        When this node's queue is full the call waits for room: that is the back-pressure on the sender.
        """
        if self.node_state is not NodeState.RUN:
            raise NodeNotAcceptingError(self.node_id, self.node_state.value)
        self.check_inbound(inbound)
        new = inbound.to_new_message(self.clock.now())
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
            self._notify(None, message)
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
        message = await self._run_db(lambda: self.store.get(message_id))
        if message is None:
            raise LookupError(f"no message {message_id}")
        states.check_transition(message.state, MessageState.CANCEL)
        updated = await self._apply(message, outcomes.cancelled(reason), self.clock.now(), cause)
        if updated is None:
            raise StaleMessageError(message.id, message.version)
        return updated

    async def restart(self, message_id: int, cause: str = "engine") -> StoredMessage:
        """Give a FAILED or CANCEL message a new chance: PARTLY_FAILED, due now, failed count reset to 0 and
        business errors cleared (a new attempt history; the transition rows keep the old one). Its next final state
        is confirmed again, with the new outcome.

        ``cause`` is recorded with the transition (e.g. ``admin:<user>``).

        Raises :class:`LookupError`, :class:`IllegalTransitionError` (not FAILED/CANCEL) or
        :class:`StaleMessageError`.
        The message is emitted at once when this node runs, else the next repoll of any node takes it.
        """
        message = await self._run_db(lambda: self.store.get(message_id))
        if message is None:
            raise LookupError(f"no message {message_id}")
        states.check_transition(message.state, MessageState.PARTLY_FAILED)
        now = self.clock.now()
        updated = await self._apply(message, outcomes.restarted(now), now, cause)
        if updated is None:
            raise StaleMessageError(message.id, message.version)
        await self._emit(updated, wait=False)
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
        if not self._running or self._stopping or message.id in self._queued or self.node_state is NodeState.STOPPED:
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
            self._funnels_taken.pop(message.id, None)  # its claim may have been committed before the failure
            if self.store.outage.failed(error, "processing"):
                log.debug("message %s left for repoll: the store is unreachable", message.id)
            else:
                log.exception("processing message %s failed outside the route", message.id)
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
            log.error("processing message %s failed outside the route", message_id, exc_info=error)
        self._done_with(message_id)

    # -- processing -----------------------------------------------------------------------------
    async def _process(
        self, message: StoredMessage, *, background: bool = False
    ) -> StoredMessage | asyncio.Future[StoredMessage | None] | None:
        """Claim ``message``, run its route and store the outcome; None if another writer had it.

        With ``background`` an outcome that needs nothing more of this call (any but WAITING_FOR_CHILDREN) is handed
        to the writer and the future of its completion returned at once (see :meth:`_consume`).
        """
        preclaimed = message.id in self._preclaimed
        self._preclaimed.discard(message.id)  # (an id left by a release transaction that was rolled back goes too)
        if preclaimed and message.state is MessageState.PROCESSING:  # claimed by its funnel's release (_claim_woken)
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
            self._funnels_taken.pop(message.id, None)  # left by a claim group that was rolled back
            self.stats.lost_claims += 1
            return None
        self.stats.claimed += 1
        self._notify(previous, claimed)
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
                held = await self._hold_back(claimed, route)
                if held is not None:
                    return held
            try:
                await self._deliver(route, exchange)
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
            policy=self._policy(route), postpone_interval=self.settings.postpone_interval, now=now,
        )
        if background and decision.target is not MessageState.WAITING_FOR_CHILDREN:
            return asyncio.ensure_future(
                self._transition_written(claimed, decision.target, self._write(claimed, decision, now))
            )
        finished = await self._apply(claimed, decision, now)
        if finished is not None and finished.state is MessageState.WAITING_FOR_CHILDREN:
            await self._run_children(finished)
        return finished

    async def _hold_back(self, message: StoredMessage, route: Route) -> StoredMessage | None:
        """Obsolete check and funnel, before the steps: the new snapshot if the message does not run now.

        :meth:`_process` calls it only when one of them applies (an obsolete-checking route and an object id, or a
        funnel value): most messages have neither, and a coroutine per message is not free."""
        now = self.clock.now()
        if (route.obsolete_check and message.object_id is not None
                and await self._run_db(lambda: self.store.newer_ok_exists(message))):
            self._funnels_taken.pop(message.id, None)  # SKIPPED frees the funnel it may have taken
            return await self._apply(message, outcomes.obsolete(message), now)
        funnel = message.funnel_value
        if funnel is None:
            return None
        blocker: int | None = None
        if message.id in self._funnels_taken:  # taken in the claim's transaction
            blocker = self._funnels_taken.pop(message.id)
        else:
            if route.guaranteed_order:
                blocker = await self._run_db(lambda: self.store.funnels.older_unfinished(message))
            if blocker is None:
                blocker = await self._writer.submit(lambda c: self.store.funnels.acquire(funnel, message.id, now, c))
        if blocker is None:
            return None
        decision = outcomes.held_by_funnel(funnel, blocker, now, self.settings.postpone_interval)
        held = await self._apply(message, decision, now)
        if held is None:
            return message
        self._funnel_wake.held(held, blocker)
        return held

    async def _deliver(self, route: Route, exchange: Exchange) -> None:
        """Run the route's steps, wrapped by the interceptor chains (engine-wide first, then the route's)."""
        interceptors = (*self.interceptors, *route.interceptors)
        if not interceptors:  # the common case: nothing to wrap, so no chain and no closure per step
            for step in route.steps:
                try:
                    result = step(exchange)
                    if result is not None and inspect.isawaitable(result):
                        result = await result
                    exchange.result = result
                except Exception as caught:
                    _continue_or_raise(caught, route, exchange)
            return

        async def run_steps() -> None:
            for index, step in enumerate(route.steps):
                async def run_one(step: Any = step) -> Any:
                    result = step(exchange)
                    if inspect.isawaitable(result):
                        result = await result
                    return result

                context = InterceptionContext(exchange.message, exchange, route, _step_name(step, index),
                                              exchange.metadata)
                try:
                    exchange.result = await run_chain(interceptors, "around_step", context, run_one)
                except Exception as caught:
                    _continue_or_raise(caught, route, exchange)

        context = InterceptionContext(exchange.message, exchange, route, None, exchange.metadata)
        await run_chain(interceptors, "around_delivery", context, run_steps)

    async def _run_children(self, parent: StoredMessage) -> None:
        """First attempt of a split: process the parent's NEW children one after the other, in order."""
        for child in await self._run_db(lambda: self.store.children_of(parent.id)):
            if child.state is MessageState.NEW and not self._stopping:
                await self._process(child)
        # children already final before the parent waited (a split run again) complete it here
        now = self.clock.now()
        completed = await self._writer.submit(lambda c: self._complete_parent(parent.id, now, c))
        if completed is not None:
            self.stats.outcomes[completed.state] += 1
            self._notify(MessageState.WAITING_FOR_CHILDREN, completed)
            await self._run_final_hooks(completed)

    def _complete_parent(self, parent_id: int, now: datetime, connection: sa.Connection) -> StoredMessage | None:
        """In a child's final transaction: end the waiting parent when its children decide it (row-locked)."""
        parent = self.store.lock_message(parent_id, connection)
        if parent is None or parent.state is not MessageState.WAITING_FOR_CHILDREN:
            return None
        decision = outcomes.parent_outcome(parent, self.store.children_of(parent_id, connection))
        if decision is None:
            return None
        updated = states.transition(self.store, parent, decision.target, now, dict(decision.changes), connection,
                                    node_id=self.node_id)
        for hook in self.final_state_tx_hooks:
            hook(updated, connection)
        return updated

    def _policy(self, route: Route | None) -> RetryPolicy:
        if route is not None and route.retry_policy is not None:
            return route.retry_policy
        return self.settings.default_retry_policy

    async def _apply(
        self, message: StoredMessage, decision: outcomes.Decision, now: datetime, cause: str = "engine"
    ) -> StoredMessage | None:
        """Write ``decision`` (see :mod:`openroute.engine.outcome`) with its transition row's ``cause``; None if
        another writer changed the message first."""
        return await self._transition_written(message, decision.target, self._write(message, decision, now, cause))

    def _write(
        self, message: StoredMessage, decision: outcomes.Decision, now: datetime, cause: str = "engine"
    ) -> asyncio.Future[StoredMessage]:
        """Hand ``decision`` to the writer; the future of the new snapshot, settled after its commit."""
        return self._writer.enqueue_grouped(
            self._finish_group, (message, decision.target, now, dict(decision.changes), cause)
        )

    async def _transition_written(
        self, message: StoredMessage, target: MessageState, written: asyncio.Future[StoredMessage]
    ) -> StoredMessage | None:
        """The rest of a transition once ``written`` (the writer's future of it) is settled: counters, listeners,
        final-state hooks, a parent the change completed."""
        final = states.is_final(target)
        try:
            updated = await written
        except StaleMessageError:
            # a repoll on another node repaired it meanwhile (lease too short for this route?)
            self._completed_parents.pop(message.id, None)  # left by a group that was rolled back
            self._funnel_wake.discard(message.id)
            self.stats.stale_writes += 1
            log.warning("outcome %s of message %s lost: another writer changed it first", target.value, message.id)
            return None
        except BaseException:
            self._completed_parents.pop(message.id, None)
            self._funnel_wake.discard(message.id)
            raise
        self.stats.outcomes[target] += 1
        self._notify(message.state, updated)
        if updated.funnel_value is not None:
            self._funnel_wake.committed(updated)
        parent = self._completed_parents.pop(updated.id, None)
        if final:
            await self._run_final_hooks(updated)
        if parent is not None:
            self.stats.outcomes[parent.state] += 1
            self._notify(MessageState.WAITING_FOR_CHILDREN, parent)
            await self._run_final_hooks(parent)
        return updated

    def _claim_many(self, connection: sa.Connection, batch: list[StoredMessage]) -> list[Any]:
        """Writer thread: claim a group of queued messages with one conditional UPDATE."""
        now = self.clock.now()
        claimable = [m for m in batch if states.is_legal(m.state, MessageState.PROCESSING)]
        won = {m.id: m for m in states.claim(self.store, claimable, self.node_id, now, connection)} if claimable else {}
        if won:
            self._take_funnels(won.values(), now, connection)
        results: list[Any] = []
        for message in batch:
            if not states.is_legal(message.state, MessageState.PROCESSING):
                results.append(Failure(IllegalTransitionError(message.state, MessageState.PROCESSING)))
            else:
                results.append(won.pop(message.id, None))  # a second copy of the same message gets None
        return results

    def _take_funnels(self, claimed: Iterable[StoredMessage], now: datetime, connection: sa.Connection) -> None:
        """Writer thread, in the claim's transaction: take the funnels of the claimed funnel messages (routes without
        guaranteed order), one commit less per message than a transaction of its own; :meth:`_hold_back` reads the
        outcome. In funnel order, so two nodes' claims lock funnel rows in the same order."""
        for message in sorted((m for m in claimed if m.funnel_value is not None),
                              key=lambda m: (m.funnel_value or "", m.id)):
            try:
                route = self.routes.get(message.service, message.operation)
            except UnknownRouteError:
                continue
            if not route.guaranteed_order:
                funnel = message.funnel_value or ""
                self._funnels_taken[message.id] = self.store.funnels.acquire(funnel, message.id, now, connection)

    def _claim_woken(self, waiting: list[StoredMessage], connection: sa.Connection) -> list[StoredMessage]:
        """Writer thread, in the transaction that frees a funnel: claim the messages this node postponed for it and
        take the funnel for them, so a woken message runs right after the commit without a claim and a funnel
        transaction of its own. Messages of guaranteed-order routes are only woken (their order check needs a read)."""
        now = self.clock.now()
        result: list[StoredMessage] = []
        for message in waiting:
            try:
                route = self.routes.get(message.service, message.operation)
            except UnknownRouteError:
                continue
            if route.guaranteed_order or message.id in self._queued:
                result.append(message)
                continue
            won = states.claim(self.store, [message], self.node_id, now, connection)
            if won:
                claimed = won[0]
                self._funnels_taken[claimed.id] = self.store.funnels.acquire(
                    claimed.funnel_value or "", claimed.id, now, connection)
                self._preclaimed.add(claimed.id)
                result.append(claimed)
        return result

    async def _unclaim_woken(self, message: StoredMessage) -> None:
        """A message claimed by its funnel's release could not be queued (no room, stopping): POSTPONED again, due at
        once, for repoll."""
        if message.id not in self._preclaimed:
            return
        self._preclaimed.discard(message.id)
        self._funnels_taken.pop(message.id, None)
        now = self.clock.now()
        decision = outcomes.held_by_funnel(message.funnel_value or "", message.id, now, timedelta(0))
        await self._apply(message, decision, now)

    def _finish_many(self, connection: sa.Connection, batch: list[states.TransitionRequest]) -> list[Any]:
        """Writer thread: write a group of outcomes; final ones run the transaction hooks in the same commit."""
        results: list[Any] = []
        for request, result in zip(batch, states.transition_many(self.store, batch, connection, node_id=self.node_id),
                                   strict=True):
            if isinstance(result, Exception):
                results.append(Failure(result))
                continue
            if result.funnel_value is not None and FunnelWake.releases(request[0].state, result):
                self._funnel_wake.released_in(result, connection)
            if states.is_final(result.state):
                for hook in self.final_state_tx_hooks:
                    hook(result, connection)
                if result.parent_id is not None:
                    parent = self._complete_parent(result.parent_id, result.last_update_ts, connection)
                    if parent is not None:
                        self._completed_parents[result.id] = parent
            results.append(result)
        return results

    def _notify(self, previous: MessageState | None, message: StoredMessage) -> None:
        for listener in self.transition_listeners:
            try:
                listener(previous, message)
            except Exception:
                log.exception("transition listener %r failed for message %s", listener, message.id)

    async def _run_final_hooks(self, message: StoredMessage) -> None:
        for hook in self.final_state_hooks:
            try:
                await hook(message)
            except Exception:
                log.exception("final-state hook %r failed for message %s", hook, message.id)

    # -- repoll ---------------------------------------------------------------------------------
    async def repoll_once(self, new_cutoff: datetime | None = None) -> None:
        """One run of the repoll job.

        Repairs PROCESSING messages past the lease (-> PARTLY_FAILED, or FAILED when that exhausts the
        retry policy), then queues due PARTLY_FAILED / POSTPONED messages and NEW ones received before
        ``now - new_pickup_age`` (or ``new_cutoff``), as far as the queue has room (the rest waits for
        the next run).
        """
        now = self.clock.now()
        repaired, reemitted = self.stats.repaired, self.stats.reemitted
        await self._repair_stuck(now, node_id=None, cutoff=now - self.settings.processing_lease)
        if not self._running:
            return
        batch = self.settings.repoll_batch
        due = await self._run_db(
            lambda: self.store.due([MessageState.PARTLY_FAILED, MessageState.POSTPONED], now, batch)
        )
        cutoff = new_cutoff if new_cutoff is not None else now - self.settings.new_pickup_age
        fresh = await self._run_db(lambda: self.store.received_before(MessageState.NEW, cutoff, batch))
        for message in [*due, *fresh]:
            if await self._emit(message, wait=False):
                self.stats.reemitted += 1
        if self.stats.repaired > repaired or self.stats.reemitted > reemitted:
            log.info("repoll: %d stuck message(s) repaired, %d due or unclaimed message(s) queued",
                     self.stats.repaired - repaired, self.stats.reemitted - reemitted)

    async def _repair_stuck(
        self, now: datetime, node_id: str | None, cutoff: datetime | None, skip: frozenset[int] = frozenset()
    ) -> None:
        limit = self.settings.repoll_batch
        far = cutoff if cutoff is not None else now + timedelta(days=36500)
        stuck = await self._run_db(
            lambda: self.store.started_before(MessageState.PROCESSING, far, limit, node_id=node_id)
        )
        for message in stuck:
            if message.id in skip:
                continue
            try:
                route: Route | None = self.routes.get(message.service, message.operation)
            except UnknownRouteError:
                route = None
            decision = outcomes.abandoned(message, self._policy(route), now)
            if await self._apply(message, decision, now, "repair") is not None:
                self.stats.repaired += 1

    async def _repoll_job(self) -> None:
        try:
            await self._recover_after_outage()
            await self.repoll_once()
        except Exception as error:
            if not self.store.outage.failed(error, "repoll"):
                log.exception("repoll failed")
        else:
            self.store.outage.succeeded()

    async def _recover_after_outage(self) -> None:
        """After an outage: repair this node's PROCESSING messages that are no longer in its pipeline (their outcome
        could not be written), instead of leaving them to the processing lease."""
        outages = self.store.outage.outages
        if outages == self._outages_recovered:
            return
        now = self.clock.now()
        await self._repair_stuck(now, node_id=self.node_id, cutoff=None, skip=frozenset(self._queued))
        self._outages_recovered = outages

    async def _heartbeat_job(self) -> None:
        try:
            state = await self._run_db(lambda: self.store.nodes.heartbeat(self.node_id, self.clock.now()))
            if state is not None and state is not self.node_state:
                log.info("node %s is now %s (set by an operator)", self.node_id, state.value)
                self.node_state = state
        except Exception as error:
            if not self.store.outage.failed(error, "heartbeat"):
                log.exception("heartbeat failed")
        else:
            self.store.outage.succeeded()

    # -- helpers --------------------------------------------------------------------------------
    async def _run_db(self, work: Callable[[], T]) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._executor, work)


#: the optional text fields of an inbound message and their column sizes
_OPTIONAL_TEXTS = (("process_id", 255), ("object_id", 255), ("entity_type", 100), ("funnel_value", 255))


def _check_text(name: str, value: Any, limit: int) -> None:
    if not isinstance(value, str) or not value or value.isspace():
        raise ValidationError(f"{name} must be a non-empty string, got {value!r}")
    if len(value) > limit:
        raise ValidationError(f"{name} is longer than {limit} characters")


def _step_name(step: Any, index: int) -> str:
    return str(getattr(step, "step_name", None) or getattr(step, "__name__", None) or f"step-{index + 1}")


def _continue_or_raise(caught: Exception, route: Route, exchange: Exchange) -> None:
    """A step failed with ``caught``: record a business error the route continues on, raise anything else."""
    if isinstance(caught, MessageDroppedByInterceptor):
        raise caught
    business = _as_business_error(caught, route)
    if business is None:
        raise caught
    if not route.continue_on_business_error:
        raise business from caught
    exchange.business_errors.append(business.to_dict())


def _as_business_error(error: BaseException, route: Route) -> BusinessError | None:
    if isinstance(error, BusinessError):
        return error
    if route.business_exceptions and isinstance(error, route.business_exceptions):
        return BusinessError(type(error).__name__, str(error))
    return None

