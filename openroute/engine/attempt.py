"""The attempt of one claimed message: its exchange, the obsolete check, the route's steps (``delivery.py``) and its
outcome, handed to the commit pipeline (:class:`Attempts`).

An attempt is begun by a plain call, not a coroutine: one whose route's steps all return at once and whose outcome
goes to the writer in the background (most of them) ends in that call (:data:`IN_BACKGROUND`). Only an attempt that
waits (an obsolete check, a step that waits, interceptors, an outcome awaited) goes on in a coroutine, the awaitable
each part returns then. A coroutine a message cost about a thousand instructions of the event loop, and the
StopIteration that ended it at the top of a worker's step about 1,700 more.
"""

from __future__ import annotations

import copy
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any

from openroute.definitions.clock import Clock
from openroute.definitions.errors import (
    CircuitOpenError,
    MessageDroppedByInterceptor,
    UnknownRouteError,
    ValidationError,
)
from openroute.definitions.interceptors import MessageInterceptor
from openroute.definitions.route import Route, RouteRegistry
from openroute.engine import outcome as outcomes
from openroute.engine.delivery import deliver
from openroute.engine.exchange import AttemptRuntime, Exchange
from openroute.engine.feeder import Feeder
from openroute.engine.obsolete import ObsoleteCheck
from openroute.engine.parking import Parking
from openroute.engine.pipeline import CommitPipeline
from openroute.engine.settings import EngineSettings
from openroute.persistence import MessageState, StoredMessage
from openroute.runtime import tracing

__all__ = ["IN_BACKGROUND", "Attempts", "InBackground", "Processed", "to_end"]

#: outcomes whose message is due again at a time this node decided (its feeder takes it then)
_DUE_LATER = frozenset({MessageState.PARTLY_FAILED, MessageState.POSTPONED})
# Python 3.11's EnumType.__getattr__ makes each ``MessageState.X`` a lookup of about 900 instructions, a module name
# costs a tenth of that
_WAITING = MessageState.WAITING_FOR_CHILDREN


class InBackground:
    """What an attempt ends with when its outcome is written in the background (``Engine._consume``)."""


IN_BACKGROUND = InBackground()

#: what processing a message ends with: the new snapshot, :data:`IN_BACKGROUND`, or None (another writer had it)
Processed = StoredMessage | InBackground | None


async def to_end(start: Callable[..., Awaitable[Processed] | InBackground], *arguments: Any) -> Processed:
    """What ``start(*arguments)`` (a begun attempt, or a part of one) ends with: :data:`IN_BACKGROUND` as it is, or
    its awaitable awaited. It starts when this coroutine is first awaited."""
    started = start(*arguments)
    return started if started is IN_BACKGROUND else await started  # type: ignore[misc]


