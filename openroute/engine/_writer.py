"""Group commit: database work of many coroutines run by one thread, several operations per transaction.

A commit (an fsync on PostgreSQL, the WAL write lock on SQLite) costs far more than the statements in it,
so operations that arrive while a transaction is running are committed together in the next one. Every
caller still gets its own result only after the commit that contains its work. If a grouped transaction
fails, each of its operations is re-run alone so one bad operation cannot fail its neighbours.

The thread is rung by a loop callback once the loop has run the callbacks it had ready (at most
``_RING_DEFERRALS`` iterations later; one iteration later on a loop that does not show them, uvloop), instead of
being woken by every operation. A thread woken early waits for the GIL and takes it as soon as the loop runs C
code that releases it (lxml does, for every parse, XPath and serialisation; so do socket writes), and commits the
few operations queued so far while the requests the loop was about to run queue theirs behind it: half-full
transactions, each with its own commit (see docs/performance.md, inbound HTTP and SOAP).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from itertools import chain, groupby, repeat
from operator import is_, itemgetter
from typing import Any, Generic, Protocol, TypeVar

import sqlalchemy as sa

log = logging.getLogger("openroute.engine")

T = TypeVar("T")
ItemT = TypeVar("ItemT")
T_contra = TypeVar("T_contra", contravariant=True)


class Failure:
    """A per-item error returned by a grouped operation: delivered to that caller as its exception."""

    __slots__ = ("error",)

    def __init__(self, error: BaseException) -> None:
        self.error = error


class Receiver(Protocol[T_contra]):
    """What takes an operation's result on the loop: an :class:`asyncio.Future`, or an object that acts on the result
    at once (:meth:`GroupCommitWriter.deliver_grouped`)."""

    def done(self) -> bool:
        """True when the result is not wanted any more (a cancelled future)."""

    def set_result(self, result: T_contra, /) -> None:
        """The operation's result, after its commit."""

    def set_exception(self, error: BaseException, /) -> None:
        """The operation failed (its transaction was rolled back)."""


class Grouped(Generic[ItemT, T]):
    """Items of one kind written together: ``run(connection, items)`` returns one result (or Failure) per item.

    ``urgent`` items (the accepted messages' inserts: a sender waits for them) go first into the next transaction,
    ahead of the operations queued before them (claims, outcomes, feeds): accepting never waits behind processing
    for more than the transaction under way."""

    def __init__(self, run: Callable[[sa.Connection, list[ItemT]], Sequence[T | Failure]], name: str, *,
                 urgent: bool = False) -> None:
        self.run = run
        self.name = name
        self.urgent = urgent

    def __repr__(self) -> str:
        return f"Grouped({self.name})"

_STOP = object()
#: loop iterations the ring may wait for the loop's ready callbacks: bounds the delay it adds under load
_RING_DEFERRALS = 3
#: the iterations it waits on a loop whose ready callbacks it cannot see (uvloop, which ``openroute run`` serves on):
#: one, so what became ready with the operation still queues its writes first. Waiting the full bound every time
#: held each commit of a busy node (its accepts, claims and outcomes) three iterations of other work longer: the
#: route benchmark's node accepted 30-85 % fewer messages a second at full load. The HTTP benchmark's JSON commits
#: hold as many writes; SOAP's on SQLite fewer (~24 against ~30), at the same rate (docs/performance.md)
_BLIND_RING_DEFERRALS = 1


