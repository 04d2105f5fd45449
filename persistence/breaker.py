"""The shared state of the circuit breakers of external systems: one row per system, changed only by conditional
updates on its version, so two nodes never both win one transition (a breaker opened on node A stops node B).

Which transition to make is decided above this layer (``openroute.outbound.breaker``, pure functions); this module
only reads a row and replaces it when nobody changed it meanwhile::

    breakers = BreakerStore(store)
    row = breakers.load("HLR", now)                  # CLOSED when the system has no row yet
    if breakers.replace(row, dataclasses.replace(row, state=BreakerState.OPEN, ...)):
        ...                                          # this node made the change
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from openroute.persistence.models import circuit_breaker_table
from openroute.persistence.store import MessageStore

__all__ = ["BreakerOutlook", "BreakerRow", "BreakerState", "BreakerStore", "HeldBack", "Verdict"]


class BreakerState(enum.StrEnum):
    """The states of a circuit breaker, as in Resilience4j."""

    #: calls go through; failures are counted in a sliding window
    CLOSED = "CLOSED"
    #: calls are refused (the message is postponed) until ``open_until`` (or until an admin closes a forced one)
    OPEN = "OPEN"
    #: a few trial calls go through; they decide whether the breaker closes or opens again
    HALF_OPEN = "HALF_OPEN"


class Verdict(enum.StrEnum):
    """What a breaker says to one call (decided by ``openroute.outbound.breaker.permit``)."""

    #: CLOSED: make the call
    ALLOW = "ALLOW"
    #: HALF_OPEN: make the call as a trial (write the permit's row first; the call counts only if that write wins)
    TRIAL = "TRIAL"
    #: OPEN, or every trial place taken: do not call; try again at the permit's ``retry_at``
    REFUSE = "REFUSE"


@dataclass(frozen=True)
class BreakerOutlook:
    """What the breaker of ``system`` would say to a call now, without taking a trial place: the engine's parking
    asks it to decide whether to release the messages parked on the system (all, one for a trial, or none until
    ``retry_at``)."""

    system: str
    verdict: Verdict
    state: BreakerState
    #: OPEN or HALF_OPEN since
    since: datetime
    #: when a refused call may be let through at the earliest (REFUSE only)
    retry_at: datetime | None = None
    #: when the breaker last closed after it had opened (None: CLOSED since its row was made, or not CLOSED)
    closed_at: datetime | None = None


@dataclass(frozen=True)
class BreakerRow:
    """The stored state of one system's breaker."""

    system: str
    state: BreakerState
    changed_at: datetime
    open_until: datetime | None = None
    #: start times of the trial calls in flight (HALF_OPEN)
    trials: tuple[datetime, ...] = ()
    trial_successes: int = 0
    #: opened by an admin: stays OPEN until an admin closes it
    forced: bool = False
    reason: str | None = None
    version: int = 0

    def values(self) -> dict[str, Any]:
        """The row's column values."""
        return {
            "system": self.system, "state": self.state.value, "changed_at": self.changed_at,
            "open_until": self.open_until, "trials": [t.isoformat() for t in self.trials],
            "trial_successes": self.trial_successes, "forced": self.forced, "reason": self.reason,
            "version": self.version,
        }


@dataclass(frozen=True)
class HeldBack:
    """An external system that holds messages back: its breaker is not CLOSED, or messages are parked on it."""

    system: str
    state: BreakerState
    #: in that state since (None: the system has no stored breaker)
    since: datetime | None
    open_until: datetime | None
    #: messages parked on it now
    parked: int

    def to_json(self) -> dict[str, Any]:
        """As ``/health`` and the admin API show it."""
        return {"system": self.system, "state": self.state.value,
                "since": None if self.since is None else self.since.isoformat(),
                "openUntil": None if self.open_until is None else self.open_until.isoformat(),
                "parked": self.parked}


def _row(values: Any) -> BreakerRow:
    return BreakerRow(
        system=values.system, state=BreakerState(values.state), changed_at=values.changed_at,
        open_until=values.open_until, trials=tuple(datetime.fromisoformat(t) for t in values.trials or ()),
        trial_successes=values.trial_successes, forced=bool(values.forced), reason=values.reason,
        version=values.version,
    )


class BreakerStore:
    """The ``circuit_breaker`` table of ``store``."""

    def __init__(self, store: MessageStore) -> None:
        self.store = store

    def get(self, system: str, connection: sa.Connection | None = None) -> BreakerRow | None:
        """The breaker of ``system``; None when it has never been stored."""
        query = sa.select(circuit_breaker_table).where(circuit_breaker_table.c.system == system)
        found = self.store.run(lambda c: c.execute(query).first(), connection)
        return None if found is None else _row(found)

    def load(self, system: str, now: datetime) -> BreakerRow:
        """The breaker of ``system``, stored CLOSED first when it has no row (a concurrent insert is harmless)."""
        found = self.get(system)
        if found is not None:
            return found
        fresh = BreakerRow(system, BreakerState.CLOSED, now)
        try:
            with self.store.begin() as connection:
                connection.execute(sa.insert(circuit_breaker_table).values(**fresh.values()))
        except sa.exc.IntegrityError:  # another node stored it first
            pass
        stored = self.get(system)
        assert stored is not None  # noqa: S101  narrows an Optional for mypy: the row was just inserted or found
        return stored

    def replace(self, old: BreakerRow, new: BreakerRow) -> bool:
        """Write ``new`` (its version must be ``old.version + 1``) if the row is still at ``old.version``.

        Returns False (nothing written) when another node changed the breaker first."""
        if new.system != old.system or new.version != old.version + 1:
            raise ValueError(f"breaker {old.system}: a replacement must keep the system and take version "
                             f"{old.version + 1}, got {new.system}/{new.version}")
        table = circuit_breaker_table
        values = new.values()
        del values["system"]
        statement = (sa.update(table).where(table.c.system == old.system, table.c.version == old.version)
                     .values(**values))
        with self.store.begin() as connection:
            return connection.execute(statement).rowcount == 1

    def holding_back(self, connection: sa.Connection | None = None) -> list[HeldBack]:
        """The systems that hold messages back (every breaker not CLOSED, every system with parked messages), by
        name: what the console's dashboard and ``/health`` show."""
        parked = self.store.parking.counts(connection)
        rows = {row.system: row for row in self.all(connection)}
        names = sorted({name for name, row in rows.items() if row.state is not BreakerState.CLOSED} | set(parked))
        return [HeldBack(name, BreakerState.CLOSED, None, None, parked.get(name, 0)) if (row := rows.get(name)) is None
                else HeldBack(name, row.state, row.changed_at, row.open_until, parked.get(name, 0)) for name in names]

    def all(self, connection: sa.Connection | None = None) -> list[BreakerRow]:
        """Every stored breaker, by system name."""
        query = sa.select(circuit_breaker_table).order_by(circuit_breaker_table.c.system)
        return self.store.run(lambda c: [_row(r) for r in c.execute(query)], connection)
