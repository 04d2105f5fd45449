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
"""

from __future__ import annotations

import logging
import threading
import time

from sqlalchemy import exc

__all__ = ["StoreOutage", "describe_error", "is_store_unreachable"]

log = logging.getLogger("openroute.store")

# SQLite reports a missing table with OperationalError too: only these texts mean "try later"
_SQLITE_TRANSIENT = ("database is locked", "unable to open database", "disk i/o error", "database is busy")


def is_store_unreachable(error: BaseException) -> bool:
    """True when ``error`` means the database cannot be reached or used now (connection refused or lost, server
    shutting down, pool exhausted, SQLite file locked), not that the statement or the data is wrong."""
    if isinstance(error, exc.TimeoutError):  # no pooled connection came free in time
        return True
    if not isinstance(error, exc.DBAPIError):
        return False
    if error.connection_invalidated or isinstance(error, exc.InterfaceError):
        return True
    if not isinstance(error, exc.OperationalError):
        return False
    if type(error.orig).__module__.startswith("sqlite3"):
        text = str(error.orig).lower()
        return any(part in text for part in _SQLITE_TRANSIENT)
    return True


def describe_error(error: BaseException) -> str:
    """One line naming the driver's error: its class and the first line of its text (no statement, no parameters)."""
    original = getattr(error, "orig", None) or error
    first = (str(original).strip().splitlines() or [""])[0]
    return f"{type(original).__name__}: {first[:300]}"


class StoreOutage:
    """Whether the store is known to be unreachable, with one log line when an outage starts and one when it ends.

    Thread-safe: the writer thread, the read threads and the event loop report to the same instance.
    """

    def __init__(self, name: str = "message store") -> None:
        self.name = name
        self._since: float | None = None
        self._lock = threading.Lock()
        #: outages seen since this object was made
        self.outages = 0

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
            if self._since is not None:
                return True
            self._since = time.monotonic()
            self.outages += 1
        log.warning("%s unreachable%s: %s; requests get 503 until it is back",
                    self.name, f" ({doing})" if doing else "", describe_error(error))
        return True

    def succeeded(self) -> None:
        """Report a successful operation: ends an outage (logged once as INFO). Cheap when there is none."""
        if self._since is None:
            return
        with self._lock:
            since, self._since = self._since, None
        if since is not None:
            log.info("%s reachable again after %.1f s", self.name, time.monotonic() - since)
