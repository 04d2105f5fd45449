"""The circuit breaker of an external system as pure functions: given the shared state and the time, what happens
next (no store, no clock; :mod:`openroute.outbound.calls` applies the answers with conditional updates).

The states are Resilience4j's::

    CLOSED --(failure rate >= threshold over the last window_size calls, at least minimum_calls)--> OPEN
    OPEN --(open_wait passed, the next call)--> HALF_OPEN (that call is the first trial)
    HALF_OPEN --(trial_calls trials succeeded)--> CLOSED
    HALF_OPEN --(a trial failed)--> OPEN (for open_wait again)

A failure is a technical error or a timeout; a business error is an answer, so it counts as a success. A trial call
holds its permit at most ``trial_timeout``: a trial whose node died frees its place after that time, so a hung call
cannot keep the breaker HALF_OPEN (Resilience4j issue #903). An admin may force the breaker OPEN (it stays open until
an admin closes it) or CLOSED.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from openroute.definitions.errors import ConfigurationError
from openroute.persistence.breaker import BreakerRow, BreakerState, Verdict

__all__ = [
    "BreakerRow",
    "BreakerSettings",
    "BreakerState",
    "Permit",
    "Verdict",
    "closed",
    "failure_rate",
    "forced",
    "opened",
    "permit",
    "trial_result",
]


@dataclass(frozen=True)
class BreakerSettings:
    """The breaker settings of one external system (``[external_systems.NAME.breaker]``; Resilience4j's defaults
    where it has one)."""

    #: percentage of failed calls in the window at which the breaker opens
    failure_rate_threshold: float = 50.0
    #: the sliding window: the last this many calls of this node (count-based)
    window_size: int = 100
    #: no decision before this many calls are in the window
    minimum_calls: int = 100
    #: how long the breaker stays OPEN before trial calls are let through
    open_wait: timedelta = timedelta(seconds=60)
    #: trial calls let through while HALF_OPEN; all must succeed for the breaker to close
    trial_calls: int = 10
    #: a trial call takes at most this long (its permit is freed after it, the call is cut off after it)
    trial_timeout: timedelta = timedelta(seconds=30)
    #: a node re-reads the shared state at most this long after its last read while calls succeed
    refresh: timedelta = timedelta(seconds=1)

    def __post_init__(self) -> None:
        problems = []
        if not 0 < self.failure_rate_threshold <= 100:
            problems.append(f"failure_rate_threshold must be in (0, 100], got {self.failure_rate_threshold}")
        for name in ("window_size", "minimum_calls", "trial_calls"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                problems.append(f"{name} must be an integer >= 1, got {value!r}")
        if isinstance(self.minimum_calls, int) and isinstance(self.window_size, int) \
                and self.minimum_calls > self.window_size:
            problems.append(f"minimum_calls ({self.minimum_calls}) must not exceed window_size ({self.window_size})")
        for name in ("open_wait", "trial_timeout"):
            if getattr(self, name) <= timedelta(0):
                problems.append(f"{name} must be positive, got {getattr(self, name)}")
        if self.refresh < timedelta(0):
            problems.append(f"refresh must not be negative, got {self.refresh}")
        if problems:
            raise ConfigurationError("breaker: " + "; ".join(problems))


@dataclass(frozen=True)
class Permit:
    """The breaker's answer to one call: the verdict, the row to write for a trial, when to retry a refused call."""

    verdict: Verdict
    row: BreakerRow | None = None
    retry_at: datetime | None = None


def _next(row: BreakerRow, **changes: object) -> BreakerRow:
    return dataclasses.replace(row, version=row.version + 1, **changes)  # type: ignore[arg-type]


def permit(row: BreakerRow, settings: BreakerSettings, now: datetime) -> Permit:
    """May a call be made now? CLOSED: yes. OPEN: no until ``open_until`` (forced: until an admin closes it), then
    the call becomes the first trial of HALF_OPEN. HALF_OPEN: a trial while fewer than ``trial_calls`` trials are in
    flight or done; otherwise no until the oldest trial in flight times out."""
    if row.state is BreakerState.CLOSED:
        return Permit(Verdict.ALLOW)
    if row.state is BreakerState.OPEN:
        if row.forced or row.open_until is None:
            return Permit(Verdict.REFUSE, retry_at=now + settings.open_wait)
        if now < row.open_until:
            return Permit(Verdict.REFUSE, retry_at=row.open_until)
        return Permit(Verdict.TRIAL, _next(row, state=BreakerState.HALF_OPEN, changed_at=now, open_until=None,
                                           trials=(now,), trial_successes=0, reason="trial calls after open_wait"))
    live = tuple(t for t in row.trials if now - t < settings.trial_timeout)
    if len(live) + row.trial_successes < settings.trial_calls:
        return Permit(Verdict.TRIAL, _next(row, trials=(*live, now)))
    retry_at = min(live) + settings.trial_timeout if live else now + settings.trial_timeout
    return Permit(Verdict.REFUSE, retry_at=retry_at)


def failure_rate(window: Sequence[bool], settings: BreakerSettings) -> float | None:
    """The percentage of failures (True) in ``window``; None while it holds fewer than ``minimum_calls`` calls."""
    if len(window) < settings.minimum_calls:
        return None
    return 100.0 * sum(1 for failed in window if failed) / len(window)


def opened(row: BreakerRow, settings: BreakerSettings, now: datetime, reason: str) -> BreakerRow:
    """``row`` OPEN until ``now + open_wait``."""
    return _next(row, state=BreakerState.OPEN, changed_at=now, open_until=now + settings.open_wait, trials=(),
                 trial_successes=0, forced=False, reason=reason)


def closed(row: BreakerRow, now: datetime, reason: str) -> BreakerRow:
    """``row`` CLOSED (trials and force cleared)."""
    return _next(row, state=BreakerState.CLOSED, changed_at=now, open_until=None, trials=(), trial_successes=0,
                 forced=False, reason=reason)


def forced(row: BreakerRow, state: BreakerState, now: datetime, by: str) -> BreakerRow:
    """An admin's choice: OPEN (until an admin closes it) or CLOSED. HALF_OPEN cannot be forced."""
    if state is BreakerState.OPEN:
        return _next(row, state=BreakerState.OPEN, changed_at=now, open_until=None, trials=(),
                     trial_successes=0, forced=True, reason=f"forced open by {by}")
    if state is BreakerState.CLOSED:
        return closed(row, now, f"forced closed by {by}")
    raise ConfigurationError(f"a breaker can be forced OPEN or CLOSED, not {state}")


def trial_result(
    row: BreakerRow, started_at: datetime, failed: bool, settings: BreakerSettings, now: datetime
) -> BreakerRow | None:
    """The breaker after a trial call started at ``started_at`` ended; None when it changes nothing (the breaker
    left HALF_OPEN meanwhile). A failed trial opens it again; the ``trial_calls``-th success closes it."""
    if row.state is not BreakerState.HALF_OPEN:
        return None
    trials = list(row.trials)
    if started_at in trials:
        trials.remove(started_at)
    if failed:
        return opened(row, settings, now, "a trial call failed")
    successes = row.trial_successes + 1
    if successes >= settings.trial_calls:
        return closed(row, now, f"{successes} trial calls succeeded")
    return _next(row, trials=tuple(trials), trial_successes=successes)
