"""The delivery family: a row written in a final state's transaction, sent after the commit, leased and retried.

Two kinds follow this one discipline, each with its table and its SQL (a :class:`LeasedRows`):

* confirmations (table ``confirmation``, :mod:`openroute.persistence.confirmations`), sent to the message's source
  system by ``openroute.confirmation.ConfirmationService``;
* outcome events (table ``outbox``, :mod:`openroute.persistence.outbox`), published to channels by
  ``openroute.engine.outbox.OutboxPublisher``.

The discipline, one transaction per step (:class:`Leases`):

* **claim**: the due rows, oldest first (in the kind's order: an outcome event waits for the older events of its
  message), leased to one node until ``now + lease``; of two nodes racing for a row exactly one gets it.
* **renew**: a claim this node still holds is pushed by one lease while its send runs (False once another node took
  it after the lease ran out).
* **settle**: sent (the kind keeps the row as SENT or deletes it), or failed: due again at the retry time the
  kind's back-off gives (:func:`backoff`, a retry policy), or given up.
* **release**: a node starting again makes what it had leased before due at once (nobody is sending it any more).

:class:`DeliverySender` is the one sender over it: one claim sent on its own with its lease renewed meanwhile and its
outcome recorded at once (confirmations: a slow source system holds up no other), or a round sent together and
settled in one transaction (outcome events). Where a settle's transaction runs is the sender's :class:`Transact`:
by default a transaction of its own on a worker thread (:func:`on_thread`); a node gives its confirmations the
engine's group commit instead, so their records share the transactions that write the messages.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Generic, Protocol, TypeVar

import sqlalchemy as sa

__all__ = ["Attempt", "Claimed", "DeliverySender", "LeasedRows", "Leases", "Transact", "backoff", "on_thread"]

log = logging.getLogger("openroute.delivery")

C = TypeVar("C")
T = TypeVar("T")


class Transact(Protocol):
    """Runs ``work(connection)`` (blocking database work) in a transaction off the event loop; awaited: its result
    once committed. A failure rolls the transaction back and is raised to the caller. :func:`on_thread` is the plain
    one; the engine's group-commit writer (``GroupCommitWriter.submit``) is another, whose transaction ``work`` may
    share with other writes."""

    def __call__(self, work: Callable[[sa.Connection], T], /) -> Awaitable[T]:
        """``work`` run in a transaction; its result after the commit."""
        ...


def on_thread(database: sa.Engine) -> Transact:
    """The plain :class:`Transact` over ``database``: every call a transaction of its own on a worker thread."""

    def transact(work: Callable[[sa.Connection], T], /) -> Awaitable[T]:
        def run() -> T:
            with database.begin() as connection:
                return work(connection)

        return asyncio.to_thread(run)

    return transact


@dataclass(frozen=True)
class Claimed(Generic[C]):
    """What one claim found: the rows this node leased (``claims``), how many due rows it looked at (``seen``: those
    leased plus those another node leased first) and the id of the last one (the next claim starts after it)."""

    claims: list[C]
    seen: int
    last_id: int


class LeasedRows(Protocol[C]):
    """The SQL of one kind of the family; every function runs in the caller's transaction (``connection``)."""

    def claim_due(self, connection: sa.Connection, node_id: str, now: datetime, lease_until: datetime, limit: int,
                  after_id: int) -> Claimed[C]:
        """Lease up to ``limit`` rows due at ``now`` with id > ``after_id`` to ``node_id``, oldest first."""

    def renew(self, connection: sa.Connection, claim: C, node_id: str, lease_until: datetime) -> bool:
        """Push the lease of ``claim`` to ``lease_until``; False when the claim is no longer this node's."""

    def sent(self, connection: sa.Connection, claims: Sequence[C], now: datetime) -> list[bool]:
        """Record ``claims`` as delivered; per claim, False when it was no longer this node's."""

    def failed(self, connection: sa.Connection, claim: C, now: datetime, retry_at: datetime | None,
               error: str) -> bool:
        """Record a failed attempt: due again at ``retry_at`` (None: given up); False when no longer this node's."""

    def release(self, connection: sa.Connection, node_id: str, now: datetime, leased_before: datetime) -> int:
        """Make the rows ``node_id`` leased before ``leased_before`` due at ``now``; returns how many."""


