"""Calls to declared external systems: each passes the system's circuit breaker (shared by all nodes through the
store), is cut off after ``call_timeout``, logged in one DEBUG line and, when the system's records are on, recorded.

The engine hands every ``ext_call(..., system="HLR")`` to :meth:`ExternalCalls.guard`::

    from openroute.outbound import ExternalCalls, ExternalSystem
    from openroute.outbound.breaker import BreakerSettings

    calls = ExternalCalls(store, [ExternalSystem("HLR", base_url="http://hlr/", breaker=BreakerSettings(...))])
    engine = Engine(store, routes, external_calls=calls)

How the breaker is shared: the state (CLOSED / OPEN / HALF_OPEN, the trial calls in flight) is one row per system,
changed only by conditional updates, so one node wins each transition and logs it. The failure rate is counted
by each node over its own last ``window_size`` calls (no write per call); a node reads the shared row again at
most ``refresh`` after its last read while its calls succeed (in the background: the check of a call is a look at
the cached row), and before its next call after a failure.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import json
import logging
import time
from collections import Counter, deque
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from openroute.definitions.clock import Clock, SystemClock
from openroute.definitions.errors import BusinessError, CircuitOpenError, TechnicalError, ValidationError
from openroute.outbound import breaker as rules
from openroute.outbound.bulkhead import Bulkhead
from openroute.outbound.systems import ExternalSystem, systems_by_name
from openroute.persistence import MessageStore, StoredMessage
from openroute.persistence.breaker import BreakerOutlook, BreakerRow, BreakerState, BreakerStore
from openroute.persistence.call_records import CallOutcome, CallRecord, CallRecordStore

__all__ = ["CallContext", "ExternalCalls", "current_call"]

log = logging.getLogger("openroute.outbound")

#: how often a node retries a conditional update it lost before it gives up for this call
_RACES = 5


@dataclass
class CallContext:
    """The call being made now (a context variable): the shipped HTTP client reads the system's settings from it
    and writes the request and response it sent and got, for the call record."""

    system: ExternalSystem
    key: str
    message_id: int
    request: str | None = None
    response: str | None = None


_current: contextvars.ContextVar[CallContext | None] = contextvars.ContextVar("openroute_call", default=None)


def current_call() -> CallContext | None:
    """The external call this task is making (inside :meth:`ExternalCalls.guard`), else None."""
    return _current.get()


@dataclass
class _NodeBreaker:
    """What one node knows of one breaker: the shared row as last read, and its own window of call outcomes."""

    row: BreakerRow | None = None
    read_at: float = float("-inf")
    window: deque[bool] = field(default_factory=deque)
    #: the read of the shared row in flight: the calls that need one meanwhile share it
    reading: asyncio.Future[BreakerRow] | None = None


class ExternalCalls:
    """The guard of calls to external systems (:class:`openroute.engine.exchange.CallGuard`).

    ``systems`` are the declared ones; a system a route names but nobody declared gets the defaults (breaker on with
    Resilience4j's defaults, no records), said once in the log. ``stats`` counts calls by (system, outcome).
    """

    def __init__(self, store: MessageStore, systems: Iterable[ExternalSystem] = (), *,
                 clock: Clock | None = None) -> None:
        self.store = store
        self.systems = systems_by_name(systems)
        self.clock: Clock = clock or SystemClock()
        self.breakers = BreakerStore(store)
        self.records = CallRecordStore(store)
        self.stats: Counter[tuple[str, str]] = Counter()
        self._nodes: dict[str, _NodeBreaker] = {}
        self._undeclared: dict[str, ExternalSystem] = {}
        self._bulkheads: dict[str, Bulkhead] = {}
        self._watchers: list[Callable[[str], None]] = []

    def watch(self, listener: Callable[[str], None]) -> None:
        """Have ``listener(system)`` called on the loop after each change this node makes to a breaker (opened, a
        trial's result, closed, forced): the engine's parking releases the messages parked on it."""
        self._watchers.append(listener)

    def _tell(self, system: str) -> None:
        for listener in self._watchers:
            try:
                listener(system)
            except Exception as error:  # a listener's bug must not fail the call that changed the breaker
                log.warning("breaker %s: a listener failed: %s: %s", system, type(error).__name__, error)

    async def outlook(self, system: str) -> BreakerOutlook | None:
        """What the breaker of ``system`` would say to a call now, read from the store (no trial place taken); None
        when the system has no breaker."""
        settings = self.system(system)
        if settings.breaker is None:
            return None
        row = await self._read(system)
        now = self.clock.now()
        answer = rules.permit(row, settings.breaker, now)
        # a row made CLOSED has no reason; every transition (opened, closed, forced) gives one
        closed_at = row.changed_at if row.state is BreakerState.CLOSED and row.reason is not None else None
        return BreakerOutlook(system, answer.verdict, row.state, row.changed_at, answer.retry_at, closed_at)

    def bulkhead(self, system: str) -> Bulkhead:
        """The bulkhead of ``system`` on this node (``max_concurrent_calls``, ``max_calls_per_second``)."""
        found = self._bulkheads.get(system)
        if found is None:
            settings = self.system(system)
            found = self._bulkheads[system] = Bulkhead(system, settings.max_concurrent_calls,
                                                       settings.max_calls_per_second)
        return found

    def system(self, name: str) -> ExternalSystem:
        """The settings of system ``name`` (the defaults, with one warning, when it was not declared)."""
        found = self.systems.get(name) or self._undeclared.get(name)
        if found is None:
            log.info("external system %s is not declared ([external_systems.%s]): default settings", name, name)
            found = self._undeclared[name] = ExternalSystem(name)
        return found

    async def guard(self, system: str, key: str, message: StoredMessage, call: Callable[[], Any], *,
                    record: Callable[[CallRecord], Awaitable[object]] | None = None) -> Any:
        """Make ``call`` for ``message`` through the breaker of ``system``; returns its result, raises its error.

        Raises :class:`CircuitOpenError` (the call not made) when the breaker refuses it, and
        :class:`TechnicalError` code TIMEOUT when it takes longer than the system's ``call_timeout`` (or a trial
        call longer than the breaker's ``trial_timeout``). With the system's records on, the call's record is stored
        before the call's outcome is returned: by ``record(call_record)`` (the engine's group commit), else in a
        transaction of its own."""
        bulkhead = self.bulkhead(system)
        if not bulkhead.limits:
            return await self._guarded(system, key, message, call, record)
        async with bulkhead.slot():  # the breaker is asked once the call's turn has come
            return await self._guarded(system, key, message, call, record)

    async def _guarded(self, system: str, key: str, message: StoredMessage, call: Callable[[], Any],
                       record: Callable[[CallRecord], Awaitable[object]] | None) -> Any:
        settings = self.system(system)
        trial: datetime | None = None
        if settings.breaker is not None:
            trial = await self._permit(settings, settings.breaker)
        limit = settings.call_timeout
        if trial is not None and settings.breaker is not None:
            limit = min(limit, settings.breaker.trial_timeout)
        context = CallContext(settings, key, message.id)
        token = _current.set(context)
        started = self.clock.now()
        clock = time.perf_counter()
        outcome: CallOutcome = CallOutcome.OK
        result: Any = None
        error: BaseException | None = None
        try:
            try:
                async with asyncio.timeout(limit.total_seconds()):
                    result = call()
                    if inspect.isawaitable(result):
                        result = await result
            finally:
                _current.reset(token)
        except TimeoutError:
            outcome = CallOutcome.TIMEOUT
            error = TechnicalError(f"{system}.{key}: no answer within {limit.total_seconds():g} s", code="TIMEOUT")
        except (BusinessError, ValidationError) as answered:
            outcome, error = CallOutcome.BUSINESS_ERROR, answered
        except Exception as failed:  # a cancelled task (the node stops) passes: a trial's place frees itself
            outcome, error = CallOutcome.FAILED, failed
        millis = int((time.perf_counter() - clock) * 1000)
        self.stats[(system, outcome)] += 1
        log.debug("call %s %s for message %s: %s in %d ms%s", system, key, message.id, outcome, millis,
                  "" if error is None else f" ({type(error).__name__}: {_short(str(error))})")
        failed_call = outcome in (CallOutcome.FAILED, CallOutcome.TIMEOUT)
        if settings.breaker is not None:
            try:
                await self._count(settings, settings.breaker, failed_call, trial)
            except Exception as broken:  # the call was made: its outcome stands even if the breaker cannot count it
                log.warning("breaker %s could not count a call: %s: %s", system, type(broken).__name__, broken)
        if settings.records.records(key):
            await self._record(settings, context, message.id, key, started, millis, outcome, result, error, record)
        if error is not None:
            raise error
        return result

    # -- the breaker ----------------------------------------------------------------------------
    async def _read(self, name: str) -> BreakerRow:
        node = self._nodes.setdefault(name, _NodeBreaker())
        now = self.clock.now()
        row = await asyncio.to_thread(self.breakers.load, name, now)
        if node.row is not None and row.state is BreakerState.CLOSED and row.version != node.row.version:
            node.window.clear()  # closed elsewhere (or by an admin): count afresh
        node.row, node.read_at = row, time.monotonic()
        return row

    def _read_shared(self, name: str) -> asyncio.Future[BreakerRow]:
        """The read of the shared row in flight, started if there is none: calls that find their cached row too old
        at the same moment make one read between them, not one each."""
        node = self._nodes.setdefault(name, _NodeBreaker())
        if node.reading is None:
            reading = node.reading = asyncio.ensure_future(self._read(name))
            reading.add_done_callback(lambda _done: _forget(node, reading))
        return node.reading

    def _read_behind(self, name: str) -> None:
        """Refresh the cached row in the background (a failed read is logged once; the next call tries again)."""
        self._read_shared(name).add_done_callback(lambda done: self._read_failed(name, done))

    def _read_failed(self, name: str, done: asyncio.Future[BreakerRow]) -> None:
        error = None if done.cancelled() else done.exception()
        if error is not None and not self.store.outage.failed(error, f"reading circuit breaker {name}"):
            log.warning("breaker %s could not be read: %s: %s", name, type(error).__name__, _short(str(error)))

    async def _permit(self, system: ExternalSystem, settings: rules.BreakerSettings) -> datetime | None:
        """None: call as usual; a time: the call is a trial started then. Raises CircuitOpenError."""
        node = self._nodes.setdefault(system.name, _NodeBreaker())
        row = node.row
        refresh = settings.refresh.total_seconds()
        stale = time.monotonic() - node.read_at >= refresh
        if row is None or _moving(row, self.clock.now()) or (stale and (not refresh or node.read_at == float("-inf"))):
            row = await asyncio.shield(self._read_shared(system.name))  # a state to decide on, or after a failure
        elif stale:  # calls succeed: this call goes by the cached row, the next ones by the row read meanwhile
            self._read_behind(system.name)
        for _ in range(_RACES):
            now = self.clock.now()
            answer = rules.permit(row, settings, now)
            if answer.verdict is rules.Verdict.ALLOW:
                return None
            if answer.verdict is rules.Verdict.REFUSE:
                self.stats[(system.name, CallOutcome.REFUSED)] += 1
                raise CircuitOpenError(system.name, answer.retry_at or now, row.state.value)
            assert answer.row is not None  # noqa: S101  narrows an Optional for mypy: a refusal was raised above
            if await asyncio.to_thread(self.breakers.replace, row, answer.row):
                if row.state is BreakerState.OPEN:
                    log.info("circuit breaker %s HALF_OPEN: trial calls after %s open", system.name,
                             _since(row.changed_at, now))
                node.row = answer.row
                return now
            row = await self._read(system.name)  # another node changed it first: decide again on its state
        self.stats[(system.name, CallOutcome.REFUSED)] += 1
        raise CircuitOpenError(system.name, self.clock.now() + settings.refresh, "contended")

    async def _count(self, system: ExternalSystem, settings: rules.BreakerSettings, failed: bool,
                     trial: datetime | None) -> None:
        node = self._nodes.setdefault(system.name, _NodeBreaker())
        if trial is not None:
            row = await self._read(system.name)
            for _ in range(_RACES):
                now = self.clock.now()
                new = rules.trial_result(row, trial, failed, settings, now)
                if new is None:
                    return
                if await asyncio.to_thread(self.breakers.replace, row, new):
                    node.row = new
                    if new.state is not row.state:
                        self._changed(system.name, row, new, now)
                    self._tell(system.name)
                    return
                row = await self._read(system.name)
            return
        node.window.append(failed)
        while len(node.window) > settings.window_size:
            node.window.popleft()
        if not failed:
            return
        node.read_at = float("-inf")  # after a failure the next call reads the shared state again
        rate = rules.failure_rate(node.window, settings)
        if rate is None or rate < settings.failure_rate_threshold:
            return
        calls = len(node.window)
        node.window.clear()  # before the read: a concurrent failure must not count the same window again
        row = await self._read(system.name)
        for _ in range(_RACES):
            if row.state is not BreakerState.CLOSED:
                return  # another node opened it already
            now = self.clock.now()
            new = rules.opened(row, settings, now, f"{rate:.0f}% of the last {calls} calls failed")
            if await asyncio.to_thread(self.breakers.replace, row, new):
                node.row, node.read_at = new, time.monotonic()
                self._changed(system.name, row, new, now)
                self._tell(system.name)
                return
            row = await self._read(system.name)

    @staticmethod
    def _changed(name: str, old: BreakerRow, new: BreakerRow, now: datetime) -> None:
        if new.state is BreakerState.OPEN:
            until = "until an admin closes it" if new.open_until is None else f"until {new.open_until.isoformat()}"
            log.warning("circuit breaker %s OPEN (was %s): %s; calls refused %s", name, old.state.value, new.reason,
                        until)
        elif new.state is BreakerState.CLOSED:
            log.warning("circuit breaker %s CLOSED (was %s for %s): %s", name, old.state.value,
                        _since(old.changed_at, now), new.reason)

    async def force(self, name: str, state: BreakerState, by: str) -> BreakerRow:
        """An admin forces the breaker of ``name`` OPEN (until an admin closes it) or CLOSED; returns the new row.

        Raises ConfigurationError for HALF_OPEN."""
        now = self.clock.now()
        for _ in range(_RACES):
            row = await asyncio.to_thread(self.breakers.load, name, now)
            new = rules.forced(row, state, now, by)
            if await asyncio.to_thread(self.breakers.replace, row, new):
                node = self._nodes.setdefault(name, _NodeBreaker())
                node.row, node.read_at = new, time.monotonic()
                node.window.clear()
                self._changed(name, row, new, now)
                self._tell(name)
                return new
        raise CircuitOpenError(name, now, "contended")

    # -- call records ---------------------------------------------------------------------------
    async def _record(self, system: ExternalSystem, context: CallContext, message_id: int, key: str,
                      started: datetime, millis: int, outcome: CallOutcome, result: Any,
                      error: BaseException | None, store: Callable[[CallRecord], Awaitable[object]] | None) -> None:
        """Store the call record (through ``store``, else in a transaction of its own); a failure to record is
        logged in one line and never fails the call."""
        try:
            settings = system.records
            response = context.response
            if response is None and error is None:
                response = _as_text(result)
            record = CallRecord(
                message_id=message_id, system=system.name, call_key=key, started_at=started, duration_ms=millis,
                outcome=outcome, request=settings.clean(context.request), response=settings.clean(response),
                error=None if error is None else settings.clean(f"{type(error).__name__}: {error}"),
            )
            if store is not None:
                await store(record)
            else:
                await asyncio.to_thread(self.records.add, record)
        except Exception as broken:
            log.warning("call %s %s for message %s was not recorded: %s: %s", system.name, key, message_id,
                        type(broken).__name__, _short(str(broken)))


def _forget(node: _NodeBreaker, reading: asyncio.Future[BreakerRow]) -> None:
    if node.reading is reading:
        node.reading = None


def _moving(row: BreakerRow, now: datetime) -> bool:
    """A state the node must not trust from its cache: HALF_OPEN (trial places change with every call) and an OPEN
    whose wait is over (another node may be making the trials)."""
    if row.state is BreakerState.HALF_OPEN:
        return True
    return row.state is BreakerState.OPEN and row.open_until is not None and now >= row.open_until


def _as_text(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, str):
        return value
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    try:
        return json.dumps(value, ensure_ascii=False, default=str)
    except (TypeError, ValueError):
        return repr(value)


def _short(text: str, limit: int = 300) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _since(then: datetime, now: datetime) -> str:
    return f"{max((now - then).total_seconds(), 0.0):.0f} s"
