"""Persisted confirmations: owed once per final message, retried on their own schedule, never sent twice.

Life of a confirmation row (table ``confirmation``, one per message):

* :meth:`ConfirmationService.enqueue` (the engine's final-state hook) or :meth:`~ConfirmationService.sweep_missing`
  (repair) inserts it PENDING, due now. A second insert for the same message is a no-op (unique ``message_id``).
* :meth:`~ConfirmationService.process_due` claims each due PENDING row with a conditional update that bumps
  ``attempts``, records the node in ``claimed_by`` and pushes ``next_attempt_at`` by the policy's ``claim_timeout``
  (a short lease, 15 s by default, renewed every third of it while the send runs): of two nodes racing for a row
  exactly one update matches. Only the claimant sends. A node that dies stops renewing, so its claims are taken
  again by another node (or itself after a restart) within ``claim_timeout`` plus one pass ``interval``.
* Success -> SENT with ``sent_at``; it is never selected again. Failure -> ``last_error`` and the next due time per
  :class:`~confirmation.ConfirmationPolicy`; attempts exhausted -> FAILED, kept for the admin API.

The request sent is rebuilt from the message row at send time; the row keeps only the message id and the
confirmation's stable ``confirmation_id`` (a UUID made with the row, and made anew when a restarted message is
confirmed again with a new outcome). Delivery is at-least-once at the transport level: if a node dies after the
peer accepted but before SENT is committed, the row is sent again after the lease with the same confirmation id, so
a source system that drops repeats by that id sees each confirmation at most once. Messages held for an operator
(error code ``CALL_IN_DOUBT``) are not confirmed until they reach their real outcome.

Only a :attr:`~confirmation.ConfirmationCallback.durable` callback's confirmations get rows. One that is not (the
default, which logs) is called once per confirmed message from :meth:`ConfirmationService.on_final_state`, right
after the final commit: no row, no claim, no SENT record, no retry and no repair sweep, since there is nothing to
deliver that could fail; a node that dies between the final commit and that call leaves its line unwritten. Rows
that exist all the same (made by an earlier version, which kept rows for the log too, or by :meth:`enqueue`) are
still sent by :meth:`~ConfirmationService.process_due`.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa
from openroute.confirmation.callbacks import ConfirmationCallback
from openroute.confirmation.immediate import ImmediateSends
from openroute.confirmation.model import (
    CONFIRMED_STATES,
    ConfirmationInfo,
    ConfirmationRequest,
    ConfirmationSendError,
    InvalidConfirmationError,
    ProcessReport,
)
from openroute.confirmation.policy import ConfirmationPolicy
from openroute.confirmation.ports import Clock, ConfirmationSpan, ErrorLog, PlainErrorLog, no_span, now_function
from openroute.confirmation.requests import HELD_ERROR_CODE, is_held, request_from_message, requests_for
from openroute.persistence import confirmations as table
from openroute.persistence.confirmations import ConfirmationClaim
from openroute.persistence.delivery import Attempt, Claimed, DeliverySender, Leases, Transact, on_thread
from openroute.persistence.models import ConfirmationStatus, MessageState
from openroute.persistence.outage import StoreOutage, describe_error, is_store_unreachable, run_passes
from openroute.persistence.secrets import mask_secrets

log = logging.getLogger("openroute.confirmation")

_MAX_ERROR = 2000
#: how far before the start of the last complete sweep the sweeps of :meth:`ConfirmationService.run` look back (a
#: final commit in flight during that sweep, the clocks of other nodes)
SWEEP_OVERLAP = timedelta(minutes=1)


#: what became of one claimed attempt (the delivery family's :class:`~openroute.persistence.delivery.Attempt`)
AttemptOutcome = Attempt


_INFO_FIELDS = tuple(ConfirmationInfo.__dataclass_fields__)


def _engine_of(store_or_engine: object) -> sa.Engine:
    if isinstance(store_or_engine, sa.Engine):
        return store_or_engine
    engine = getattr(store_or_engine, "engine", None)
    if isinstance(engine, sa.Engine):
        return engine
    raise InvalidConfirmationError(
        f"expected a MessageStore (with .engine) or a sqlalchemy Engine, got {type(store_or_engine).__name__}"
    )


def _info(row: sa.Row[Any]) -> ConfirmationInfo:
    values = {name: getattr(row, name) for name in _INFO_FIELDS}
    values["outcome_state"] = MessageState(row.outcome_state).value
    values["status"] = ConfirmationStatus(row.status).value
    return ConfirmationInfo(**values)


class ConfirmationService:
    """Persists, sends and retries confirmations through ``callback`` (see the module docstring).

    ``store_or_engine`` is a ``persistence.MessageStore`` (its ``engine`` is used) or a SQLAlchemy ``Engine`` on the
    store's database. ``batch_size`` rows are claimed per query and at most ``concurrency`` are sent at once, so a
    slow or failing system never holds up the others; each send is also bounded by ``send_timeout`` seconds (its
    claim renewed meanwhile). ``node_id`` is recorded in ``claimed_by`` (default: host name and process id).
    Database work runs in worker threads so the event loop is never blocked. ``span`` makes the span of each attempt
    and ``error_log`` logs a callback's unexpected errors (:mod:`~openroute.confirmation.ports`: the composition root
    gives the runtime's tracing and ``repeated_errors``; default: no span, every traceback).
    """

    def __init__(
        self,
        store_or_engine: object,
        callback: ConfirmationCallback,
        policy: ConfirmationPolicy | None = None,
        clock: Clock | Callable[[], datetime] | None = None,
        *,
        batch_size: int = 100,
        concurrency: int = 8,
        send_timeout: float = 300.0,
        node_id: str | None = None,
        span: ConfirmationSpan | None = None,
        error_log: ErrorLog | None = None,
    ) -> None:
        if not isinstance(callback, ConfirmationCallback):
            raise InvalidConfirmationError(f"callback must be a ConfirmationCallback, got {callback!r}")
        for name, value in (("batch_size", batch_size), ("concurrency", concurrency)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InvalidConfirmationError(f"{name} must be an int >= 1, got {value!r}")
        if isinstance(send_timeout, bool) or not isinstance(send_timeout, int | float) or send_timeout <= 0:
            raise InvalidConfirmationError(f"send_timeout must be a positive number of seconds, got {send_timeout!r}")
        self.engine = _engine_of(store_or_engine)
        self.node_id = node_id or f"{socket.gethostname()}-{os.getpid()}"
        self._send_timeout = float(send_timeout)
        self._span = span or no_span
        self._errors = error_log or PlainErrorLog()
        self.callback = callback
        #: whether confirmations are kept as rows (the callback's :attr:`~ConfirmationCallback.durable`, read once)
        self.durable = callback.durable
        self.policy = policy or ConfirmationPolicy()
        self._now = now_function(clock)
        #: confirmations claimed per query (:meth:`process_due`), and per group of immediate sends
        self.batch_size = batch_size
        self._concurrency = concurrency
        self._created_at = self.now()
        #: the ``updated_since`` of the next :meth:`sweep_recent` (None: every final message)
        self._sweep_from: datetime | None = None
        #: whether the confirmation loop finds the store unreachable (persistence/outage.py)
        self.outage = StoreOutage.of_loop("confirmation loop")
        #: where the immediate sends' claims and every attempt's outcome are written (see :meth:`write_through`)
        self.transact: Transact = on_thread(self.engine)
        self._immediate = ImmediateSends(self)
        #: the delivery family's sender over the confirmation rows (persistence/delivery.py)
        self._sender = DeliverySender(Leases(self.engine, table.ConfirmationRows(), self.node_id), self._retry_at,
                                      self.now, self._lease, self.transact)

    def write_through(self, transact: Transact) -> None:
        """Write the immediate sends' claims and the outcomes of every attempt through ``transact`` (the composition
        root gives the engine's group commit, ``Engine.transact``) instead of a transaction of their own each on a
        worker thread: they share the transactions that write the messages, and commit with them.

        Nothing else changes: a claim or a record that fails leaves its row PENDING (due again once its lease runs
        out), and the passes of :meth:`process_due` claim in transactions of their own."""
        self.transact = self._sender.transact = transact

    def now(self) -> datetime:
        """The service's current time (the injected clock), checked to be timezone-aware."""
        now = self._now()
        if not isinstance(now, datetime) or now.tzinfo is None:
            raise InvalidConfirmationError(f"the clock must return an aware datetime, got {now!r}")
        return now

    # -- creating rows ------------------------------------------------------------------------------------------

    def enqueue_in(self, request: ConfirmationRequest, connection: sa.Connection | None = None) -> bool:
        """Synchronous :meth:`enqueue`; with ``connection`` it joins that transaction, so the engine can commit a
        message's final state and its confirmation row together (then nothing can be lost in between).
        """
        if not isinstance(request, ConfirmationRequest):
            raise InvalidConfirmationError(f"expected a ConfirmationRequest, got {request!r}")
        if isinstance(request.message_id, bool) or not isinstance(request.message_id, int):
            raise InvalidConfirmationError(
                f"persisted confirmations need the store's integer message id, got {request.message_id!r}"
            )
        if not self.callback.confirms(request.source_system):
            return False
        row = table.pending_row(request.message_id, request.source_system, request.state, self.now())
        try:
            if connection is not None:
                with connection.begin_nested():  # a savepoint, so a failure leaves the caller's transaction usable
                    return table.add_pending(connection, [row]) == 1
            with self.engine.begin() as own:
                return table.add_pending(own, [row]) == 1
        except sa.exc.IntegrityError as error:
            # the only other constraint is the foreign key: the message must exist in the store
            raise InvalidConfirmationError(f"message {request.message_id} is not in the store") from error

    async def enqueue(self, request: ConfirmationRequest) -> bool:
        """Persist the confirmation PENDING, due now; ``False`` (a no-op) if the message already has one or the
        callback does not confirm its source system. Raises :class:`~confirmation.InvalidConfirmationError` for a
        message id that is not an int of the store.
        """
        return await asyncio.to_thread(self.enqueue_in, request)

    def on_final_state_tx(self, message: Any, connection: sa.Connection) -> None:
        """Engine hook run inside the transaction that made ``message`` final (a ``persistence.StoredMessage``):
        inserts its confirmation row in that transaction. SKIPPED messages, unconfirmed systems and child
        messages of a split (their parent's outcome is what the source system is told) get none.

        A restarted message reaching its next final state already has a row (of its earlier outcome): the row is
        reset to PENDING with the new outcome and a new confirmation id, so the source system is confirmed again.
        A message held for an operator (error code CALL_IN_DOUBT) gets no row until it reaches its real outcome.
        """
        self.on_final_states_tx([message], connection)

    def on_final_states_tx(self, messages: Sequence[Any], connection: sa.Connection) -> None:
        """:meth:`on_final_state_tx` for every message one transaction made final (the engine's group commit makes
        many): their rows inserted in one statement. Nothing for a callback that is not :attr:`durable`."""
        if not self.durable:
            return
        now = self.now()
        owed = {}
        for message in messages:
            state = self._owed(message)
            if state is not None:
                owed[message.id] = table.pending_row(message.id, message.source_system, state, now)
        if not owed:
            return
        # no savepoint (two round trips in the engine's group commit): the message rows are in this transaction, so
        # the insert cannot fail on its foreign key, and a row already there is no error
        inserted = table.inserted_pending(connection, list(owed.values()))
        for message_id, row in owed.items():
            if message_id not in inserted:
                # a row made before this transaction belongs to an earlier final state: the message was restarted
                # since, and the source system is told the new outcome (the row starts over, PENDING)
                table.reset_pending(connection, message_id, row["outcome_state"].value, now)

    def _owed(self, message: Any) -> str | None:
        """The state ``message`` owes its source a confirmation of (None: SKIPPED, a child, held, unconfirmed)."""
        state = MessageState(message.state).value
        owed = state in CONFIRMED_STATES and getattr(message, "parent_id", None) is None and not is_held(message)
        return state if owed and self.callback.confirms(message.source_system) else None

    async def on_final_state(self, message: Any) -> None:
        """Engine hook awaited after the final commit: sends the confirmation at once, with those of the other
        messages made final meanwhile (:class:`~openroute.confirmation.immediate.ImmediateSends`: one transaction
        claims the group's rows); a message without a row gets one first (idempotent). A callback that is not
        :attr:`durable` is called here once, with no row (:meth:`confirm_without_row`).

        Never raises: a failure here leaves a PENDING row (or a final message the sweep finds) that
        :meth:`process_due` / :meth:`run` picks up.
        """
        state = self._owed(message)
        if state is None:
            return
        if not self.durable:
            await self.confirm_without_row(message, state)
            return
        try:
            await self._immediate.send(message)
        except Exception as error:
            if not self.outage.failed(error, f"confirming message {message.id}"):  # the loop sends it once it is back
                self._errors.log(log, "immediate confirmation of message %s failed; it is retried by process_due",
                                    message.id, error=error)

    async def confirm_without_row(self, message: Any, state: str) -> None:
        """Call the callback once for ``message`` (final in ``state``), keeping no row: the confirmation of a callback
        that is not :attr:`durable`. Never raises: an error of the callback is logged, and not retried."""
        request = request_from_message(message, state)
        try:
            with self._span(request.traceparent, message.id, request.source_system, state, 1):
                await self.callback.confirm(request)
        except Exception as error:  # nothing to retry from: the callback said its confirmations need no row
            self._errors.log(log, "confirmation callback raised for message %s; not retried (its callback keeps no "
                             "rows)", message.id, error=error)

    async def sweep_missing(self, limit: int = 1000, *, updated_since: datetime | None = None) -> int:
        """Create the confirmations of final (OK / FAILED / CANCEL) messages that have none; return how many.

        Repairs "never lost": a node that died between a message's final commit and :meth:`enqueue` leaves no row.
        Messages of source systems the callback does not confirm are left alone, and a callback that is not
        :attr:`durable` gets no rows (0). At most ``limit`` per call;
        ``updated_since`` restricts the scan to messages whose last update is at or after it (cheaper on a big
        store, e.g. the last day).
        """
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise InvalidConfirmationError(f"limit must be an int >= 1, got {limit!r}")
        if updated_since is not None and (not isinstance(updated_since, datetime) or updated_since.tzinfo is None):
            raise InvalidConfirmationError(f"updated_since must be an aware datetime, got {updated_since!r}")
        now = self.now()
        systems = self.callback.confirmed_systems()
        if not self.durable or (systems is not None and not systems):
            return 0

        def work() -> int:
            with self.engine.begin() as connection:
                found = table.without_confirmation(connection, CONFIRMED_STATES, HELD_ERROR_CODE, limit,
                                                   updated_since, systems)
                rows = [
                    table.pending_row(r.id, r.source_system, MessageState(r.state).value, now)
                    for r in found
                    if self.callback.confirms(r.source_system)
                ]
                return table.add_pending(connection, rows) if rows else 0

        created = await asyncio.to_thread(work)
        if created:
            log.warning("created %d missing confirmation(s) of final messages", created)
        return created

    async def sweep_recent(self, limit: int = 1000) -> int:
        """The repair sweep of :meth:`run`: :meth:`sweep_missing` over every final message until a sweep finds fewer
        than ``limit`` missing (all caught up), then only over the messages updated since that sweep began (less
        :data:`SWEEP_OVERLAP`); returns how many it created.

        A sweep over every message reads the whole table (1.8 s of PostgreSQL with 1,000,000 confirmed messages,
        every ``interval``); one over the recent ones reads a range of the ``last_update_ts`` index. A node that died
        between a final commit and :meth:`enqueue` is covered while another node runs (its message was updated
        since), and by the full sweep of the next start otherwise.
        """
        started = self.now()
        created = await self.sweep_missing(limit, updated_since=self._sweep_from)
        if created < limit:
            self._sweep_from = started - SWEEP_OVERLAP
        return created

    # -- sending ------------------------------------------------------------------------------------------------

    def _claim_batch(self, now: datetime, after_id: int, message_id: int | None = None) -> Claimed[ConfirmationClaim]:
        """Claim up to batch_size due rows with id > after_id (or the one of ``message_id``)."""
        leases = Leases(self.engine, table.ConfirmationRows(message_id), self.node_id)
        return leases.claim(now, self.policy.claim_timeout, self.batch_size, after_id)

    def _load_requests(self, claimed: list[ConfirmationClaim]) -> dict[int, ConfirmationRequest | str]:
        with self.engine.connect() as connection:
            messages = table.messages(connection, [claim.row.message_id for claim in claimed])
        return requests_for((claim.row for claim in claimed), messages)

    def _lease(self) -> timedelta:
        return self.policy.claim_timeout

    def _retry_at(self, claim: ConfirmationClaim, now: datetime) -> datetime | None:
        """When a failed attempt is due again per the policy; None once it is exhausted."""
        return None if self.policy.exhausted(claim.attempt) else now + self.policy.delay(claim.attempt)

    async def _attempt(self, row: sa.Row[Any], attempt: int, request: ConfirmationRequest | str) -> str | None:
        """Send the confirmation of ``row`` once; None when the callback took it, else why not (masked, cut)."""
        if isinstance(request, str):
            error: str | None = request
        else:
            span = self._span(request.traceparent, row.message_id, request.source_system, request.state, attempt)
            try:
                with span:  # while tracing is on: a span of the message's trace, its failure recorded
                    # asyncio.timeout, not wait_for: on Python 3.11 wait_for runs the send in a task of its own
                    async with asyncio.timeout(self._send_timeout):
                        await self.callback.confirm(request)
                error = None
            except ConfirmationSendError as failure:
                error = failure.reason
            except TimeoutError:
                error = f"no answer within the send timeout of {self._send_timeout:g} s"
            except Exception as failure:  # a broken callback is a failed attempt, never a lost confirmation
                self._errors.log(log, "confirmation callback raised for message %s", row.message_id, error=failure)
                error = f"{type(failure).__name__}: {failure}"
        if error is not None:
            error = mask_secrets(error)  # the target's URL may carry a password or key: stored as shown
            if len(error) > _MAX_ERROR:
                error = error[: _MAX_ERROR - 3] + "..."
        return error

    async def send_claimed(self, row: sa.Row[Any], attempt: int, request: ConfirmationRequest | str) -> Attempt:
        """Send the confirmation of ``row``, claimed by this node for ``attempt``, and record the outcome (a text
        ``request``: why there is nothing to send, a failed attempt); its lease is renewed while the send runs."""
        outcome, error = await self._sender.attempt(table.ConfirmationClaim(row, attempt),
                                                    self._attempt(row, attempt, request),
                                                    f"confirmation of message {row.message_id} (attempt {attempt})")
        if outcome is Attempt.SENT:
            log.info("confirmation of message %s (%s) sent (attempt %d)", row.message_id, row.outcome_state, attempt)
        elif outcome is Attempt.LOST:
            log.warning("confirmation of message %s: claim expired while sending (attempt %d); another node "
                        "owns it now", row.message_id, attempt)
        elif outcome is Attempt.FAILED:
            log.error("confirmation of message %s failed for good after %d attempts: %s",
                      row.message_id, attempt, error)
        elif outcome is Attempt.RETRY:
            log.info("confirmation of message %s failed (attempt %d), retried later: %s",
                     row.message_id, attempt, error)
        return outcome

    async def _process(self, message_id: int | None) -> ProcessReport:
        now = self.now()
        counts = dict.fromkeys(Attempt, 0)
        limiter = asyncio.Semaphore(self._concurrency)
        lost_claims, after_id, errors = 0, 0, 0

        async def one(row: sa.Row[Any], attempt: int, request: ConfirmationRequest | str) -> None:
            async with limiter:
                counts[await self.send_claimed(row, attempt, request)] += 1

        while True:
            batch = await asyncio.to_thread(self._claim_batch, now, after_id, message_id)
            claimed, after_id = batch.claims, batch.last_id
            lost_claims += batch.seen - len(claimed)
            if claimed:
                requests = await asyncio.to_thread(self._load_requests, claimed)
                # return_exceptions: one row whose outcome could not be written (database hiccup) must not orphan
                # the other sends; its lease expires and it is retried
                results = await asyncio.gather(
                    *(one(c.row, c.attempt, requests[c.row.message_id]) for c in claimed), return_exceptions=True
                )
                for result in results:
                    if isinstance(result, BaseException):
                        if not isinstance(result, Exception):
                            raise result
                        errors += 1
                        log.error("recording a confirmation attempt failed: %s", describe_error(result),
                                  exc_info=None if is_store_unreachable(result) else result)
            if batch.seen < self.batch_size:
                break
        return ProcessReport(
            sent=counts[Attempt.SENT],
            retry_scheduled=counts[Attempt.RETRY],
            given_up=counts[Attempt.FAILED],
            lost_claims=lost_claims + counts[Attempt.LOST],
            errors=errors,
        )

    async def process_due(self) -> ProcessReport:
        """Send every confirmation due now (once each per call); return what happened.

        Failures are recorded per row and never stop the others; rows a concurrent caller claimed first are
        skipped (counted in ``lost_claims``).
        """
        return await self._process(None)

    async def send_now(self, message_id: int) -> ProcessReport:
        """Send the confirmation of one message now if it is due (the engine calls this right after
        :meth:`enqueue` so the source system hears at once); otherwise do nothing. Same claim rules as
        :meth:`process_due`.
        """
        if isinstance(message_id, bool) or not isinstance(message_id, int):
            raise InvalidConfirmationError(f"message_id must be the store's integer id, got {message_id!r}")
        return await self._process(message_id)

    def release_own_claims(self) -> int:
        """Make the confirmations claimed by this ``node_id`` due now; returns how many.

        Called when the service starts: a node id belongs to one live process, so claims under it are left over
        from before a crash or restart and nobody is sending them (the same rule the engine applies to its own
        PROCESSING messages at start); claims made since this service was created are left alone. Without a stable
        node id the leases simply expire.
        """
        return self._sender.leases.release(self.now(), self._created_at)

    async def run(
        self, interval: float | timedelta, stop: asyncio.Event, *, sweep: bool = True,
        paused: Callable[[], bool] | None = None,
    ) -> None:
        """Sweep (:meth:`sweep_recent`) and process due confirmations every ``interval`` until ``stop`` is set;
        a pass is skipped while ``paused()`` is true (the server's: its node is STOPPED, it picks up no work).

        An error of one pass is logged and the next pass runs as usual; while the database is unreachable the log
        gets one WARNING and one INFO when it is back (``self.outage``), and the passes back off.
        """
        seconds = interval.total_seconds() if isinstance(interval, timedelta) else interval
        if isinstance(seconds, bool) or not isinstance(seconds, int | float) or seconds <= 0:
            raise InvalidConfirmationError(f"interval must be positive, got {interval!r}")
        try:
            released = await asyncio.to_thread(self.release_own_claims)
            if released:
                log.warning("took back %d confirmation(s) this node (%s) was sending when it stopped", released,
                            self.node_id)
        except Exception as error:  # the database not reachable yet: the leases expire on their own
            log.warning("claims of this node not taken back at start: %s", str(error).splitlines()[0][:200])

        async def one_pass() -> None:
            if paused is not None and paused():
                return
            if sweep:
                await self.sweep_recent()
            report = await self.process_due()
            if report.sent or report.retry_scheduled or report.given_up or report.errors:
                log.info("confirmation pass: %d sent, %d to retry, %d given up, %d not recorded",
                         report.sent, report.retry_scheduled, report.given_up, report.errors)

        await run_passes(one_pass, seconds, stop, self.outage, f"confirmation pass failed; retrying in {seconds} s",
                         log)

    # -- admin --------------------------------------------------------------------------------------------------

    async def get(self, message_id: int) -> ConfirmationInfo | None:
        """The confirmation of one message, or ``None`` if it has none."""

        def work() -> ConfirmationInfo | None:
            with self.engine.connect() as connection:
                row = table.get(connection, message_id)
            return None if row is None else _info(row)

        return await asyncio.to_thread(work)

    async def find(self, status: str | None = None, *, limit: int = 100, offset: int = 0) -> list[ConfirmationInfo]:
        """Confirmations (optionally of one status: PENDING, SENT, FAILED), most recently updated first."""
        for name, value, least in (("limit", limit, 1), ("offset", offset, 0)):
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise InvalidConfirmationError(f"{name} must be an int >= {least}, got {value!r}")
        try:
            wanted = None if status is None else ConfirmationStatus(status)
        except ValueError as error:
            raise InvalidConfirmationError(
                f"status must be one of {[s.value for s in ConfirmationStatus]}, got {status!r}"
            ) from error

        def work() -> list[ConfirmationInfo]:
            with self.engine.connect() as connection:
                return [_info(row) for row in table.find(connection, wanted, limit, offset)]

        return await asyncio.to_thread(work)

    async def failed(self, *, limit: int = 100, offset: int = 0) -> list[ConfirmationInfo]:
        """Confirmations given up after the policy's attempts (for the admin API)."""
        return await self.find(ConfirmationStatus.FAILED.value, limit=limit, offset=offset)

    async def counts(self) -> dict[str, int]:
        """Number of confirmations per status (every status present, zero included)."""

        def work() -> dict[str, int]:
            with self.engine.connect() as connection:
                return table.counts(connection)

        return await asyncio.to_thread(work)

    async def retry(self, message_ids: Iterable[int]) -> int:
        """Operator action: make FAILED confirmations PENDING again with fresh attempts, due now; return how many.

        SENT and PENDING ones are left alone, so a confirmation is never sent twice after success.
        """
        ids = list(message_ids)
        bad = [i for i in ids if isinstance(i, bool) or not isinstance(i, int)]
        if bad:
            raise InvalidConfirmationError(f"message ids must be the store's integer ids, got {bad!r}")
        now = self.now()

        def work() -> int:
            with self.engine.begin() as connection:
                return table.retry_failed(connection, ids, now)

        return await asyncio.to_thread(work) if ids else 0