class GroupCommitWriter:
    """Runs ``operation(connection)`` calls on one thread, grouping up to ``max_batch`` per transaction.

    The thread keeps one connection while it has work and gives it back to the pool after ``idle_release`` seconds
    without any, so the pool's checks (PostgreSQL's pre-ping) see it again before the next transaction: a
    connection the server dropped while the node was quiet is replaced, not failed on.
    """

    def __init__(self, engine: sa.Engine, max_batch: int = 256, name: str = "openroute-writer",
                 idle_release: float = 1.0) -> None:
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        if idle_release <= 0:
            raise ValueError(f"idle_release must be positive, got {idle_release}")
        self._idle_release = idle_release
        self._engine = engine
        self._max_batch = max_batch
        # the operations queued, appended and taken under the gate (taken as slices: a get an operation was a call,
        # an append and a loop turn of the writer's)
        self._queue: list[Any] = []
        self._urgent: list[Any] = []  # taken first (Grouped.urgent)
        # one token per ring: the thread sleeps on it, not on the queue, so a put alone does not wake it
        self._bell: queue.SimpleQueue[None] = queue.SimpleQueue()
        self._ringing: set[asyncio.AbstractEventLoop] = set()
        # the closed check and the put are one step against close() from another thread: an operation is refused,
        # or queued before the stop mark and written; never queued behind it, waiting forever
        self._gate = threading.Lock()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        # the thread's own connection, kept between transactions (see _transaction)
        self._connection: sa.Connection | None = None
        self._started = False
        self._closed = False
        self.transactions = 0
        self.operations = 0
        #: CPU time of the writer thread in transactions (Python, driver and, for SQLite, the database itself)
        self.cpu_seconds = 0.0

    def start(self) -> None:
        if not self._started:
            self._started = True
            self._thread.start()

    async def submit(self, operation: Callable[[sa.Connection], T]) -> T:
        """Run ``operation`` in a (possibly shared) transaction; return its result after the commit."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        self._enqueue((None, operation, future, loop), loop)
        return await future

    async def submit_grouped(self, group: Grouped[ItemT, T], item: ItemT) -> T:
        """Add ``item`` to ``group``: all items of the group in one transaction share one ``group.run`` call."""
        return await self.enqueue_grouped(group, item)

    def enqueue_grouped(self, group: Grouped[ItemT, T], item: ItemT) -> asyncio.Future[T]:
        """:meth:`submit_grouped` without waiting: the future of ``item``'s result, set after its commit.

        A future is the plainest :class:`Receiver` of :meth:`deliver_grouped`."""
        future: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        self.deliver_grouped(group, item, future)
        return future

    def deliver_grouped(self, group: Grouped[ItemT, T], item: ItemT, receiver: Receiver[T]) -> None:
        """:meth:`enqueue_grouped` handing ``item``'s result to ``receiver`` instead of a future: its ``set_result`` or
        ``set_exception`` is called on the running loop, in the callback that settles the whole commit (skipped once
        ``receiver.done()``). No future is made and no loop callback scheduled for this item alone: a caller with
        work to do right after the commit (the commit pipeline's follow-up of an outcome) saves both.

        Every message passes here two or three times (insert, claim, outcome), so :meth:`start` and
        :meth:`_enqueue` are written out inline."""
        loop = asyncio.get_running_loop()
        with self._gate:
            if self._closed:
                raise RuntimeError("the writer is closed")
            if not self._started:
                self.start()
            (self._urgent if group.urgent else self._queue).append((group, item, receiver, loop))
        if loop not in self._ringing:
            self._ringing.add(loop)
            loop.call_soon(self._ring, loop)

    def _enqueue(self, entry: Any, loop: asyncio.AbstractEventLoop) -> None:
        with self._gate:
            if self._closed:
                raise RuntimeError("the writer is closed")
            self.start()
            self._queue.append(entry)
        if loop not in self._ringing:
            self._ringing.add(loop)
            loop.call_soon(self._ring, loop)

    def _ring(self, loop: asyncio.AbstractEventLoop, deferrals_left: int = -1) -> None:
        # asyncio's loop keeps its ready callbacks in ``_ready``: while it has some (requests parsed in the same
        # burst, about to queue their writes), ring later. A loop without it (uvloop) is deferred once every time.
        ready = getattr(loop, "_ready", None)
        if deferrals_left < 0:
            deferrals_left = _RING_DEFERRALS if ready is not None else _BLIND_RING_DEFERRALS
        if deferrals_left and (ready is None or ready):
            loop.call_soon(self._ring, loop, deferrals_left - 1)
            return
        self._ringing.discard(loop)  # before the token, so an operation queued after it rings again
        self._bell.put(None)

    def close(self) -> None:
        """Finish the queued operations and stop the thread."""
        with self._gate:
            if self._closed:
                return
            self._closed = True
            started = self._started
            if started:
                self._queue.append(_STOP)  # the last: nothing is queued once closed
        if started:
            self._bell.put(None)
            self._thread.join()

    def _run(self) -> None:
        while True:
            try:
                self._bell.get(timeout=self._idle_release)
            except queue.Empty:  # idle: the connection goes back to the pool until there is work again
                self._release_connection()
                self._bell.get()
            while True:  # tokens rung meanwhile are answered by this drain
                try:
                    self._bell.get_nowait()
                except queue.Empty:
                    break
            while True:  # everything queued until now, max_batch per transaction
                batch, stop = self._next_batch()
                if batch:
                    started = time.thread_time()
                    self._execute(batch)
                    self.cpu_seconds += time.thread_time() - started
                if stop:
                    self._release_connection()
                    return
                if len(batch) < self._max_batch and not self._urgent:
                    break

    def _next_batch(self) -> tuple[list[Any], bool]:
        """Up to ``max_batch`` queued operations, the urgent ones first; and whether the stop mark was reached."""
        most = self._max_batch
        with self._gate:
            urgent, queued = self._urgent, self._queue
            batch = urgent[:most]
            del urgent[:most]
            room = most - len(batch)
            if room and queued:
                batch += queued[:room]
                del queued[:room]
        if batch and batch[-1] is _STOP:
            batch.pop()
            return batch, True
        return batch, False

    def _execute(self, batch: list[_Entry]) -> None:
        # the batch in runs of one group (a Grouped is its own key, hashed by identity), taken by C loops: the items of
        # a group, run after run, go to one ``group.run`` and each run's results are a slice of its results
        runs: list[Sequence[Any]] = []  # the results of each run, in batch order
        groups: dict[Grouped[Any, Any], tuple[list[tuple[int, int]], list[Any]]] = {}  # (run, items) and the items
        try:
            with self._transaction() as connection:
                for group, entries in groupby(batch, _group_of):
                    if group is None:  # submit's operations, each run at once
                        runs.append([entry[1](connection) for entry in entries])
                        continue
                    items = list(map(_item_of, entries))
                    pending = groups.get(group)
                    if pending is None:
                        pending = groups[group] = ([], [])
                    pending[0].append((len(runs), len(items)))
                    pending[1].extend(items)
                    runs.append(items)  # its results' place
                for group, (places, items) in groups.items():
                    outcomes = group.run(connection, items)
                    if len(outcomes) != len(items):
                        raise ValueError(f"{group!r} returned {len(outcomes)} results for {len(items)} items")
                    if len(places) == 1:
                        runs[places[0][0]] = outcomes
                        continue
                    first = 0
                    for run, count in places:
                        runs[run] = outcomes[first:first + count]
                        first += count
        except BaseException as error:
            if len(batch) == 1:
                self._deliver(batch, [Failure(error)])
                return
            log.debug("grouped transaction of %d failed (%r); re-running one by one", len(batch), error)
            for entry in batch:
                self._execute([entry])
            return
        self.transactions += 1
        self.operations += len(batch)
        self._deliver(batch, list(chain.from_iterable(runs)))

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[sa.Connection]:
        """A transaction on the thread's own connection. Checking a connection out of the pool for every transaction
        (and, on PostgreSQL, pinging the server with it) cost as much Python as a small group's statements; after
        a failed transaction, or ``idle_release`` seconds without work, the connection goes back to the pool (which
        discards a broken one) and the next transaction takes a fresh one."""
        if self._connection is None:
            self._connection = self._engine.connect()
        try:
            with self._connection.begin():
                yield self._connection
        except BaseException:
            self._release_connection()
            raise

    def _release_connection(self) -> None:
        connection, self._connection = self._connection, None
        if connection is not None:
            with contextlib.suppress(Exception):
                connection.close()

    @staticmethod
    def _deliver(batch: list[_Entry], results: list[Any]) -> None:
        """Hand the results back (a :class:`Failure` as its error) with one wake-up per loop: waking the loop costs
        more than the statements. Usually every operation came from one loop: the batch goes as it is."""
        loop = batch[0][3]
        if all(map(is_, map(_loop_of, batch), repeat(loop))):
            by_loop = {loop: (batch, results)}
        else:
            by_loop = {}
            for entry, result in zip(batch, results, strict=True):
                settled = by_loop.get(entry[3])
                if settled is None:
                    settled = by_loop[entry[3]] = ([], [])
                settled[0].append(entry)
                settled[1].append(result)
        for loop, (entries, outcomes) in by_loop.items():
            try:
                loop.call_soon_threadsafe(_settle, entries, outcomes)
            except RuntimeError:
                pass  # the caller's loop is closed: nobody is waiting any more


#: an operation queued for the writer: (its group, its item, its receiver, the receiver's loop); a submitted operation
#: is (None, the operation, its future, the future's loop)
_Entry = tuple["Grouped[Any, Any] | None", Any, Receiver[Any], asyncio.AbstractEventLoop]
_loop_of = itemgetter(3)
_group_of, _item_of = itemgetter(0), itemgetter(1)

#: the loop's own future (``loop.create_future()``): its callbacks are the ones _settle knows how to run
_Future = asyncio.Future


def _settle(entries: list[_Entry], results: list[Any]) -> None:
    # a receiver that is not a future acts here (deliver_grouped): one failing must not keep the others unsettled
    woken: list[tuple[Callable[[Any], object], contextvars.Context, asyncio.Future[Any]]] | None = None
    for entry, result in zip(entries, results, strict=True):
        receiver = entry[2]
        if receiver.done():
            continue
        try:
            if result.__class__ is Failure:
                receiver.set_exception(result.error)
                continue
            if receiver.__class__ is _Future:
                # a future with one callback (the wake-up of the task awaiting it, an accept's): the callback is taken
                # off and run by the commit's one wake-up callback (_wake), where set_result would schedule a loop
                # callback of its own (a Handle, ~5,000 instructions a message); it still runs in the next iteration
                # a private attribute (CPython's C and Python futures both have it): where it is gone, the future
                # is settled the public way (its own loop callback), never left unsettled
                callbacks = getattr(receiver, "_callbacks", None)
                if callbacks is not None and len(callbacks) == 1:
                    (wake_up, context), = callbacks
                    receiver.remove_done_callback(wake_up)
                    if woken is None:
                        woken = []
                        entry[3].call_soon(_wake, woken)  # at the first one's place among the loop's callbacks
                    woken.append((wake_up, context, receiver))
            receiver.set_result(result)
        except Exception:  # a receiver's bug: the other operations of the commit still get their results
            log.exception("settling %r after a commit failed", receiver)


def _wake(woken: list[tuple[Callable[[Any], object], contextvars.Context, asyncio.Future[Any]]]) -> None:
    """The callbacks of the futures one commit settled (:func:`_settle`), each in its context, in their order, as the
    loop would run them one callback each (an error is the loop's exception handler's)."""
    for index, (wake_up, context, future) in enumerate(woken):
        try:
            context.run(wake_up, future)
        except (SystemExit, KeyboardInterrupt):
            if index + 1 < len(woken):  # the others still run, as the loop's callbacks after a raising one would
                future.get_loop().call_soon(_wake, woken[index + 1:])
            raise
        except BaseException as error:
            future.get_loop().call_exception_handler({
                "message": f"Exception in callback {wake_up!r}", "exception": error, "future": future})
