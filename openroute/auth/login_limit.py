"""The limit on failed logins: per (user, client address) and per client address, in a sliding window.

A user who failed ``max_failures`` times from one address within ``window`` is refused from that address (HTTP 429
with ``Retry-After``) until the oldest failure leaves the window, before the password is even compared; an
address that failed ``max_failures_per_address`` times (any user names) is refused altogether. There is no limit
per user alone: anyone could then lock the real user out from anywhere, so the right password from another
address still works. A successful login clears its (user, address) failures::

    limiter = LoginLimiter(max_failures=10, window=60.0)
    limiter.check("ops", "10.0.0.7")       # raises TooManyFailedLoginsError while locked
    limiter.failed("ops", "10.0.0.7")      # after a wrong password
    limiter.succeeded("ops", "10.0.0.7")   # after a right one
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from openroute.auth.errors import TooManyFailedLoginsError
from openroute.definitions.errors import ConfigurationError

log = logging.getLogger("openroute.auth")

#: at most this many (user, address) and address entries are remembered; the oldest go first beyond it
MAX_TRACKED = 10_000


@dataclass
class LoginLimiter:
    """Counts failed logins per (user, address) and per address; thread-safe, in this process's memory."""

    #: failed logins of one user from one address within ``window`` before that pair is refused
    max_failures: int = 10
    #: failed logins from one address (any user) within ``window`` before the address is refused
    max_failures_per_address: int = 50
    #: the sliding window, in seconds
    window: float = 60.0
    clock: Callable[[], float] = field(default=time.monotonic, repr=False)
    _failures: dict[tuple[str, ...], deque[float]] = field(default_factory=dict, init=False, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)

    def __post_init__(self) -> None:
        for name in ("max_failures", "max_failures_per_address"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigurationError(f"{name} must be an integer >= 1, got {value!r}")
        if not isinstance(self.window, int | float) or not self.window > 0:
            raise ConfigurationError(f"the failed-login window must be positive seconds, got {self.window!r}")

    def _keys(self, user: str, client: str | None) -> list[tuple[tuple[str, ...], int]]:
        address = client or "unknown"
        return [(("user", user[:200], address), self.max_failures),
                (("address", address), self.max_failures_per_address)]

    def _recent(self, key: tuple[str, ...], now: float) -> deque[float] | None:
        times = self._failures.get(key)
        if times is None:
            return None
        while times and times[0] <= now - self.window:
            times.popleft()
        if not times:
            del self._failures[key]
            return None
        return times

    def check(self, user: str, client: str | None) -> None:
        """Raises :class:`TooManyFailedLoginsError` (with ``retry_after`` seconds) while ``user`` at ``client`` or
        ``client`` itself is over its limit; returns None otherwise."""
        now = self.clock()
        with self._lock:
            for key, limit in self._keys(user, client):
                times = self._recent(key, now)
                if times is not None and len(times) >= limit:
                    wait = max(1, math.ceil(times[-limit] + self.window - now))
                    who = "address" if key[0] == "address" else "user"
                    raise TooManyFailedLoginsError(wait, f"too many failed logins of this {who}")

    def failed(self, user: str, client: str | None) -> None:
        """Count a failed login of ``user`` from ``client``; logs one line (no password) when a limit is reached."""
        now = self.clock()
        with self._lock:
            if len(self._failures) >= MAX_TRACKED:
                self._forget_oldest(now)
            for key, limit in self._keys(user, client):
                times = self._recent(key, now) or self._failures.setdefault(key, deque())
                times.append(now)
                while len(times) > limit:
                    times.popleft()
                if len(times) == limit:
                    what = f"user {user[:100]!r} from {client or 'unknown'}" if key[0] == "user" else (
                        f"address {client or 'unknown'}")
                    log.warning("login refused for %s: %d failed logins within %g s (retry after up to %g s)",
                                what, limit, self.window, self.window)

    def succeeded(self, user: str, client: str | None) -> None:
        """Clear the failures of ``user`` from ``client`` (the address's count stays)."""
        with self._lock:
            self._failures.pop(self._keys(user, client)[0][0], None)

    def _forget_oldest(self, now: float) -> None:
        for key in list(self._failures):
            self._recent(key, now)
        overflow = len(self._failures) - MAX_TRACKED // 2
        if overflow > 0:
            oldest = sorted(self._failures, key=lambda k: self._failures[k][-1])[:overflow]
            for key in oldest:
                del self._failures[key]
