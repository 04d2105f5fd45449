"""The acks of one AMQP channel, sent together (``basic.ack`` with ``multiple``) once per event-loop turn."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from openroute.messaging.errors import ChannelClosedError


class Acks:
    """The acks of one AMQP channel, sent together once per loop turn: those of deliveries below the oldest one still
    undecided (or being rejected) as one ``basic.ack`` with ``multiple``, any above it each on its own, so an ack
    never waits for an earlier delivery and never covers one that is still open.

    A delivery counts as open from its arrival until its ack is decided or its reject has been written. Deliveries
    start in the order of their tags; the lowest open tag is looked up, not assumed.
    """

    __slots__ = ("acked", "channel", "closed", "loop", "open", "scheduled", "sending")

    def __init__(self, channel: Any, closed: Callable[[], bool]) -> None:
        self.channel = channel  # aiormq's channel of the deliveries: tags restart on a reopened channel
        self.closed = closed  # the consumer's channel is closed: the broker requeues what was not acked
        self.open: set[int] = set()
        self.acked: list[tuple[int, asyncio.Future[None]]] = []  # decided, not yet sent
        self.scheduled = False
        self.loop = asyncio.get_running_loop()
        self.sending: set[asyncio.Future[None]] = set()  # the loop keeps tasks only weakly

    def ack(self, tag: int, finished: asyncio.Future[None]) -> None:
        self.open.discard(tag)
        self.acked.append((tag, finished))
        if not self.scheduled:  # once the loop ran what is ready: the others of the same commit are acked by then
            self.scheduled = True
            self.loop.call_soon(self.flush)

    def flush(self) -> None:
        self.scheduled = False
        acked, self.acked = self.acked, []
        if self.closed():  # the broker requeues unacked deliveries of a closed channel by itself
            _finish(acked, None)
            return
        low = min(self.open) if self.open else None
        below = [tag for tag, _ in acked if low is None or tag < low]
        alone = [tag for tag, _ in acked if low is not None and tag > low]
        self.sending.add(sent := asyncio.ensure_future(self._send(max(below) if below else None, alone)))

        def done(task: asyncio.Future[None]) -> None:
            self.sending.discard(task)
            _finish(acked, task)

        sent.add_done_callback(done)

    async def _send(self, up_to: int | None, alone: list[int]) -> None:
        if up_to is not None:
            await self.channel.basic_ack(up_to, multiple=True)
        for tag in alone:
            await self.channel.basic_ack(tag)


def _finish(covered: list[tuple[int, asyncio.Future[None]]], task: asyncio.Future[None] | None) -> None:
    error: BaseException | None = None
    if task is not None:
        error = ChannelClosedError("settling the delivery was cancelled") if task.cancelled() else task.exception()
    for _, finished in covered:
        if finished.done():
            continue
        if error is None:
            finished.set_result(None)
        else:
            finished.set_exception(error)
            finished.exception()  # retrieved: nobody may be waiting for it
