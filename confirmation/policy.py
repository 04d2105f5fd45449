"""When a failed confirmation is tried again, and when it is given up."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from openroute.confirmation.model import InvalidConfirmationError


def _seconds(value: object, name: str) -> timedelta:
    if isinstance(value, timedelta):
        result = value
    elif isinstance(value, int | float) and not isinstance(value, bool):
        result = timedelta(seconds=value)
    else:
        raise InvalidConfirmationError(f"{name} must be a timedelta or a number of seconds, got {value!r}")
    return result


@dataclass(frozen=True)
class ConfirmationPolicy:
    """Retry policy of confirmations, independent of the messages' own retry policy.

    After the n-th failed attempt (n = 1, 2, ...) the next one is due ``min(interval * backoff ** (n - 1), cap)``
    later; after ``max_attempts`` failed attempts the confirmation is FAILED (kept, visible, never sent again unless
    an operator retries it). ``claim_timeout`` is how long a node may hold a confirmation while sending it: if the
    node dies, another one sends it after that time, so it must be longer than the transport timeout. Durations are
    ``timedelta`` or seconds.
    """

    max_attempts: int = 10
    interval: timedelta = timedelta(seconds=30)
    backoff: float = 2.0
    cap: timedelta = timedelta(hours=1)
    claim_timeout: timedelta = timedelta(minutes=5)

    def __post_init__(self) -> None:
        if isinstance(self.max_attempts, bool) or not isinstance(self.max_attempts, int) or self.max_attempts < 1:
            raise InvalidConfirmationError(f"max_attempts must be an int >= 1, got {self.max_attempts!r}")
        for name in ("interval", "cap", "claim_timeout"):
            value = _seconds(getattr(self, name), name)
            if value < timedelta(0) or (name == "claim_timeout" and value == timedelta(0)):
                raise InvalidConfirmationError(f"{name} must be {'positive' if name == 'claim_timeout' else '>= 0'}")
            object.__setattr__(self, name, value)
        if isinstance(self.backoff, bool) or not isinstance(self.backoff, int | float) or self.backoff < 1:
            raise InvalidConfirmationError(f"backoff must be a number >= 1, got {self.backoff!r}")
        if self.cap < self.interval:
            raise InvalidConfirmationError(f"cap ({self.cap}) must not be shorter than interval ({self.interval})")

    def delay_after(self, failed_attempts: int) -> timedelta:
        """Delay before the next attempt once ``failed_attempts`` attempts have failed (1 = the first one)."""
        if failed_attempts < 1:
            raise InvalidConfirmationError(f"failed_attempts must be >= 1, got {failed_attempts!r}")
        exponent = failed_attempts - 1
        # compare in float seconds first so a large exponent cannot overflow timedelta
        try:
            seconds = self.interval.total_seconds() * float(self.backoff) ** exponent
        except OverflowError:
            return self.cap
        return self.cap if seconds >= self.cap.total_seconds() else timedelta(seconds=seconds)

    def exhausted(self, failed_attempts: int) -> bool:
        """Whether no attempt is left after ``failed_attempts`` failures."""
        return failed_attempts >= self.max_attempts
