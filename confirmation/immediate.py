"""Confirmations sent right after their message's final commit, a group at a time.

The engine awaits :meth:`ConfirmationService.on_final_state <openroute.confirmation.ConfirmationService.on_final_state>`
for every message it makes final. Sending each confirmation on its own cost five transactions (make sure the row
exists, read it, claim it, read the message, record the outcome), three of them with a commit of their own. Here the
messages made final while a claim runs wait for the next one, and one transaction claims every due row of the group
(one ``UPDATE ... RETURNING``) and reads their messages; each confirmation is then sent and recorded on its own, as
:meth:`~openroute.confirmation.ConfirmationService.process_due` does, so a slow source system holds up no other.
The claim's transaction is the service's :attr:`~openroute.confirmation.ConfirmationService.transact`: in a node, the
engine's group commit (the claim shares the transaction that writes the messages, no commit of its own).

A message whose row the claim did not find (none made in its final transaction, or another node's pass claimed it
first) takes the one-message path: the row is made if missing, then sent if due.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable
from datetime import datetime
from typing import Any, Protocol

import sqlalchemy as sa
from openroute.confirmation.model import ConfirmationRequest
from openroute.confirmation.policy import ConfirmationPolicy
from openroute.confirmation.requests import request_from_message, requests_for
from openroute.persistence import confirmations as table
from openroute.persistence.delivery import Transact
from openroute.persistence.models import MessageState

__all__ = ["ImmediateSends"]


class Sender(Protocol):
    """What the immediate sends use of their :class:`~openroute.confirmation.ConfirmationService`."""

    engine: sa.Engine
    node_id: str
    transact: Transact
    policy: ConfirmationPolicy
    batch_size: int

    def now(self) -> datetime: ...

    async def enqueue(self, request: ConfirmationRequest) -> bool: ...

    async def send_now(self, message_id: int) -> Any: ...

    async def send_claimed(self, row: sa.Row[Any], attempt: int, request: ConfirmationRequest | str) -> Any: ...


class ImmediateSends:
    """The immediate sends of one :class:`~openroute.confirmation.ConfirmationService` (see the module docstring)."""

    def __init__(self, service: Sender) -> None:
        self._service = service
        #: message id -> (the final message, the callers waiting for its confirmation's send)
        self._waiting: dict[int, tuple[Any, list[asyncio.Future[None]]]] = {}
        self._claiming: asyncio.Task[None] | None = None
        self._sending: set[asyncio.Future[Any]] = set()

    async def send(self, message: Any) -> None:
        """Send the confirmation of ``message`` (a final ``StoredMessage``) if it is due; return once it was sent and
        its outcome recorded (or found not due). Raises what claiming its group raised (the store unreachable)."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.setdefault(message.id, (message, []))[1].append(future)
        if self._claiming is None:
            self._claiming = asyncio.ensure_future(self._claim_waiting())
        await future

    async def _claim_waiting(self) -> None:
        try:
            while self._waiting:
                ids = list(self._waiting)[: self._service.batch_size]
                group = {message_id: self._waiting.pop(message_id) for message_id in ids}
                try:
                    claimed, requests = await self._service.transact(functools.partial(self._claim, ids))
                except Exception as error:
                    for _message, futures in group.values():
                        _settle(futures, error)
                    continue
                for row in claimed:
                    _message, futures = group.pop(row.message_id)
                    self._start(self._service.send_claimed(row, row.attempts, requests[row.message_id]), futures)
                for message, futures in group.values():
                    self._start(self._one(message), futures)
        finally:
            self._claiming = None

    def _claim(self, ids: list[int],
               connection: sa.Connection) -> tuple[list[sa.Row[Any]], dict[int, ConfirmationRequest | str]]:
        """In the caller's transaction: the due rows of ``ids`` claimed for this node, and what to send for each."""
        service = self._service
        now = service.now()
        claimed = table.claim_of_messages(connection, ids, now, now + service.policy.claim_timeout, service.node_id)
        messages = table.messages(connection, [row.message_id for row in claimed]) if claimed else {}
        return claimed, requests_for(claimed, messages)

    async def _one(self, message: Any) -> None:
        """The one-message path: the row made if it is missing, then sent if due."""
        await self._service.enqueue(request_from_message(message, MessageState(message.state).value))
        await self._service.send_now(message.id)

    def _start(self, sending: Awaitable[Any], futures: list[asyncio.Future[None]]) -> None:
        task: asyncio.Future[Any] = asyncio.ensure_future(sending)
        self._sending.add(task)  # held until done: the loop keeps only weak references to tasks
        task.add_done_callback(lambda done: self._sent(done, futures))

    def _sent(self, done: asyncio.Future[Any], futures: list[asyncio.Future[None]]) -> None:
        self._sending.discard(done)
        error = None if done.cancelled() else done.exception()
        _settle(futures, error)


def _settle(futures: list[asyncio.Future[None]], error: BaseException | None) -> None:
    for future in futures:
        if future.done():  # its caller was cancelled
            continue
        if error is None:
            future.set_result(None)
        else:
            future.set_exception(error)