def backoff(first: timedelta, failures: int, longest: timedelta) -> timedelta:
    """The wait before the next attempt after ``failures`` failed ones: ``first`` doubled per failure, at most
    ``longest``."""
    doubled: timedelta = first * (2 ** min(max(failures, 0), 30))
    return min(doubled, longest)


class Leases(Generic[C]):
    """The discipline's steps over the rows of one kind on ``database``, for ``node_id``, each in a transaction of
    its own (blocking: the senders call them on a worker thread)."""

    def __init__(self, database: sa.Engine, rows: LeasedRows[C], node_id: str) -> None:
        self.database = database
        self.rows = rows
        self.node_id = node_id

    def claim(self, now: datetime, lease: timedelta, limit: int, after_id: int = 0) -> Claimed[C]:
        """Lease up to ``limit`` due rows (id > ``after_id``) to this node until ``now + lease``."""
        with self.database.begin() as connection:
            return self.rows.claim_due(connection, self.node_id, now, now + lease, limit, after_id)

    def renew(self, claim: C, now: datetime, lease: timedelta) -> bool:
        """Push the lease of ``claim`` to ``now + lease``; False when another node holds the row now."""
        with self.database.begin() as connection:
            return self.rows.renew(connection, claim, self.node_id, now + lease)

    def settle(self, now: datetime, outcomes: Sequence[tuple[C, str | None, datetime | None]]) -> list[bool]:
        """Record what became of claims, in one transaction: per (claim, error, retry_at) sent when ``error`` is
        None, else failed and due at ``retry_at`` (None: given up). Per outcome, False when no longer this node's."""
        with self.database.begin() as connection:
            return self.settle_in(connection, now, outcomes)

    def settle_in(self, connection: sa.Connection, now: datetime,
                  outcomes: Sequence[tuple[C, str | None, datetime | None]]) -> list[bool]:
        """:meth:`settle` in the caller's transaction."""
        sent = iter(self.rows.sent(connection, [claim for claim, error, _ in outcomes if error is None], now))
        return [next(sent) if error is None else self.rows.failed(connection, claim, now, retry_at, error)
                for claim, error, retry_at in outcomes]

    def release(self, now: datetime, leased_before: datetime) -> int:
        """Make what this node leased before ``leased_before`` due ``now`` (it restarted); returns how many."""
        with self.database.begin() as connection:
            return self.rows.release(connection, self.node_id, now, leased_before)


class Attempt(StrEnum):
    """What became of one claimed attempt."""

    SENT = "sent"
    #: failed, due again at its retry time
    RETRY = "retry"
    #: failed for the last time
    FAILED = "failed"
    #: the claim expired while sending: another node holds the row now
    LOST = "lost"


