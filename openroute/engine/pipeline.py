"""The commit pipeline of one node: every state change it writes goes through the group commit, and what follows each
commit runs on the event loop.

The writer thread (``_writer.py``, :class:`~openroute.engine._writer.GroupCommitWriter`) joins the operations of many
coroutines in one transaction; what they do there is ``writes.py`` (:class:`~openroute.engine.writes.EngineWrites`:
inserts, claims, outcomes, funnels, parents, call records). Once the commit is known, :class:`CommitPipeline` counts
the change (:attr:`CommitPipeline.stats`), tells the transition listeners, awaits the final-state hooks, completes
the parent a child's final change ended, and queues on this node the message a funnel's release handed the funnel to.
The pipeline owns the node's counters; the engine, the feeder, the repoll and the obsolete check write through it.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import logging
from collections.abc import Awaitable, Callable, Coroutine, Generator, Iterator
from datetime import datetime
from types import CoroutineType
from typing import Any, Generic, TypeVar

import sqlalchemy as sa

from openroute.definitions.clock import Clock
from openroute.definitions.errors import StaleMessageError
from openroute.engine import outcome as outcomes
from openroute.engine import states
from openroute.engine._writer import GroupCommitWriter, Grouped
from openroute.engine.funnel import FunnelQueue
from openroute.engine.queue import ProcessingQueue
from openroute.engine.settings import EngineSettings, EngineStats
from openroute.engine.writes import EngineWrites, FinalStatesTxHook
from openroute.persistence import (
    FINAL_STATES,
    CallEnd,
    CallStart,
    ExternalCall,
    FunnelShare,
    MessageState,
    MessageStore,
    NewMessage,
    StoredMessage,
)
from openroute.persistence.call_records import CallRecord, CallRecordStore
from openroute.runtime.logs import repeated_errors

__all__ = ["CommitPipeline", "FinalStateHook", "TransitionListener"]

log = logging.getLogger("openroute.engine")

T = TypeVar("T")

FinalStateHook = Callable[[StoredMessage], Awaitable[None]]
#: ``listener(previous_state, message)`` after a committed change (previous None: just accepted)
TransitionListener = Callable[["MessageState | None", StoredMessage], None]


class CommitPipeline:
    """The writes of one node and what follows their commits (see the module docstring).

    ``queue`` takes the messages a funnel's release claimed for this node; ``final_state_hooks``,
    ``final_state_tx_hooks`` and ``transition_listeners`` are the engine's own lists (read at each change, so hooks
    added later are heard).
    """

    def __init__(self, store: MessageStore, clock: Clock, settings: EngineSettings, queue: ProcessingQueue,
                 funnel: FunnelQueue, final_state_hooks: list[FinalStateHook],
                 final_state_tx_hooks: list[FinalStatesTxHook], transition_listeners: list[TransitionListener]) -> None:
        self.store = store
        self._closed = False  # see aclose()
        self.clock = clock
        #: the counters of this node (read as ``Engine.stats``)
        self.stats = EngineStats()
        self.queue = queue
        self.funnel = funnel
        self.final_state_hooks = final_state_hooks
        self.transition_listeners = transition_listeners
        #: the group-commit writer (its thread starts with the first write)
        self.writer = GroupCommitWriter(store.engine, settings.write_batch, name=f"openroute-writer-{settings.node_id}")
        #: what the writer does in a transaction
        self.writes = EngineWrites(store, clock, settings.node_id, final_state_tx_hooks, funnel)
        self._finish: Grouped[states.TransitionRequest, StoredMessage] = Grouped(self.writes.finish_many, "finish")
        self._call_starts = Grouped(self.writes.begin_calls, "call start")
        self._call_ends = Grouped(self.writes.finish_calls, "call end")
        self._call_records = Grouped(CallRecordStore(store).add_many, "call record")
        # the accept's insert and the claim pass here once per message: bound once, not a method call each
        #: ``insert(new)``: store an accepted message as NEW; the future of its (message, duplicate), settled after the
        #: commit (a duplicate names the message stored before)
        self.insert: Callable[[NewMessage], asyncio.Future[tuple[StoredMessage, bool]]] = functools.partial(
            self.writer.enqueue_grouped, Grouped(self.writes.insert_many, "insert", urgent=True))
        #: ``insert_claimed(new)``: store an accepted message claimed for this node in the same transaction
        #: (PROCESSING; a duplicate is not claimed); the future of its (message, duplicate), settled after the commit
        self.insert_claimed: Callable[[NewMessage], asyncio.Future[tuple[StoredMessage, bool]]] = functools.partial(
            self.writer.enqueue_grouped, Grouped(self.writes.insert_claimed_many, "insert claimed", urgent=True))
        #: ``claim(message)``: claim a queued message for this node; the future of the claimed snapshot (None when
        #: another writer had it; the POSTPONED snapshot when it waits in its funnel's queue instead)
        self.claim: Callable[[StoredMessage], asyncio.Future[StoredMessage | None]] = functools.partial(
            self.writer.enqueue_grouped, Grouped(self.writes.claim_many, "claim"))
        #: ``submit(operation)``: run ``operation(connection)`` in a writer transaction; its result after the commit
        self.submit = self.writer.submit

    def close(self) -> None:
        """Write what is queued and stop the writer's thread (blocking)."""
        self._closed = True
        self.writer.close()

    async def aclose(self) -> None:
        """:meth:`close` on a worker thread; a :meth:`transact` from now on gets a transaction of its own."""
        self._closed = True  # set on the loop before the writer closes: what was queued before it is still written
        await asyncio.get_running_loop().run_in_executor(None, self.writer.close)

    async def transact(self, work: Callable[[sa.Connection], T], /) -> T:
        """Run ``work(connection)`` (blocking database work) in one of this node's group-commit transactions, with the
        messages' own writes; its result once committed. A failure rolls that transaction back, which is then
        written again operation by operation, so ``work`` fails alone (its error raised here). Once the pipeline is
        closed (its writer stopped), ``work`` gets a transaction of its own on a worker thread.

        The composition root hands this (as ``Engine.transact``) to the parts that write right after a message's
        final commit (the confirmations' claims and records): one commit fewer each (a fsync on PostgreSQL)."""
        if not self._closed:
            return await self.writer.submit(work)

        def own() -> T:
            with self.store.engine.begin() as connection:
                return work(connection)

        return await asyncio.to_thread(own)

    # -- writes -----------------------------------------------------------------------------------------------------
    def apply(self, message: StoredMessage, decision: outcomes.Decision, now: datetime,
              cause: str = "engine") -> Coroutine[Any, Any, StoredMessage | None]:
        """Write ``decision`` (see :mod:`openroute.engine.outcome`) with its transition row's ``cause``, then what
        follows the commit (:meth:`written`); awaited: the new snapshot, or None if another writer changed the message
        first. The write is queued at once, so the caller may await it later (a worker takes its next message)."""
        return self.written(message, decision.target, self.writer.enqueue_grouped(
            self._finish, (message, decision.target, now, dict(decision.changes), cause)))

    async def give_back(self, message: StoredMessage) -> StoredMessage | None:
        """``message`` was claimed for this node but will not run here (the node stops): due at once for any node."""
        now = self.clock.now()
        return await self.apply(message, outcomes.handed_back(message, now), now, "stop")

    async def give_back_claimed(self) -> None:
        """Give back every message queued claimed for this node and not started (the node stops)."""
        with contextlib.suppress(Exception):  # the store is gone: the lease's repair gives them back later
            for _previous, claimed in list(self.queue.claimed.values()):
                await self.give_back(claimed)
        self.queue.claimed.clear()

    def claim_ready(self, now: datetime, new_cutoff: datetime | None, limit: int,
                    share: FunnelShare | None) -> Awaitable[list[tuple[MessageState, StoredMessage]]]:
        """The feeder's claim in one writer transaction (``EngineWrites.claim_ready``)."""
        return self.writer.submit(
            lambda connection: self.writes.claim_ready(connection, now, new_cutoff, limit, share))

    async def complete_parent(self, parent_id: int) -> None:
        """End the waiting parent ``parent_id`` when its children (all final already) decide it."""
        now = self.clock.now()
        completed = await self.writer.submit(
            lambda connection: self.writes.complete_parent(parent_id, now, connection))
        if completed is not None:
            await self.parent_completed(completed)

    def start_call(self, start: CallStart) -> asyncio.Future[tuple[ExternalCall | None, bool]]:
        """Record the start of an external call in the group commit (``AttemptRuntime.start_call``)."""
        return self.writer.enqueue_grouped(self._call_starts, start)

    def end_call(self, end: CallEnd) -> asyncio.Future[None]:
        """Record the outcome of an external call in the group commit (``AttemptRuntime.end_call``)."""
        return self.writer.enqueue_grouped(self._call_ends, end)

    def add_call_record(self, record: CallRecord) -> asyncio.Future[int]:
        """Store a call record in the group commit (``AttemptRuntime.add_call_record``); the future of its id."""
        return self.writer.enqueue_grouped(self._call_records, record)

    def apply_in_background(self, message: StoredMessage, decision: outcomes.Decision, now: datetime) -> None:
        """:meth:`apply` for a caller that does not wait for it (a worker takes its next message). Until the follow-up
        is over the message keeps its room in the queue (``ProcessingQueue.writing``; ``written`` once it is over: a
        stale write as :meth:`apply`'s None, an error as awaiting :meth:`apply` raises it, logged). No task runs the
        follow-up and no future carries its end: the commit's own settle callback runs it (:class:`_FollowUp`), and a
        final-state hook that suspends continues in a task from there; a message whose outcome and hooks ask nothing
        of the loop costs no task, no future and no callback of its own. Raises RuntimeError when the writer is
        closed (the queue hears nothing then). The decision's changes go to the writer as they are, not copied as
        :meth:`apply` copies them: the caller made them for this write (an attempt's outcome) and changes them no
        more."""
        self.writer.deliver_grouped(self._finish, (message, decision.target, now, decision.changes, "engine"),
                                    _FollowUp(self, message, decision.target, contextvars.copy_context()))
        self.queue.writing()  # before the next loop iteration, the earliest the write can end

    def _background_over(self, message_id: int, error: BaseException | None) -> None:
        """The follow-up of a background write (:meth:`apply_in_background`) is over: ``error`` logged (None: none),
        the message's room in the queue freed."""
        try:
            if error is not None and not self.store.outage.failed(error, "writing an outcome"):
                repeated_errors.log(log, "processing message %s failed outside the route", message_id, error=error)
        finally:
            self.queue.written(message_id)

    # -- after the commit -------------------------------------------------------------------------------------------
    async def written(
        self, message: StoredMessage, target: MessageState, written: asyncio.Future[StoredMessage]
    ) -> StoredMessage | None:
        """The rest of a transition once ``written`` (the writer's future of it) is settled: counters, listeners,
        final-state hooks, a parent the change completed; None when another writer changed the message first."""
        try:
            updated = await written
        except BaseException as error:
            self.not_written(message, target, error)
            return None
        parent = self.committed(message, target, updated)
        return await self.hooks_and_parent(updated, states.is_final(target), parent)

    def not_written(self, message: StoredMessage, target: MessageState, error: BaseException) -> None:
        """The write of ``message``'s change to ``target`` failed with ``error``: a stale write is counted and logged
        (returns), any other error raised again."""
        self.writes.completed_parents.pop(message.id, None)  # left by a group that was rolled back
        self.funnel.discard(message.id)
        if not isinstance(error, StaleMessageError):
            raise error
        # a repoll on another node repaired it meanwhile (lease too short for this route?)
        self.stats.stale_writes += 1
        log.warning("outcome %s of message %s lost: another writer changed it first", target.value, message.id)

    def committed(self, message: StoredMessage, target: MessageState, updated: StoredMessage) -> StoredMessage | None:
        """What follows the commit of ``message``'s change to ``updated`` at once (counters, listeners, the funnel's
        hand-on); returns the parent the change completed, if any (its follow-up comes after the hooks)."""
        self.stats.outcomes[target] += 1
        if self.transition_listeners:
            self.notify(message.state, updated)
        if updated.funnel_value is not None:
            self._hand_on(updated)
        completed_parents = self.writes.completed_parents
        return completed_parents.pop(updated.id, None) if completed_parents else None

    async def hooks_and_parent(self, updated: StoredMessage, final: bool, parent: StoredMessage | None) -> \
            StoredMessage:
        """The final-state hooks of ``updated`` (if ``final``), then the completion of its ``parent`` (if any)."""
        if final:
            await self.run_final_hooks(updated)
        if parent is not None:
            await self.parent_completed(parent)
        return updated

    def waited(self, previous: MessageState, message: StoredMessage) -> None:
        """A claim put ``message`` in its funnel's queue instead (committed)."""
        self.stats.outcomes[message.state] += 1
        self.notify(previous, message)

    async def parent_completed(self, parent: StoredMessage) -> None:
        """A parent left WAITING_FOR_CHILDREN for its final state (committed)."""
        self.stats.outcomes[parent.state] += 1
        self.notify(MessageState.WAITING_FOR_CHILDREN, parent)
        if parent.funnel_value is not None:
            self._hand_on(parent)
        await self.run_final_hooks(parent)

    def _hand_on(self, message: StoredMessage) -> None:
        """Queue the message the committed release of ``message``'s funnel claimed, if any (or give it back)."""
        claimed = self.funnel.handed_on(message.id)
        if claimed is None or self.queue.emit_claimed(MessageState.POSTPONED, claimed):
            return
        log.debug("funnel %r: message %s handed on while this node takes no work; given back", claimed.funnel_value,
                  claimed.id)
        self.give_back_soon(claimed, "after its funnel was handed to it")

    def give_back_soon(self, claimed: StoredMessage, when: str) -> None:
        """:meth:`give_back` in the background, for a caller that must not wait for it; a failure is logged (``when``
        says when it was claimed) and leaves the message PROCESSING, for the lease's repair."""
        task = asyncio.ensure_future(self.give_back(claimed))
        task.add_done_callback(functools.partial(_given_back, claimed.id, when))

    def notify(self, previous: MessageState | None, message: StoredMessage) -> None:
        """Tell the transition listeners (a failing listener is logged, the others still hear it)."""
        for listener in self.transition_listeners:
            try:
                listener(previous, message)
            except Exception as error:  # a listener's bug would fail every message: its traceback once a minute
                repeated_errors.log(log, "transition listener %r failed for message %s", listener, message.id,
                                    error=error)

    async def run_final_hooks(self, message: StoredMessage) -> None:
        """Await the final-state hooks of ``message`` (a failing hook is logged, the others still run)."""
        rest = self.final_hooks_eagerly(message)
        if rest is not None:
            await rest

    def final_hooks_eagerly(self, message: StoredMessage,
                            hooks: Iterator[FinalStateHook] | None = None) -> Coroutine[Any, Any, None] | None:
        """Run the final-state hooks of ``message`` (those ``hooks`` has left, default all) here until one suspends:
        None when they all returned, else the coroutine of the rest (that hook's, then the others'). Most hooks never
        wait, and a coroutine of ours around them cost more than they do. A hook's BaseException that is no Exception
        is raised here, as awaiting the hook would raise it."""
        if hooks is None:
            hooks = iter(self.final_state_hooks)  # the live list, as a for loop over it (a hook may add hooks)
        for hook in hooks:
            try:
                running = hook(message)
                if running.__class__ is not CoroutineType:  # another awaitable (a future): awaited in the rest
                    return self._rest_of_hooks(message, hook, running, hooks)
                # stepped by a for loop, a coroutine that returns ends without the StopIteration its ``send`` raises
                # (made, caught and matched: ~1,500 instructions a hook); the loop's body runs if it suspends
                for waiting in running.__await__():
                    return self._rest_of_hooks(message, hook, _Suspended(running, waiting), hooks)
            except Exception as error:
                self._hook_failed(hook, message, error)
        return None

    async def _rest_of_hooks(self, message: StoredMessage, hook: FinalStateHook, running: Awaitable[None],
                             hooks: Iterator[FinalStateHook]) -> None:
        """The final-state hooks of ``message`` from ``hook``, suspended (``running``), then the ``hooks`` left."""
        try:
            await running
        except Exception as error:
            self._hook_failed(hook, message, error)
        rest = self.final_hooks_eagerly(message, hooks)
        if rest is not None:
            await rest

    @staticmethod
    def _hook_failed(hook: FinalStateHook, message: StoredMessage, error: Exception) -> None:
        repeated_errors.log(log, "final-state hook %r failed for message %s", hook, message.id, error=error)


