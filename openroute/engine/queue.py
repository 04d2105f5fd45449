"""The processing queue of one node: the in-process channel from accept, the feeder and the funnel releases to the
workers, and its bound.

The bound ``queue_size + concurrency`` counts a message from its emission until its outcome is committed (a worker
hands the outcome to the writer and takes its next message meanwhile, :meth:`ProcessingQueue.writing`). Nothing
waits for room: a message that finds none stays in the store (NEW, or due) and the feeder (``feeder.py``) takes it
when room frees, so accepting never waits behind processing. A message claimed for this node before it was queued
(by the feeder, or by a funnel release that handed it the funnel) is queued past the bound, which its claim already
counted; its snapshot waits in :attr:`ProcessingQueue.claimed` for the worker. An accepted message that finds room
is stored claimed for this node in its accept's own transaction and queued claimed: the accept reserves its room
first (:meth:`ProcessingQueue.reserve`), so the bound holds while the commit is under way.

The channel is a queue of messages and ``concurrency`` long-lived workers: tasks started with the queue, each taking
the next message as soon as it is done with one (an idle worker is woken by the message it is to take). A task per
message, and the reactive channel's machinery around it (a ``Message`` envelope, the emitter's buffer and demand,
the consumer's task and its completion callback), cost more of the event loop than the message's own attempt when the
route is short. Each message runs in a fresh copy of the context the queue started in (:class:`_InContext`): context
variables a message's attempt sets (tracing, the current call, a route's own) end with it, as they ended with its task,
and none of an accept's reach a worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
from collections import deque
from collections.abc import Callable, Coroutine, Generator
from typing import Any

from openroute.persistence import MessageState, NodeState, StoredMessage

__all__ = ["PROCESSING_CHANNEL", "LoopPressure", "ProcessingQueue"]

log = logging.getLogger("openroute.engine")

#: the name of the in-process channel between accept / feeder and the workers (its workers' task names start with it)
PROCESSING_CHANNEL = "processing"


class LoopPressure:
    """Whether this node's event loop lags: a timer every ``period`` seconds measures how late it runs. While it is
    late by more than ``threshold`` (the node's CPU is taken), the workers hold back before their next message
    (:meth:`quiet`) and the feeder before its next feed, so that the accepts, which never wait here, keep their share
    of the machine: a backlog, waiting or draining messages take what is left. Free when the loop is not late."""

    def __init__(self, threshold: float = 0.02, period: float = 0.02, longest_wait: float = 1.0) -> None:
        self.threshold = threshold
        self.period = period
        self.longest_wait = longest_wait
        #: the lateness of the last tick (seconds)
        self.lag = 0.0
        #: whether the loop ran the last tick later than ``threshold`` (set by the tick: every worker reads it before
        #: every message)
        self.busy = False
        self._handle: asyncio.TimerHandle | None = None
        self._due = 0.0

    def start(self) -> None:
        """Start ticking on the running loop."""
        loop = asyncio.get_running_loop()
        self._due = loop.time() + self.period
        self._handle = loop.call_at(self._due, self._tick)

    def stop(self) -> None:
        """Stop ticking; the loop counts as not late."""
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        self.lag = 0.0
        self.busy = False

    def _tick(self) -> None:
        loop = asyncio.get_running_loop()
        now = loop.time()
        self.lag = max(now - self._due, 0.0)
        self.busy = self.lag > self.threshold
        self._due = now + self.period
        self._handle = loop.call_at(self._due, self._tick)

    async def quiet(self) -> None:
        """Return once the loop is not late any more, or after ``longest_wait`` (a node busy for other reasons still
        gets its work done)."""
        waited = 0.0
        while self.busy and waited < self.longest_wait:
            await asyncio.sleep(self.period)
            waited += self.period


class ProcessingQueue:
    """The processing channel of one node and its bound (see the module docstring).

    It holds what the node's parts share about the work it takes: the operator's :attr:`node_state`, the ids in the
    pipeline (:attr:`ids`) and the messages claimed for the node before they were queued (:attr:`claimed`).
    """

    def __init__(self, concurrency: int, queue_size: int) -> None:
        self.concurrency = concurrency
        #: queued + in flight never exceed this, but for messages claimed for this node (see the module docstring)
        self.limit = queue_size + concurrency
        self._node_state = NodeState.RUN
        #: whether the node takes new messages (``node_state`` RUN) and picks up work (not STOPPED): read for every
        #: message, so derived once per change of ``node_state``
        self.accepting = True
        self.takes_work = True
        self._room_freed: Callable[[], None] | None = None
        #: the ids in the pipeline (emitted, not yet done)
        self.ids: set[int] = set()
        #: messages claimed for this node before they were queued: id -> (state before the claim, claimed snapshot)
        self.claimed: dict[int, tuple[MessageState, StoredMessage]] = {}
        self._consume: Callable[[StoredMessage], Coroutine[Any, Any, None] | None] | None = None
        self._context: contextvars.Context | None = None  # each message runs in a copy of it (see the module doc)
        self._waiting: deque[StoredMessage] = deque()  # emitted, not yet taken by a worker
        self._sleeping: deque[asyncio.Future[None]] = deque()  # the wake-ups of the idle workers
        self._woken = 0  # workers woken for the waiting messages that have not run yet (see _wake_one)
        self._workers: set[asyncio.Task[None]] = set()
        self._draining = False  # stop(): the workers take what is waiting, then end
        self._writing = 0  # outcomes written in the background (see writing())
        self._written_all = asyncio.Event()  # set while none is
        self._written_all.set()
        self._pending = 0
        self._in_flight = 0
        self._reserved = 0  # room held by accepts storing their message claimed for this node (see reserve())
        self._idle = asyncio.Event()
        self._idle.set()
        self.open = False
        #: the loop's lag, which paces the workers and the feeder (see LoopPressure)
        self.pressure = LoopPressure()

    @property
    def node_state(self) -> NodeState:
        """What an operator lets this node do (read at start and with every heartbeat; ``Engine.set_node_state``)."""
        return self._node_state

    @node_state.setter
    def node_state(self, state: NodeState) -> None:
        self._node_state = state
        self.accepting = state is NodeState.RUN
        self.takes_work = state.picks_up_work

    def when_room_frees(self, listener: Callable[[], None]) -> None:
        """Have ``listener()`` called each time a message leaves the pipeline while the queue is open (the feeder
        listens: it takes the ready messages the store holds as room frees)."""
        self._room_freed = listener

    # -- lifecycle ----------------------------------------------------------------------------------------------
    async def start(self, consume: Callable[[StoredMessage], Coroutine[Any, Any, None] | None]) -> None:
        """Start ``concurrency`` workers, each running ``consume(message)`` for one message after the other: a
        coroutine function, or a function that does the message's work and returns None when it is done, else the
        coroutine of the rest (a message that never waits then costs no coroutine)."""
        self._consume = consume
        self._context = contextvars.copy_context()
        self._draining = False
        loop = asyncio.get_running_loop()
        for number in range(self.concurrency):
            worker = loop.create_task(self._work(), name=f"{PROCESSING_CHANNEL}-worker-{number + 1}")
            self._workers.add(worker)
            worker.add_done_callback(self._workers.discard)
        self._idle.set()
        self.open = True
        self.pressure.start()

    def close(self) -> None:
        """Take no more messages (the workers skip the queued ones: they stay in the store)."""
        self.open = False

    async def stop(self, timeout: float) -> None:
        """Let the workers finish the messages in flight (up to ``timeout``, then they are cancelled) and the outcomes
        being written; forget the rest."""
        self.open = False
        self.pressure.stop()
        workers = set(self._workers)
        if workers:
            # the workers take what is waiting (the engine's consume skips it now: it stays in the store), then end
            self._draining = True
            self._wake_all()
            _done, late = await asyncio.wait(workers, timeout=timeout)
            for worker in late:
                worker.cancel()
            if late:  # their cancellation runs the messages' own clean-up: over before the node closes its writer
                await asyncio.wait(late, timeout=timeout)
        if self._writing:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._written_all.wait(), timeout)
        self._consume = None
        self._waiting.clear()
        self.ids.clear()
        self._pending = 0
        self._idle.set()

    # -- what it holds ------------------------------------------------------------------------------------------
    @property
    def queued(self) -> int:
        """Messages emitted and not yet started."""
        return self._pending - self._in_flight

    @property
    def in_flight(self) -> int:
        """Messages a worker is processing now."""
        return self._in_flight

    @property
    def room(self) -> int:
        """How many more messages the bound lets in now."""
        return max(self.limit - self._pending - self._reserved, 0)

    async def wait_idle(self, timeout: float) -> None:
        """Wait until nothing is queued or in flight; TimeoutError after ``timeout`` seconds."""
        await asyncio.wait_for(self._idle.wait(), timeout)

    # -- in and out -----------------------------------------------------------------------------------------------
    def emit(self, message: StoredMessage) -> bool:
        """Queue ``message`` if the bound has room; False when it has none, the message is queued already, or the node
        takes no work (the message stays in the store)."""
        if self._pending + self._reserved >= self.limit:
            return False
        return self._send(message)

    def reserve(self) -> bool:
        """Hold room in the bound for a message about to be stored claimed for this node (in its accept's
        transaction): True when the bound has room, as :meth:`emit` would queue it; False when it has none or the node
        takes no work (the message is stored NEW and waits for the feeder, as before). The holder ends the
        reservation with :meth:`release`, before it queues the message (:meth:`emit_claimed`) or when it will not."""
        if self._pending + self._reserved >= self.limit or not self.open or not self.takes_work:
            return False
        self._reserved += 1
        return True

    def release(self, unused: bool = False) -> None:
        """End a reservation of :meth:`reserve`; ``unused``: no message takes its room (a duplicate, a failed
        insert), which the feeder may then take."""
        self._reserved -= 1
        if unused and self.open and self._room_freed is not None:
            self._room_freed()

    def emit_claimed(self, previous: MessageState, claimed: StoredMessage, *, reserved: bool = False) -> bool:
        """Queue ``claimed``, claimed for this node from ``previous``; its claim counted it, so the bound does not
        refuse it. A copy already queued (as it was before the claim) takes the claimed snapshot when it starts.
        False when the node takes no work (the caller gives the claim back). ``reserved``: its accept held room for
        it (:meth:`reserve`), which ends here, as :meth:`release` would end it."""
        if reserved:
            self._reserved -= 1
        if not self.open or self._consume is None or not self.takes_work:
            return False
        self.claimed[claimed.id] = (previous, claimed)
        if claimed.id not in self.ids:
            self._enqueue(claimed)
        return True

    def _send(self, message: StoredMessage) -> bool:
        if not self.open or self._consume is None or message.id in self.ids or not self.takes_work:
            return False
        self._enqueue(message)
        return True

    def _enqueue(self, message: StoredMessage) -> None:
        """Queue ``message`` (the node takes work and it is not queued yet) for the next free worker."""
        self.ids.add(message.id)
        self._pending += 1
        if self._pending == 1:  # _idle is set while nothing is pending (a call fewer for most messages)
            self._idle.clear()
        self._waiting.append(message)
        if not self._woken:
            self._wake_one()

    def _wake_one(self) -> None:
        """Wake an idle worker for the waiting messages. One is enough: it takes them one after the other, and when one
        of them suspends (:meth:`_suspended`) the next idle worker is woken for the rest. A burst of accepts settled by
        one commit so costs one wake-up, not one a message."""
        sleeping = self._sleeping
        while sleeping:  # a wake-up whose worker was cancelled is skipped
            wake = sleeping.popleft()
            if not wake.done():
                wake.set_result(None)
                self._woken += 1
                return

    def _suspended(self) -> None:
        """A worker's message waits for something: another worker takes the waiting messages meanwhile."""
        if self._waiting and not self._woken:
            self._wake_one()

    def _wake_all(self) -> None:
        sleeping, self._sleeping = self._sleeping, deque()
        for wake in sleeping:
            if not wake.done():
                wake.set_result(None)
                self._woken += 1

    async def _work(self) -> None:
        """One worker: the waiting messages one after the other, each in a fresh copy of the queue's context; asleep
        while none waits; it ends once :meth:`stop` drains the queue (or cancels it)."""
        waiting, pressure = self._waiting, self.pressure
        loop = asyncio.get_running_loop()
        in_a_row = 0  # messages taken since the worker last gave the loop a turn
        while True:
            if not waiting:
                if self._draining:
                    return
                wake = loop.create_future()
                self._sleeping.append(wake)
                try:
                    await wake
                finally:
                    if wake.done() and not wake.cancelled():
                        self._woken -= 1
                in_a_row = 0
                continue
            if in_a_row >= self.concurrency:
                # a burst that never waits (a backlog of short routes) gives the loop a turn every `concurrency`
                # messages, as a task per message did (one loop iteration ran at most that many): the accepts, whose
                # requests are read between iterations, keep their share
                in_a_row = 0
                await asyncio.sleep(0)
                continue
            in_a_row += 1
            message = waiting.popleft()
            consume, context = self._consume, self._context
            if consume is None or context is None:  # stopped meanwhile
                return
            self._in_flight += 1
            try:
                if pressure.busy:  # the accepts first: this message waits for a quieter loop
                    self._suspended()
                    await pressure.quiet()
                # its first step runs here: a message that never waits (claimed at its accept, a short route, its
                # outcome written in the background) ends in that call, with no coroutine of its own
                run = context.copy().run
                coroutine = run(consume, message)
                if coroutine is None:
                    continue
                try:
                    suspended_on = run(coroutine.send, None)
                except StopIteration:
                    continue
                self._suspended()
                await _InContext(coroutine, run, self._suspended, suspended_on)
            except Exception:  # consume never raises (every outcome is in the store): a bug, the worker goes on
                log.exception("processing message %s failed in the processing channel", message.id)
            finally:
                self._in_flight -= 1

    def writing(self) -> None:
        """An outcome is being written in the background: its message keeps its room until :meth:`written`, and
        :meth:`stop` waits for it."""
        self._writing += 1
        if self._writing == 1:
            self._written_all.clear()

    def written(self, message_id: int) -> None:
        """The background write of ``message_id``'s outcome (see :meth:`writing`) and its follow-up are over: its room
        is free."""
        self._writing -= 1
        if not self._writing:
            self._written_all.set()
        self.done_with(message_id)

    def done_with(self, message_id: int) -> None:
        """``message_id`` left the pipeline (outcome committed, skipped or refused): its room is free."""
        if message_id not in self.ids:
            return
        self.ids.discard(message_id)
        self._pending = max(self._pending - 1, 0)
        if self._pending == 0:
            self._idle.set()
        if self.open and self._room_freed is not None:  # a closed queue takes nothing: no feed while the node stops
            self._room_freed()


class _InContext:
    """``coroutine``, suspended on ``waiting`` after its first step, awaited on by a worker, every further step of it
    run by ``run`` (the ``run`` of a context): what it sets in context variables stays in that context (a worker's
    next message gets a fresh copy), while the worker stays the current task (a step's ``asyncio.timeout`` and cancel
    scopes see the task they run in, and cancelling the worker cancels the message)."""

    __slots__ = ("coroutine", "run", "suspended", "waiting")

    def __init__(self, coroutine: Coroutine[Any, Any, None], run: Callable[..., Any],
                 suspended: Callable[[], None], waiting: Any) -> None:
        self.coroutine = coroutine
        self.run = run
        #: called each time the coroutine waits (the queue wakes another worker for the waiting messages)
        self.suspended = suspended
        self.waiting = waiting

    def __await__(self) -> Generator[Any, Any, None]:
        coroutine, run, suspended, waiting = self.coroutine, self.run, self.suspended, self.waiting
        while True:
            sent: Any = None
            thrown: BaseException | None = None
            try:
                sent = yield waiting
            except GeneratorExit:
                run(coroutine.close)
                raise
            except BaseException as error:  # the worker's cancellation: the message's to handle
                thrown = error
            try:
                waiting = run(coroutine.send, sent) if thrown is None else run(coroutine.throw, thrown)
            except StopIteration:
                return
            suspended()