class DeliverySender(Generic[C]):
    """The one sender of the family over ``leases``: ``retry_at(claim, error, now)`` is the kind's back-off (None:
    give up); ``now`` its clock; ``lease()`` the lease a claim gets and a renewal adds. ``transact`` runs the
    transactions that record outcomes (default: :func:`on_thread` over the leases' database)."""

    def __init__(self, leases: Leases[C], retry_at: Callable[[C, datetime], datetime | None],
                 now: Callable[[], datetime], lease: Callable[[], timedelta], transact: Transact | None = None) -> None:
        self.leases = leases
        self._retry_at = retry_at
        self._now = now
        self._lease = lease
        #: where outcomes are recorded (see :class:`Transact`)
        self.transact: Transact = transact or on_thread(leases.database)
        # attempts done and waiting for their record: those that end while a record is written share the next one
        self._to_settle: list[tuple[C, str | None, asyncio.Future[Attempt]]] = []
        self._settling: asyncio.Future[None] | None = None

    def claim(self, now: datetime, limit: int, after_id: int = 0) -> Claimed[C]:
        """Lease up to ``limit`` due rows to this node (blocking)."""
        return self.leases.claim(now, self._lease(), limit, after_id)

    def _outcome(self, claim: C, error: str | None, now: datetime) -> tuple[C, str | None, datetime | None]:
        return claim, error, None if error is None else self._retry_at(claim, now)

    async def attempt(self, claim: C, sending: Awaitable[str | None], what: str) -> tuple[Attempt, str | None]:
        """Await ``sending`` (None: delivered, else why not) while this node's lease on ``claim`` is renewed every
        third of a lease, then record its outcome; returns it with the error (``what`` names the row in the log).

        Each attempt is sent on its own (a slow receiver holds up no other); the outcomes of the attempts that end
        while a record is being written are recorded together in the next transaction (a group commit: one per
        attempt cost the node a transaction per confirmation). A record that fails for the group is written again
        one by one, so one row's failure is its own."""
        keeper = _Keeper(self, claim, what)
        try:
            error = await sending
        finally:
            await keeper.stop()
        recorded: asyncio.Future[Attempt] = asyncio.get_running_loop().create_future()
        self._to_settle.append((claim, error, recorded))
        if self._settling is None:
            self._settling = asyncio.ensure_future(self._settle_waiting())
        return await recorded, error

    async def _settle_waiting(self) -> None:
        try:
            while self._to_settle:
                group, self._to_settle = self._to_settle, []
                pairs = [(claim, error) for claim, error, _ in group]
                try:
                    results: list[Attempt | BaseException] = list(await self._record(pairs))
                except Exception as failure:
                    # written one by one again, so that one row's failure stays its own
                    results = [failure] if len(group) == 1 else [await self._settle_alone(pair) for pair in pairs]
                for (_claim, _error, recorded), result in zip(group, results, strict=True):
                    if recorded.done() or recorded.get_loop().is_closed():  # its caller was cancelled, or its loop
                        continue
                    if isinstance(result, BaseException):
                        recorded.set_exception(result)
                    else:
                        recorded.set_result(result)
        finally:
            self._settling = None

    async def _settle_alone(self, pair: tuple[C, str | None]) -> Attempt | BaseException:
        try:
            return (await self._record([pair]))[0]
        except Exception as failure:
            return failure

    def _record(self, pairs: Sequence[tuple[C, str | None]]) -> Awaitable[list[Attempt]]:
        """The outcomes of ``pairs`` (claim, error) recorded in one transaction of :attr:`transact`."""
        return self.transact(lambda connection: self._settle(connection, pairs))

    def _settle(self, connection: sa.Connection, pairs: Sequence[tuple[C, str | None]]) -> list[Attempt]:
        now = self._now()
        outcomes = [self._outcome(claim, error, now) for claim, error in pairs]
        held = self.leases.settle_in(connection, now, outcomes)
        return [Attempt.LOST if not still_held else Attempt.SENT if error is None
                else Attempt.RETRY if retry_at is not None else Attempt.FAILED
                for still_held, (_claim, error, retry_at) in zip(held, outcomes, strict=True)]

    async def _keep(self, claim: C, what: str) -> None:
        """Renew the lease on ``claim`` now and every third of a lease after (a third of a lease has passed)."""
        period = self._lease().total_seconds() / 3
        while True:
            try:
                if not await asyncio.to_thread(self.leases.renew, claim, self._now(), self._lease()):
                    log.warning("%s: claim lost while sending", what)
                    return
            except sa.exc.SQLAlchemyError as error:  # the database briefly away: try again next period
                log.warning("%s: claim not renewed: %s", what, str(error).splitlines()[0][:200])
            await asyncio.sleep(period)

    async def round(self, claims: Sequence[C], send: Callable[[C], Awaitable[str | None]]) -> list[str | None]:
        """Send every claim at once (each: None when delivered, else why not), then record every outcome in one
        transaction; returns the errors in the order of ``claims``."""
        errors = list(await asyncio.gather(*(send(claim) for claim in claims)))
        await self._record(list(zip(claims, errors, strict=True)))
        return errors


class _Keeper(Generic[C]):
    """The lease renewals of one attempt: a timer until a third of a lease has passed, then a task renewing every
    third of a lease (:meth:`DeliverySender._keep`) until :meth:`stop`. Nearly every send ends long before, so it
    costs a timer set and cancelled, not a task made, run, cancelled and awaited per send."""

    __slots__ = ("_claim", "_sender", "_task", "_timer", "_what")

    def __init__(self, sender: DeliverySender[C], claim: C, what: str) -> None:
        self._sender, self._claim, self._what = sender, claim, what
        self._task: asyncio.Task[None] | None = None
        self._timer = asyncio.get_running_loop().call_later(sender._lease().total_seconds() / 3, self._start)

    def _start(self) -> None:
        self._task = asyncio.ensure_future(self._sender._keep(self._claim, self._what))

    async def stop(self) -> None:
        """No renewal after this returns (one under way is cancelled)."""
        self._timer.cancel()
        task = self._task
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
