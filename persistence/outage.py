"""Store outages: which database errors mean "the store cannot be reached now, try later", logged once per outage.

While the database is down every request, every repoll tick and every heartbeat fails the same way; a traceback for
each says nothing new and buries the one line an operator needs. :class:`StoreOutage` logs one WARNING when the
first such failure is seen and one INFO when the next operation succeeds::

    outage = StoreOutage()
    try:
        work()
    except Exception as error:
        if not outage.failed(error):
            raise                      # a real bug: let it be logged with its traceback
        ...                            # answer 503 / retry at the next tick
    else:
        outage.succeeded()

A background loop (confirmations, retention, alerts, outbox, the funnel listener) keeps its own
:class:`StoreOutage`, named after it, so each logs its own pair, and waits :meth:`StoreOutage.delay` between
passes: its interval, lengthened while the store stays away. :func:`run_passes` is that loop::

    outage = StoreOutage.of_loop("retention job")
    await run_passes(lambda: asyncio.to_thread(job.run_once), 3600, stop, outage, "retention run failed", log)
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Awaitable, Callable

from sqlalchemy import exc

__all__ = ["MAX_BACKOFF", "StoreOutage", "describe_error", "is_store_unreachable", "pause", "run_passes"]

log = logging.getLogger("openroute.store")

# SQLite reports a missing table with OperationalError too: only these texts mean "try later"
_SQLITE_TRANSIENT = ("database is locked", "unable to open database", "disk i/o error", "database is busy")
#: the drivers whose own errors (raised outside SQLAlchemy, e.g. by a LISTEN connection) are recognised
_DRIVERS = ("psycopg", "psycopg2")
#: the longest wait between two passes of a loop while its store is unreachable (unless its interval is longer)
MAX_BACKOFF = 30.0


def is_store_unreachable(error: BaseException) -> bool:
    """True when ``error`` means the database cannot be reached or used now (connection refused or lost, server
    shutting down, pool exhausted, SQLite file locked), not that the statement or the data is wrong."""
    if isinstance(error, exc.TimeoutError):  # no pooled connection came free in time
        return True
    if not isinstance(error, exc.DBAPIError):
        return _driver_unreachable(error)
    if error.connection_invalidated or isinstance(error, exc.InterfaceError):
        return True
    if not isinstance(error, exc.OperationalError):
        return False
    if type(error.orig).__module__.startswith("sqlite3"):
        text = str(error.orig).lower()
        return any(part in text for part in _SQLITE_TRANSIENT)
    return True


def _driver_unreachable(error: BaseException) -> bool:
    """A driver's own OperationalError / InterfaceError (PEP 249 names), met on a connection SQLAlchemy does not
    manage."""
    return any(kind.__name__ in ("OperationalError", "InterfaceError") and kind.__module__.split(".")[0] in _DRIVERS
               for kind in type(error).__mro__)


def describe_error(error: BaseException) -> str:
    """One line naming the driver's error: its class and the first line of its text (no statement, no parameters)."""
    original = getattr(error, "orig", None) or error
    first = (str(original).strip().splitlines() or [""])[0]
    return f"{type(original).__name__}: {first[:300]}"


class StoreOutage:
    """Whether the store is known to be unreachable, with one log line when an outage starts and one when it ends.

    ``name`` says whose view of the store it is (the WARNING and the INFO begin with it), ``consequence`` what
    happens until it is back (the end of the WARNING). Thread-safe: the writer thread, the read threads and the
    event loop report to the same instance.
    """

    def __init__(self, name: str = "message store", consequence: str = "requests get 503 until it is back") -> None:
        self.name = name
        self.consequence = consequence
        self._since: float | None = None
        self._lock = threading.Lock()
        #: outages seen since this object was made
        self.outages = 0
        #: failures reported during the current outage (0 when the store is reachable)
        self.failures = 0

    @classmethod
    def of_loop(cls, loop: str) -> StoreOutage:
        """The outage as background loop ``loop`` (e.g. "retention job") sees it: "message store (retention job)
        unreachable: ...; the retention job backs off until it is back"."""
        return cls(f"message store ({loop})", f"the {loop} backs off until it is back")

    @property
    def down(self) -> bool:
        """True from the first failure of an outage until the next success."""
        return self._since is not None

    def failed(self, error: BaseException, doing: str = "") -> bool:
        """Report a failed operation. Returns True when ``error`` means the store is unreachable (the first of an
        outage is logged as a WARNING); False for any other error, which the caller handles as before."""
        if not is_store_unreachable(error):
            return False
        with self._lock:
            self.failures += 1
            if self._since is not None:
                return True
            self._since = time.monotonic()
            self.outages += 1
        log.warning("%s unreachable%s: %s; %s",
                    self.name, f" ({doing})" if doing else "", describe_error(error), self.consequence)
        return True

    def succeeded(self) -> None:
        """Report a successful operation: ends an outage (logged once as INFO). Cheap when there is none."""
        if self._since is None:
            return
        with self._lock:
            since, self._since = self._since, None
            self.failures = 0
        if since is not None:
            log.info("%s reachable again after %.1f s", self.name, time.monotonic() - since)

    def delay(self, interval: float) -> float:
        """Seconds a loop that runs every ``interval`` waits before its next pass: ``interval`` while the store is
        reachable; during an outage it doubles with every failed pass, up to :data:`MAX_BACKOFF` (or ``interval``
        when that is longer), so a dead database is not hammered and a loop still sees it come back soon."""
        failures = self.failures
        if failures <= 1:
            return interval
        return min(interval * 2.0 ** min(failures - 1, 30), max(interval, MAX_BACKOFF))


async def pause(stop: asyncio.Event, seconds: float) -> None:
    """Wait ``seconds``, or less when ``stop`` is set meanwhile (the pause between two passes of a loop)."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), seconds)


async def run_passes(one_pass: Callable[[], Awaitable[object]], interval: float, stop: asyncio.Event,
                     outage: StoreOutage, failure: str, logger: logging.Logger,
                     report: Callable[[Exception], None] | None = None) -> None:
    """Await ``one_pass()`` every ``interval`` seconds (:meth:`StoreOutage.delay` during an outage) until ``stop`` is
    set. A pass that fails because the store is unreachable is reported to ``outage`` (one WARNING per outage, one
    INFO when a pass succeeds again); any other failure is given to ``report``, or without one logged on ``logger``
    as ``failure`` with its traceback. The loop keeps running either way."""
    while not stop.is_set():
        try:
            await one_pass()
        except Exception as error:
            if not outage.failed(error):
                if report is not None:
                    report(error)
                else:
                    logger.exception(failure)
        else:
            outage.succeeded()
        await pause(stop, outage.delay(interval))
