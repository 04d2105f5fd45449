"""Retry policies: when a message that failed technically is tried again, and when it gives up."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from openroute.errors import ConfigurationError


@dataclass(frozen=True)
class RetryPolicy:
    """How often and when a technically failed message is retried.

    ``max_attempts`` counts every processing attempt including the first; after the attempt that
    brings the failed count to ``max_attempts`` the message is FAILED. The delay before attempt
    ``n + 1`` after ``n`` failures is ``interval * backoff ** (n - 1)``, capped at ``max_interval``,
    then scaled by a random factor in ``[1 - jitter, 1 + jitter]`` (never above the cap).
    """

    max_attempts: int = 3
    interval: timedelta = timedelta(seconds=60)
    backoff: float = 2.0
    max_interval: timedelta = timedelta(hours=1)
    jitter: float = 0.0
    rng: random.Random = field(default_factory=random.Random, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ConfigurationError(f"max_attempts must be >= 1, got {self.max_attempts}")
        if self.interval < timedelta(0):
            raise ConfigurationError(f"interval must not be negative, got {self.interval}")
        if self.backoff < 1.0:
            raise ConfigurationError(f"backoff must be >= 1.0, got {self.backoff}")
        if self.max_interval < self.interval:
            raise ConfigurationError(f"max_interval {self.max_interval} is shorter than interval {self.interval}")
        if not 0.0 <= self.jitter < 1.0:
            raise ConfigurationError(f"jitter must be in [0, 1), got {self.jitter}")

    def exhausted(self, failed_count: int) -> bool:
        """True when a message that has failed ``failed_count`` times must not be retried."""
        return failed_count >= self.max_attempts

    def delay(self, failed_count: int) -> timedelta:
        """The wait before the next attempt of a message that has failed ``failed_count`` (>= 1) times."""
        if failed_count < 1:
            raise ValueError(f"failed_count must be >= 1, got {failed_count}")
        try:
            seconds = self.interval.total_seconds() * float(self.backoff) ** (failed_count - 1)
        except OverflowError:  # a huge exponent: the cap, not an error
            seconds = self.max_interval.total_seconds()
        seconds = min(seconds, self.max_interval.total_seconds())
        if self.jitter:
            seconds *= self.rng.uniform(1.0 - self.jitter, 1.0 + self.jitter)
            seconds = min(seconds, self.max_interval.total_seconds())
        return timedelta(seconds=seconds)

    def next_attempt(self, failed_count: int, now: datetime) -> datetime | None:
        """When to try again after ``failed_count`` failures, or None when the attempts are exhausted."""
        if self.exhausted(failed_count):
            return None
        return now + self.delay(failed_count)


DEFAULT_RETRY_POLICY = RetryPolicy()