def _given_back(message_id: int, when: str, done: asyncio.Future[Any]) -> None:
    error = None if done.cancelled() else done.exception()
    if error is not None:  # it stays PROCESSING: the lease's repair gives it back
        log.warning("message %s could not be given back %s: %s: %s", message_id, when, type(error).__name__, error)


class _FollowUp:
    """The receiver of one background outcome write (:meth:`CommitPipeline.apply_in_background`): the writer's settle
    callback hands it the result, and it runs :meth:`CommitPipeline.written`'s follow-up right there, in the context
    the write was queued from (as a task made there would); its end frees the message's room in the queue."""

    __slots__ = ("context", "message", "pipeline", "target")

    def __init__(self, pipeline: CommitPipeline, message: StoredMessage, target: MessageState,
                 context: contextvars.Context) -> None:
        self.pipeline = pipeline
        self.message = message
        self.target = target
        self.context = context

    def __repr__(self) -> str:
        return f"<follow-up of message {self.message.id} -> {self.target.value}>"

    def done(self) -> bool:
        """Always False: a background write's follow-up is always wanted (nothing cancels it)."""
        return False

    def set_result(self, updated: StoredMessage) -> None:
        """The change was committed: its follow-up."""
        self.context.run(self._committed, updated)

    def set_exception(self, error: BaseException) -> None:
        """The write failed."""
        self.context.run(self._failed, error)

    def _committed(self, updated: StoredMessage) -> None:
        pipeline, target = self.pipeline, self.target
        try:
            parent = pipeline.committed(self.message, target, updated)
            final = target in FINAL_STATES
            if parent is not None:
                run_eagerly(pipeline.hooks_and_parent(updated, final, parent), self._over, self.context)
                return
        except Exception as error:
            self._over(error)
            return
        if final and pipeline.final_state_hooks:
            # the hooks alone, run here (no coroutine of ours unless one of them suspends), as run_eagerly would
            try:
                rest = pipeline.final_hooks_eagerly(updated)
            except BaseException as error:
                self._over(error)
                if isinstance(error, (KeyboardInterrupt, SystemExit)):
                    raise
                return
            if rest is not None:
                run_in_task(rest, self._over, self.context)
                return
        pipeline.queue.written(self.message.id)  # over without an error: nothing to log (a call fewer)

    def _failed(self, error: BaseException) -> None:
        try:
            self.pipeline.not_written(self.message, self.target, error)
        except BaseException as raised:
            self._over(raised)
            return
        self._over(None)

    def _over(self, error: BaseException | None) -> None:
        self.pipeline._background_over(self.message.id, error)