class Attempts:
    """The attempts of one node (see the module docstring); ``run_children`` processes the children of a parent its
    first attempt split."""

    def __init__(self, routes: RouteRegistry, runtime: AttemptRuntime, interceptors: tuple[MessageInterceptor, ...],
                 settings: EngineSettings, clock: Clock, *, pipeline: CommitPipeline, obsolete: ObsoleteCheck,
                 parking: Parking, feeder: Feeder, run_children: Callable[[StoredMessage], Awaitable[None]]) -> None:
        self._routes = routes
        self._runtime = runtime
        self._interceptors = interceptors
        self._settings = settings
        self._clock = clock
        self._pipeline = pipeline
        self._obsolete = obsolete
        self._parking = parking
        self._feeder = feeder
        self._run_children = run_children

    def begin(self, claimed: StoredMessage, background: bool) -> Awaitable[Processed] | InBackground:
        """Begin the attempt of ``claimed`` (obsolete check and funnel, the route's steps, the outcome):
        :data:`IN_BACKGROUND` when it ended here with its outcome handed to the writer (only with ``background``,
        for any outcome but WAITING_FOR_CHILDREN), else the awaitable of the rest (the new snapshot, or None when
        another writer changed the message first)."""
        try:
            route: Route | None = self._routes.get(claimed.service, claimed.operation)
        except UnknownRouteError:
            route = None
        # the route may change its exchange's headers, custom data and business errors, never the snapshot's (a new
        # empty container is a literal: most messages have none of them); every field by position, the defaults
        # (no_effect, result, postponed_for, metadata, children) written out: keywords cost a dict a call, and a
        # default factory's call costs more than a literal (every attempt builds one)
        exchange = Exchange(claimed, claimed.payload, dict(claimed.headers) if claimed.headers else {},
                            copy.deepcopy(claimed.custom_data) if claimed.custom_data else {},
                            list(claimed.business_errors) if claimed.business_errors else [],
                            False, None, None, {}, [], route, self._runtime)
        if route is None:
            error = ValidationError(f"no route for {claimed.service}/{claimed.operation} any more")
            return self._decided(claimed, None, exchange, error, background)
        if route.obsolete_check and ObsoleteCheck.applies(claimed, route):  # the flag first: most routes have none
            return self._checked(claimed, route, exchange, background)
        return self._delivered(claimed, route, exchange, background)

    async def _checked(self, claimed: StoredMessage, route: Route, exchange: Exchange, background: bool) -> Processed:
        """The obsolete check, then the steps (SKIPPED at once when a newer message of its entity ended OK)."""
        skipped = await self._obsolete.skipped(claimed)
        if skipped is not None:
            return skipped
        return await to_end(self._delivered, claimed, route, exchange, background)

    def _delivered(self, claimed: StoredMessage, route: Route, exchange: Exchange,
                   background: bool) -> Awaitable[Processed] | InBackground:
        """The route's steps, then the outcome."""
        error: Exception | None = None
        try:
            delivering = deliver(route, exchange, self._interceptors)
            if delivering is not None:  # a step waits, or interceptors wrap the steps
                return self._delivered_later(claimed, route, exchange, delivering, background)
        except MessageDroppedByInterceptor as dropped:
            return self._dropped(claimed, dropped, exchange)
        except Exception as caught:
            error = caught
        return self._decided(claimed, route, exchange, error, background)

    async def _delivered_later(self, claimed: StoredMessage, route: Route, exchange: Exchange,
                               delivering: Awaitable[None], background: bool) -> Processed:
        """The rest of the steps, whose delivery waits on ``delivering``, then the outcome."""
        error: Exception | None = None
        try:
            await delivering
        except MessageDroppedByInterceptor as dropped:
            return await self._dropped(claimed, dropped, exchange)
        except Exception as caught:
            error = caught
        return await to_end(self._decided, claimed, route, exchange, error, background)

    def _dropped(self, claimed: StoredMessage, dropped: MessageDroppedByInterceptor,
                 exchange: Exchange) -> Awaitable[StoredMessage | None]:
        """An interceptor dropped the message: SKIPPED."""
        return self._pipeline.apply(claimed, outcomes.dropped(claimed, dropped.reason, exchange.custom_data),
                                    self._clock.now())

    def _decided(self, claimed: StoredMessage, route: Route | None, exchange: Exchange, error: Exception | None,
                 background: bool) -> Awaitable[Processed] | InBackground:
        """The outcome of the steps (``error`` None: they ran to their end), handed to the writer."""
        settings = self._settings
        now = self._clock.now()
        if error is None and exchange.postponed_for is None and not exchange.children:  # most attempts
            decision = outcomes.succeeded(claimed, exchange.custom_data, exchange.business_errors)
        else:
            decision = outcomes.after_attempt(
                claimed, error, custom_data=exchange.custom_data, business_errors=exchange.business_errors,
                no_effect=exchange.no_effect, postponed_for=exchange.postponed_for,
                has_children=bool(exchange.children), policy=settings.retry_policy_for(route),
                postpone_interval=settings.postpone_interval, now=now,
                error_policies=route.error_policies if route is not None else (), failed_on=exchange.failed_on,
            )
        if tracing.ENABLED:
            tracing.attempt_ended(decision.target.value, decision.changes.get("last_error_code"), error)
        if error is not None or decision.target in _DUE_LATER:
            self._wake_later(error, decision, now)
        if background and decision.target is not _WAITING:
            self._pipeline.apply_in_background(claimed, decision, now)
            return IN_BACKGROUND
        return self._applied(claimed, decision, now)

    async def _applied(self, claimed: StoredMessage, decision: outcomes.Decision, now: datetime) -> \
            StoredMessage | None:
        """``decision`` written and awaited; the children of a split processed."""
        finished = await self._pipeline.apply(claimed, decision, now)
        if finished is not None and finished.state is _WAITING:
            await self._run_children(finished)
        return finished

    def _wake_later(self, error: BaseException | None, decision: outcomes.Decision, now: datetime) -> None:
        """Arrange the event that ends the wait this decision starts: a breaker's check for a parked message (or one
        whose call of the system failed), the feeder's timer for a message due later."""
        if isinstance(error, CircuitOpenError) and error.parks:
            self._parking.parked(error.system, error.retry_at)
            return
        due = decision.changes.get("next_attempt_at")
        if decision.target in _DUE_LATER and due is not None:
            self._feeder.due_at(due)
            system = decision.changes.get("parked_on")
            if system is not None:
                self._parking.parked(system, now)
