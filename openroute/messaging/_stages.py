"""The messaging layer's own stream stages: channel tap (counter, stop), consumer, ordered processor, watch.

They implement the ``openroute.streams`` protocol so that they interoperate with the operator builders.
Re-entrant signals (``request`` from inside ``on_next``) only flag more work for the running drain loop,
which keeps recursion bounded (rule 3.3).
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Iterable
from types import CoroutineType
from typing import Any, cast

from openroute.messaging._drain import DrainLoop
from openroute.messaging.errors import ChannelClosedError
from openroute.messaging.message import Done, Message
from openroute.streams.protocol import (
    NOOP_SUBSCRIPTION,
    Processor,
    Subscriber,
    Subscription,
    add_demand,
    refuse_none,
    signal_end,
)

log = logging.getLogger("openroute.messaging")

Handler = Callable[[Message[Any]], "Awaitable[Any] | Any"]


def may_attach(subscriber: Subscriber[Any] | None, taken: bool, what: str) -> bool:
    """A unicast publisher's ``subscribe`` check: ``TypeError`` for None (rule 1.9); a second subscriber gets
    ``on_subscribe`` then ``on_error`` (``what`` already has one) and False; True when it may be attached."""
    if subscriber is None:
        raise TypeError("subscriber must not be None")
    if taken:
        subscriber.on_subscribe(NOOP_SUBSCRIPTION)
        subscriber.on_error(RuntimeError(f"{what} already has a subscriber"))
        return False
    return True


def may_take_upstream(subscription: Subscription, current: Subscription | None, cancelled: bool) -> bool:
    """A subscriber's ``on_subscribe`` check: ``TypeError`` for None (rule 2.13); a second subscription, or one
    that arrives after ``cancel``, is cancelled (rule 2.5) and False; True when it may be kept."""
    if subscription is None:
        raise TypeError("subscription must not be None")
    if current is not None or cancelled:
        subscription.cancel()
        return False
    return True


class _OneUpstream:
    """The one upstream of a stage: taken in ``on_subscribe`` (rules 2.5, 2.13), cancelled at most once."""

    _up: Subscription | None
    _cancelled: bool

    def _take_upstream(self, subscription: Subscription) -> bool:
        if not may_take_upstream(subscription, self._up, self._cancelled):
            return False
        self._up = subscription
        return True

    def _cancel_upstream(self) -> bool:
        """Cancel the upstream, once; False when it was cancelled before."""
        if self._cancelled:
            return False
        self._cancelled = True
        if self._up is not None:
            self._up.cancel()
        return True


class _OneDownstream(Subscription):
    """The one downstream of a stage (unicast); the stage itself is its subscription."""

    _subscribed: bool
    _down: Subscriber[Message[Any]] | None

    def _attach(self, subscriber: Subscriber[Message[Any]], what: str) -> bool:
        if not may_attach(subscriber, self._subscribed, what):
            return False
        self._subscribed = True
        self._down = subscriber
        subscriber.on_subscribe(self)
        return True


class ChannelTap(_OneUpstream, Processor[Message[Any], Message[Any]], _OneDownstream):
    """Sits on every channel: counts the messages that pass and lets the application stop a source.

    Accepts its downstream before or after its upstream (an injected channel is subscribed late).
    """

    def __init__(self, channel: str) -> None:
        self.channel = channel
        self.count = 0
        self._up: Subscription | None = None
        self._down: Subscriber[Message[Any]] | None = None
        self._subscribed = False
        self._pending_demand = 0
        self._terminal: tuple[BaseException | None] | None = None
        self._cancelled = False
        self._done = False

    @property
    def subscribed(self) -> bool:
        """True once a downstream subscriber is attached."""
        return self._subscribed

    def subscribe(self, subscriber: Subscriber[Message[Any]]) -> None:
        if not self._attach(subscriber, f"channel '{self.channel}'"):
            return
        if self._terminal is not None and not self._done:
            self._deliver_terminal(self._terminal[0])

    def on_subscribe(self, subscription: Subscription) -> None:
        if not self._take_upstream(subscription):
            return
        if self._pending_demand:
            demand, self._pending_demand = self._pending_demand, 0
            subscription.request(demand)

    def on_next(self, item: Message[Any]) -> None:
        if item is None:  # rule 2.13; the check inline: every message of a channel passes here
            refuse_none(item, "on_next")
        down = self._down
        if self._done or down is None:
            if isinstance(item, Message):
                item.nack(ChannelClosedError(f"channel '{self.channel}' is closed"))
            return
        self.count += 1
        down.on_next(item)

    def on_error(self, error: BaseException) -> None:
        refuse_none(error, "on_error")
        self._terminate(error)

    def on_complete(self) -> None:
        self._terminate(None)

    def _terminate(self, error: BaseException | None) -> None:
        if self._done:
            return
        if not self._subscribed:
            self._terminal = (error,)
            return
        self._deliver_terminal(error)

    def _deliver_terminal(self, error: BaseException | None) -> None:
        self._done = True
        down, self._down = self._down, None
        if down is None:
            return
        signal_end(down, error)

    def request(self, n: int) -> None:
        if self._up is not None:
            self._up.request(n)
        elif n <= 0:
            self._cancel_upstream()
            self._terminate(ValueError(f"request({n}): demand must be positive (rule 3.9)"))
        else:
            self._pending_demand = add_demand(self._pending_demand, n)

    def cancel(self) -> None:
        self._down = None
        self._done = True
        self._cancel_upstream()

    def stop(self) -> None:
        """Cancel the upstream (the source stops) and complete the downstream (it drains what it holds)."""
        self._cancel_upstream()
        self._terminate(None)


#: messages a consumer or a value processor requests beyond its free call slots (kept queued), as a reactive
#: consumer's prefetch: the LATEST overflow strategy keeps every message within this demand, plus the latest
#: (the spec's TCK), and drops only what outruns it.
DEFAULT_PREFETCH = 16


class ConsumerSubscriber(_OneUpstream, Subscriber[Message[Any]]):
    """Calls a handler for every message, at most ``concurrency`` at a time, with ``prefetch`` more requested
    ahead and queued; each finished call requests one more.

    ``completion`` resolves (with ``None``) once the upstream completed and every call has finished, or
    after ``cancel()``; it fails with the upstream's error (also kept in ``failure`` and logged).
    """

    def __init__(self, channel: str, handler: Handler, concurrency: int = 1,
                 prefetch: int = DEFAULT_PREFETCH) -> None:
        self.channel = channel
        self._handler = handler
        self._concurrency = concurrency
        self._prefetch = prefetch
        self._up: Subscription | None = None
        self._queue: deque[Message[Any]] = deque()
        self._inflight = 0
        self._tasks: set[asyncio.Future[Any]] = set()
        self._upstream_done = False
        self._cancelled = False
        self.failure: BaseException | None = None
        self._loop = asyncio.get_running_loop()
        self.completion: asyncio.Future[None] = self._loop.create_future()
        self.completion.add_done_callback(_retrieve)

    def on_subscribe(self, subscription: Subscription) -> None:
        if not self._take_upstream(subscription):
            return
        subscription.request(self._concurrency + self._prefetch)

    def on_next(self, item: Message[Any]) -> None:
        if item is None:  # rule 2.13; the check inline: every message of a channel passes here
            refuse_none(item, "on_next")
        if self._cancelled:
            item.nack(ChannelClosedError(f"channel '{self.channel}' consumer was stopped"))
            return
        if self._inflight >= self._concurrency or self._queue:
            # prefetched (or pushed by an upstream that ignores demand: emitter overflow NONE)
            self._queue.append(item)
            return
        self._start(item)

    def _start(self, item: Message[Any]) -> None:
        self._inflight += 1
        try:
            result = self._handler(item)
        except Exception:  # handlers catch user errors; this is a bug in the wrapper, keep consuming
            log.exception("channel '%s': handler failed", self.channel)
            result = None
        if result is None or isinstance(result, Done):
            self._finished(None)
        elif isinstance(result, asyncio.Future):  # a connector's pending acknowledgment: no task to wrap it
            self._tasks.add(result)
            result.add_done_callback(self._finished)
        elif hasattr(result, "__await__"):
            # a coroutine (an async handler's call: every message's) straight to its task; ensure_future's checks
            # and look-ups cost a tenth of the task
            task = self._loop.create_task(result) if type(result) is CoroutineType else asyncio.ensure_future(result)
            self._tasks.add(task)
            task.add_done_callback(self._finished)
        else:
            self._finished(None)

    def _finished(self, task: asyncio.Future[Any] | None) -> None:
        if task is not None:
            self._tasks.discard(task)
            if not task.cancelled() and task.exception() is not None:
                log.error("channel '%s': handler failed", self.channel, exc_info=task.exception())
        self._inflight -= 1
        if self._cancelled:
            self._check_done()
            return
        if self._queue:
            self._start(self._queue.popleft())
        if not self._upstream_done and self._up is not None:
            self._up.request(1)
        elif not self._queue:
            self._check_done()

    def _check_done(self) -> None:
        done = (self._upstream_done or self._cancelled) and self._inflight == 0 and not self._queue
        if done and not self.completion.done():
            if self.failure is not None and not self._cancelled:
                self.completion.set_exception(self.failure)
            else:
                self.completion.set_result(None)

    def on_error(self, error: BaseException) -> None:
        refuse_none(error, "on_error")
        self.failure = error
        log.error("channel '%s' failed: %r", self.channel, error)
        self.on_complete()  # the failure is kept: the completion fails with it

    def on_complete(self) -> None:
        self._upstream_done = True
        self._check_done()

    def cancel(self) -> None:
        """Stop consuming: cancel the upstream, cancel running calls, nack queued messages."""
        if not self._cancel_upstream():
            return
        for item in self._queue:
            item.nack(ChannelClosedError(f"channel '{self.channel}' consumer was stopped"))
        self._queue.clear()
        for task in list(self._tasks):
            task.cancel()
        self._check_done()


def _retrieve(future: asyncio.Future[Any]) -> None:
    """Failures are logged where they happen; do not warn again when nobody awaits the completion."""
    if not future.cancelled():
        future.exception()


class _Slot:
    __slots__ = ("done", "results")

    def __init__(self) -> None:
        self.done = False
        self.results: deque[Message[Any]] = deque()


class ProcessorStage(_OneUpstream, DrainLoop, Processor[Message[Any], Message[Any]], _OneDownstream):
    """Applies a handler (message -> iterable of messages, possibly awaitable) with up to ``concurrency``
    calls in flight and ``prefetch`` more messages requested ahead and queued (as ``ConsumerSubscriber``);
    results leave in input order. The handler deals with user errors itself (nack)."""

    def __init__(self, name: str, handler: Handler, concurrency: int = 1, prefetch: int = 0) -> None:
        self.name = name
        self._handler = handler
        self._concurrency = concurrency
        self._prefetch = prefetch
        # requested ahead (the prefetch) and arrived, waiting for a free call slot
        self._pending: deque[Message[Any]] = deque()
        self._up: Subscription | None = None
        self._down: Subscriber[Message[Any]] | None = None
        self._subscribed = False
        self._slots: deque[_Slot] = deque()
        self._tasks: set[asyncio.Future[Any]] = set()
        self._demand = 0
        self._outstanding = 0
        self._upstream_done = False
        self._error: BaseException | None = None
        self._terminated = False
        self._cancelled = False

    def subscribe(self, subscriber: Subscriber[Message[Any]]) -> None:
        if not self._attach(subscriber, f"processor '{self.name}'"):
            return
        self._drain()

    def on_subscribe(self, subscription: Subscription) -> None:
        if not self._take_upstream(subscription):
            return
        self._drain()

    def request(self, n: int) -> None:
        if self._terminated or self._cancelled:
            return
        if n <= 0:
            self._fail(ValueError(f"request({n}): demand must be positive (rule 3.9)"))
            return
        self._demand = add_demand(self._demand, n)
        self._drain()

    def cancel(self) -> None:
        if self._cancelled:
            return
        self._down = None
        self._cancel_upstream()
        for task in list(self._tasks):
            task.cancel()
        self._drop_pending(ChannelClosedError(f"processor '{self.name}' was cancelled"))

    def _drop_pending(self, reason: BaseException) -> None:
        pending = list(self._pending)
        self._pending.clear()
        for item in pending:
            if isinstance(item, Message):
                item.nack(reason)

    def on_next(self, item: Message[Any]) -> None:
        refuse_none(item, "on_next")
        if self._outstanding > 0:
            self._outstanding -= 1
        if self._cancelled or self._upstream_done:
            return
        self._pending.append(item)
        self._drain()

    def _start(self, item: Message[Any]) -> None:
        slot = _Slot()
        self._slots.append(slot)
        try:
            result = self._handler(item)
        except BaseException as error:  # handler wrappers nack user errors; anything else fails the stream
            self._fail(error)
            return
        if result is not None and hasattr(result, "__await__"):
            task = asyncio.ensure_future(result)
            self._tasks.add(task)
            task.add_done_callback(lambda t: self._finished(slot, t))
        else:
            self._fill(slot, cast("Iterable[Message[Any]] | None", result))
            self._drain()

    def _fill(self, slot: _Slot, result: Iterable[Message[Any]] | None) -> None:
        if result is not None:
            slot.results.extend(result)
        slot.done = True

    def _finished(self, slot: _Slot, task: asyncio.Future[Any]) -> None:
        self._tasks.discard(task)
        if task.cancelled():
            return
        error = task.exception()
        if error is not None:
            self._fail(error)
            return
        self._fill(slot, task.result())
        self._drain()

    def _fail(self, error: BaseException) -> None:
        self._error = error
        self._upstream_done = True
        self._slots.clear()
        self._drop_pending(error)
        if self._up is not None:
            self._up.cancel()
        self._drain()

    def on_error(self, error: BaseException) -> None:
        refuse_none(error, "on_error")
        if self._error is None:
            self._error = error
        self.on_complete()  # the error kept goes downstream once the running calls are delivered

    def on_complete(self) -> None:
        self._upstream_done = True
        self._drain()

    def _drain_once(self) -> None:
        down = self._down
        if down is None or self._terminated:
            return
        if self._error is not None and not self._slots and not self._pending:
            self._terminated = True
            down.on_error(self._error)
            return
        slots = self._slots
        if not self._deliver(down):
            return
        while self._pending and len(slots) < self._concurrency:  # a synchronous result flags another round
            self._start(self._pending.popleft())
        if self._upstream_done:
            if not slots and not self._pending:
                self._terminated = True
                signal_end(down, self._error)
            return
        want = self._concurrency + self._prefetch - len(slots) - len(self._pending) - self._outstanding
        if want > 0 and self._demand > 0 and self._up is not None:
            self._outstanding += want
            self._up.request(want)


    def _deliver(self, down: Subscriber[Message[Any]]) -> bool:
        """Hand the finished results downstream, in input order, within the demand; False once cancelled."""
        slots = self._slots
        while slots and slots[0].done:
            head = slots[0]
            if not head.results:
                slots.popleft()
                continue
            if self._demand == 0:
                break
            message = head.results.popleft()
            if self._demand < 2**63 - 1:
                self._demand -= 1
            down.on_next(message)
            if self._down is None:
                return False
        return True


class PostAckSubscriber(Subscriber[Message[Any]]):
    """Passes each message (or its payload, through ``unwrap``) to a user subscriber, then acks it.

    The POST_PROCESSING strategy of a consumer returning a subscriber: the message is acked once the
    subscriber's ``on_next`` has returned; an ``on_next`` that raises (a rule 2.13 violation) nacks it.
    """

    def __init__(self, inner: Subscriber[Any], unwrap: Callable[[Message[Any]], Any] | None) -> None:
        self._inner = inner
        self._unwrap = unwrap
        self._pending: set[asyncio.Future[Any]] = set()

    def on_subscribe(self, subscription: Subscription) -> None:
        self._inner.on_subscribe(subscription)

    def on_next(self, item: Message[Any]) -> None:
        refuse_none(item, "on_next")
        try:
            self._inner.on_next(item if self._unwrap is None else self._unwrap(item))
        except Exception as error:
            self._keep(item.nack(error))
            raise
        self._keep(item.ack())

    def _keep(self, outcome: Any) -> None:
        if outcome is None or isinstance(outcome, Done):
            return
        task = asyncio.ensure_future(outcome)
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)
        task.add_done_callback(_retrieve)

    def on_error(self, error: BaseException) -> None:
        self._inner.on_error(error)

    def on_complete(self) -> None:
        self._inner.on_complete()


class WatchedSubscriber(Subscriber[Any]):
    """Wraps a user subscriber to learn when it terminates and to be able to cancel it."""

    def __init__(self, inner: Subscriber[Any]) -> None:
        self._inner = inner
        self._up: Subscription | None = None
        self.completion: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.completion.add_done_callback(_retrieve)

    def on_subscribe(self, subscription: Subscription) -> None:
        self._up = subscription
        self._inner.on_subscribe(subscription)

    def on_next(self, item: Any) -> None:
        self._inner.on_next(item)

    def on_error(self, error: BaseException) -> None:
        try:
            self._inner.on_error(error)
        finally:
            if not self.completion.done():
                self.completion.set_exception(error)

    def on_complete(self) -> None:
        try:
            self._inner.on_complete()
        finally:
            if not self.completion.done():
                self.completion.set_result(None)

    def cancel(self) -> None:
        """Cancel the subscription on the user subscriber's behalf."""
        if self._up is not None:
            self._up.cancel()
        if not self.completion.done():
            self.completion.set_result(None)