def run_eagerly(coroutine: Coroutine[Any, Any, Any], over: Callable[[BaseException | None], None],
                context: contextvars.Context) -> None:
    """Run ``coroutine`` here until it first suspends, then in a task (made in ``context``); ``over(error)`` once it
    is over (``error`` None: it returned or its task was cancelled). Python 3.12's eager tasks, for a coroutine that
    seldom suspends: final-state hooks mostly return at once, and a task for each would cost more than the hooks."""
    try:
        waiting = coroutine.send(None)
    except StopIteration:
        over(None)
        return
    except BaseException as error:
        over(error)
        if isinstance(error, (KeyboardInterrupt, SystemExit)):
            raise
        return
    run_in_task(_carry_on(coroutine, waiting), over, context)


def run_in_task(coroutine: Coroutine[Any, Any, Any], over: Callable[[BaseException | None], None],
                context: contextvars.Context) -> None:
    """Run ``coroutine`` in a task made in ``context``; ``over(error)`` once it is over (as :func:`run_eagerly`)."""
    task = asyncio.get_running_loop().create_task(coroutine, context=context)
    task.add_done_callback(functools.partial(_task_over, over))


async def _carry_on(coroutine: Coroutine[Any, Any, T], waiting: Any) -> T:
    return await _Suspended(coroutine, waiting)


class _Suspended(Generic[T]):
    """A coroutine suspended on ``waiting``, as an awaitable: the task awaiting it waits on ``waiting`` first, then
    drives the coroutine on (sends, throws and closes passed to it)."""

    __slots__ = ("coroutine", "waiting")

    def __init__(self, coroutine: Coroutine[Any, Any, T], waiting: Any) -> None:
        self.coroutine = coroutine
        self.waiting = waiting

    def __await__(self) -> Generator[Any, Any, T]:
        coroutine, waiting = self.coroutine, self.waiting
        while True:
            thrown: BaseException | None = None
            sent = None
            try:
                sent = yield waiting
            except GeneratorExit:
                coroutine.close()
                raise
            except BaseException as error:  # the task's cancellation: the coroutine's to handle
                thrown = error
            try:
                waiting = coroutine.send(sent) if thrown is None else coroutine.throw(thrown)
            except StopIteration as returned:
                value: T = returned.value
                return value


def _task_over(over: Callable[[BaseException | None], None], task: asyncio.Future[Any]) -> None:
    over(None if task.cancelled() else task.exception())
