"""``Emitter``: imperative sending into a channel, with the spec's overflow strategies.

The emitter is the channel's publisher (one subscriber). ``send`` may be called from any thread: the
overflow decision is taken at once under a lock (errors are raised by ``send`` itself) and delivery is
handed to the event loop with ``call_soon_threadsafe``. On the loop ``send`` returns an ``asyncio.Future``;
off the loop a ``concurrent.futures.Future``. Either completes when the message is acked and fails with the
reason when it is nacked.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import enum
import threading
from collections import deque
from typing import Any, Generic, TypeVar

from openroute.messaging._drain import DrainLoop
from openroute.messaging._stages import may_attach
from openroute.messaging.errors import ChannelClosedError, EmitterOverflowError, MessageDroppedError
from openroute.messaging.message import DONE, Message
from openroute.streams.protocol import UNBOUNDED, Publisher, Subscriber, Subscription

T = TypeVar("T")

DEFAULT_BUFFER_SIZE = 128

AnyFuture = asyncio.Future[None] | concurrent.futures.Future[None]


class OnOverflow(enum.Enum):
    """What ``send`` does when the downstream has not requested enough messages."""

    BUFFER = "buffer"
    """Keep up to ``buffer_size`` unrequested messages; one more raises ``EmitterOverflowError``."""
    UNBOUNDED_BUFFER = "unbounded-buffer"
    """Keep every unrequested message."""
    THROW_EXCEPTION = "throw-exception"
    """Raise ``EmitterOverflowError`` when there is no outstanding demand."""
    DROP = "drop"
    """Drop the new message when there is no demand (its future fails with ``MessageDroppedError``)."""
    FAIL = "fail"
    """Fail the stream downstream with ``EmitterOverflowError`` (and raise it) when there is no demand."""
    LATEST = "latest"
    """Keep only the latest unrequested message; the one it replaces is nacked with ``MessageDroppedError``."""
    NONE = "none"
    """No strategy: messages go downstream as they come, whatever the demand (the downstream must cope)."""


def _settle(future: AnyFuture, error: BaseException | None) -> None:
    if isinstance(future, concurrent.futures.Future):
        _settle_now(future, error)
        return
    loop = future.get_loop()
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if running is loop:
        _settle_now(future, error)
    elif not loop.is_closed():
        loop.call_soon_threadsafe(_settle_now, future, error)


def _settle_now(future: AnyFuture, error: BaseException | None) -> None:
    if not future.done():
        if error is None:
            future.set_result(None)
        else:
            future.set_exception(error)


class Emitter(DrainLoop, Publisher[Message[T]], Subscription, Generic[T]):
    """Sends payloads or messages into one channel (the channel's only upstream)."""

    def __init__(self, channel: str, overflow: OnOverflow = OnOverflow.BUFFER,
                 buffer_size: int = DEFAULT_BUFFER_SIZE) -> None:
        if not isinstance(overflow, OnOverflow):
            raise TypeError(f"overflow must be an OnOverflow, got {overflow!r}")
        if isinstance(buffer_size, bool) or not isinstance(buffer_size, int) or buffer_size < 1:
            raise ValueError(f"emitter '{channel}': buffer_size must be a positive int, got {buffer_size!r}")
        self.channel = channel
        self.overflow = overflow
        self.buffer_size = buffer_size
        self._lock = threading.Lock()
        self._buffer: deque[Message[T]] = deque()
        self._demand = 0
        self._subscriber: Subscriber[Message[T]] | None = None
        self._subscribed = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._completed = False
        self._failure: BaseException | None = None
        self._cancelled = False
        self._terminated = False
        self._scheduled = False
        # a rule 3.9 violation stops delivery at once, unlike error(), which lets the buffer drain first
        self._bad_request = False

    # -- Publisher / Subscription -------------------------------------------------------------------
    def subscribe(self, subscriber: Subscriber[Message[T]]) -> None:
        """Attach the channel's subscriber (a second one gets ``on_error``: an emitter is unicast)."""
        if subscriber is None:
            raise TypeError("subscriber must not be None")
        with self._lock:
            taken = self._subscribed
            if not taken:
                self._subscribed = True
                self._subscriber = subscriber
                try:
                    self._loop = asyncio.get_running_loop()
                except RuntimeError:
                    self._loop = None
        if not may_attach(subscriber, taken, f"emitter '{self.channel}'"):
            return
        subscriber.on_subscribe(self)
        self._drain()

    def request(self, n: int) -> None:
        """Downstream demand (rule 3.9: ``n <= 0`` cancels and signals ``ValueError``)."""
        if n <= 0:
            with self._lock:
                if self._cancelled or self._terminated:
                    return
                self._failure = ValueError(f"request({n}): demand must be positive (rule 3.9)")
                self._bad_request = True
            # through the drain loop, so on_error never runs inside an on_next still on the stack (rule 1.3)
            self._drain()
            return
        with self._lock:
            if self._cancelled:
                return
            demand = self._demand + n  # add_demand inline (each consumed message requests one more)
            self._demand = UNBOUNDED if demand >= UNBOUNDED else demand
        self._drain()

    def cancel(self) -> None:
        """Downstream cancellation: buffered and later messages are nacked with ``ChannelClosedError``."""
        with self._lock:
            if self._cancelled:
                return
            self._cancelled = True
            dropped = list(self._buffer)
            self._buffer.clear()
            self._subscriber = None
        for message in dropped:
            message.nack(ChannelClosedError(f"channel '{self.channel}' was cancelled"))

    # -- Emitter API -----------------------------------------------------------------------------------
    def send(self, payload: T | Message[T]) -> AnyFuture:
        """Send a payload (wrapped in a ``Message``) or a ``Message``; returns a future of its acknowledgment.

        Raises ``ValueError`` for ``None``, ``EmitterOverflowError`` when the overflow strategy refuses the
        message, ``ChannelClosedError`` after ``complete()``, ``error()`` or downstream cancellation.
        """
        if payload is None:
            raise ValueError(f"emitter '{self.channel}': cannot send None")
        try:
            running: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        future: AnyFuture
        if running is not None:
            future = running.create_future()
            # a fire-and-forget sender must not get "exception never retrieved" noise for nacked messages
            future.add_done_callback(_retrieve)
        else:
            future = concurrent.futures.Future()
        self._offer(self._wrap(payload, future))
        return future

    def send_message(self, message: Message[T]) -> None:
        """Send ``message`` as it is, the spec's ``void send(Message)``: its own ``ack`` / ``nack`` callbacks are the
        only outcome, so no future is made (the cheaper call for a sender that brings its callbacks).

        Raises as :meth:`send` does, and ``TypeError`` for anything but a ``Message``.
        """
        if not isinstance(message, Message):
            raise TypeError(f"emitter '{self.channel}': send_message takes a Message, got {type(message).__name__}")
        self._offer(message)

    def _offer(self, message: Message[T]) -> None:
        """Apply the overflow strategy to ``message`` and schedule its delivery (or raise)."""
        dropped: Message[Any] | None = None
        fail_stream = False
        with self._lock:
            if self._cancelled or self._completed or self._failure is not None:
                state = "cancelled" if self._cancelled else "completed" if self._completed else "failed"
                raise ChannelClosedError(f"emitter '{self.channel}' is {state}")
            waiting = len(self._buffer)
            unrequested = waiting >= self._demand
            strategy = self.overflow
            if strategy is OnOverflow.BUFFER and waiting - self._demand >= self.buffer_size:
                raise EmitterOverflowError(
                    f"emitter '{self.channel}': buffer of {self.buffer_size} messages is full")
            if strategy is OnOverflow.THROW_EXCEPTION and unrequested:
                raise EmitterOverflowError(f"emitter '{self.channel}': no downstream demand")
            if strategy is OnOverflow.DROP and unrequested:
                dropped = message
            elif strategy is OnOverflow.FAIL and unrequested:
                self._failure = EmitterOverflowError(f"emitter '{self.channel}': no downstream demand")
                fail_stream = True
            elif strategy is OnOverflow.LATEST and waiting > self._demand:
                dropped = self._buffer.pop()
                self._buffer.append(message)
            else:
                self._buffer.append(message)
        if dropped is not None:
            dropped.nack(MessageDroppedError(f"emitter '{self.channel}' dropped a message (no demand)"))
        if fail_stream:
            self._schedule()
            raise self._failure  # type: ignore[misc]
        self._schedule()

    def complete(self) -> None:
        """End the stream after the buffered messages have been delivered."""
        with self._lock:
            if self._completed or self._failure is not None:
                return
            self._completed = True
        self._schedule()

    def error(self, error: BaseException) -> None:
        """Fail the stream downstream with ``error``; buffered messages are nacked with it."""
        if error is None:
            raise ValueError("error() needs an exception")
        with self._lock:
            if self._completed or self._failure is not None:
                return
            self._failure = error
        self._schedule()

    def is_cancelled(self) -> bool:
        """True once the downstream cancelled, or once the emitter completed or failed (nothing more can be sent)."""
        with self._lock:
            return self._closed()

    def has_requests(self) -> bool:
        """True when the downstream has requested more messages than are buffered; always False once closed."""
        with self._lock:
            return not self._closed() and self._demand > len(self._buffer)

    def _closed(self) -> bool:
        # the spec's Emitter: isCancelled() is true and hasRequests() false after complete() or error()
        return self._cancelled or self._completed or self._failure is not None

    @property
    def buffered(self) -> int:
        """Messages sent but not yet delivered downstream."""
        return len(self._buffer)

    # -- internals -------------------------------------------------------------------------------------
    def _wrap(self, payload: T | Message[T], future: AnyFuture) -> Message[T]:
        if isinstance(payload, Message):
            original: Message[T] = payload

            def ack_message() -> Any:
                outcome = original.ack()
                if outcome is DONE:
                    _settle(future, None)
                    return None
                return _after(outcome, future)

            def nack_message(reason: BaseException) -> Any:
                outcome = original.nack(reason)
                _settle(future, reason)
                return None if outcome is DONE else outcome

            return original.with_ack(ack_message).with_nack(nack_message)

        def ack() -> None:
            _settle(future, None)

        def nack(reason: BaseException) -> None:
            _settle(future, reason)

        return Message(payload, ack=ack, nack=nack)

    def _schedule(self) -> None:
        loop = self._loop
        if loop is None or self._scheduled:
            # scheduled already (read without the lock, as every message sent in a burst asks: a stale True is safe,
            # the drain clears the flag before it reads the buffer, so it delivers what was added before)
            return
        with self._lock:
            if self._scheduled:
                return
            self._scheduled = True
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            loop.call_soon(self._scheduled_drain)
        elif not loop.is_closed():
            loop.call_soon_threadsafe(self._scheduled_drain)

    def _scheduled_drain(self) -> None:
        with self._lock:
            self._scheduled = False
        self._drain()

    def _fail_now(self) -> None:
        with self._lock:
            subscriber = self._subscriber
            pending = list(self._buffer)
            self._buffer.clear()
            self._cancelled = True
            self._terminated = True
            self._subscriber = None
            failure = self._failure
        assert failure is not None  # noqa: S101  narrows an Optional for mypy: set before this point
        for message in pending:
            message.nack(failure)
        if subscriber is not None:
            subscriber.on_error(failure)

    def _drain_once(self) -> None:
        """Deliver what the demand allows (re-entrant calls, request from on_next, only flag another round)."""
        while True:
            with self._lock:
                subscriber = self._subscriber
                if subscriber is None or self._terminated or self._bad_request or not self._buffer:
                    break
                if self._demand == 0 and self.overflow is not OnOverflow.NONE:
                    break
                message = self._buffer.popleft()
                if 0 < self._demand < UNBOUNDED:
                    self._demand -= 1
            subscriber.on_next(message)
        with self._lock:
            subscriber = self._subscriber
            terminal = not self._terminated and subscriber is not None and (
                self._failure is not None or (self._completed and not self._buffer))
        if terminal:
            if self._failure is not None:
                self._fail_now()
            else:
                with self._lock:
                    self._terminated = True
                    self._subscriber = None
                assert subscriber is not None  # noqa: S101  narrows an Optional for mypy: set before this point
                subscriber.on_complete()


def _retrieve(future: asyncio.Future[None]) -> None:
    if not future.cancelled():
        future.exception()


async def _after(outcome: Any, future: AnyFuture) -> None:
    try:
        await outcome
    except BaseException as error:
        _settle(future, error)
        raise
    _settle(future, None)
