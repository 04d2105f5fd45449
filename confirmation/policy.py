"""When a failed confirmation is tried again, and when it is given up: a :class:`RetryPolicy` for confirmations."""

from __future__ import annotations

import random
from dataclasses import dataclass
from datetime import timedelta

from openroute.confirmation.model import InvalidConfirmationError

from openroute.definitions.errors import ConfigurationError
from openroute.definitions.retry import RetryPolicy


def _seconds(value: object, name: str) -> timedelta:
    if isinstance(value, timedelta):
        result = value
    elif isinstance(value, int | float) and not isinstance(value, bool):
        result = timedelta(seconds=value)
    else:
        raise InvalidConfirmationError(f"{name} must be a timedelta or a number of seconds, got {value!r}")
    return result


@dataclass(frozen=True, init=False)
class ConfirmationPolicy(RetryPolicy):
    """Retry policy of confirmations: the messages' :class:`~openroute.definitions.retry.RetryPolicy` (same fields, same
    formula), with its own defaults and ``claim_timeout``.

    After the n-th failed attempt (n = 1, 2, ...) the next one is due ``min(interval * backoff ** (n - 1),
    max_interval)`` later; after ``max_attempts`` failed attempts the confirmation is FAILED (kept, visible, never
    sent again unless an operator retries it). ``claim_timeout`` is the lease of a node on a confirmation it sends
    (default 15 s): renewed every third of it while the send runs, so a slow receiver keeps its sender, and if the
    node dies another one (or the restarted node) takes the confirmation over within that time. Durations are
    ``timedelta`` or seconds. Bad values raise
    :class:`InvalidConfirmationError` (a :class:`~openroute.definitions.errors.ConfigurationError`).
    """

    claim_timeout: timedelta = timedelta(seconds=15)

    def __init__(
        self,
        max_attempts: int = 10,
        interval: timedelta | float = timedelta(seconds=30),
        backoff: float = 2.0,
        max_interval: timedelta | float | None = None,
        jitter: float = 0.0,
        claim_timeout: timedelta | float = timedelta(seconds=15),
        *,
        rng: random.Random | None = None,
    ) -> None:
        if isinstance(max_attempts, bool) or not isinstance(max_attempts, int) or max_attempts < 1:
            raise InvalidConfirmationError(f"max_attempts must be an int >= 1, got {max_attempts!r}")
        if isinstance(backoff, bool) or not isinstance(backoff, int | float) or backoff < 1:
            raise InvalidConfirmationError(f"backoff must be a number >= 1, got {backoff!r}")
        limit = max_interval if max_interval is not None else timedelta(hours=1)
        durations = {"interval": interval, "max_interval": limit, "claim_timeout": claim_timeout}
        values = {name: _seconds(value, name) for name, value in durations.items()}
        for name, value in values.items():
            if value < timedelta(0) or (name == "claim_timeout" and value == timedelta(0)):
                raise InvalidConfirmationError(f"{name} must be {'positive' if name == 'claim_timeout' else '>= 0'}")
        if values["max_interval"] < values["interval"]:
            raise InvalidConfirmationError(
                f"max_interval ({values['max_interval']}) must not be shorter than interval ({values['interval']})")
        settings: dict[str, object] = {"max_attempts": max_attempts, "backoff": backoff, "jitter": jitter,
                                       "rng": rng if rng is not None else random.Random(), **values}  # noqa: S311  retry jitter, not a secret
        for name, setting in settings.items():
            object.__setattr__(self, name, setting)
        try:
            self.__post_init__()
        except ConfigurationError as error:
            raise InvalidConfirmationError(str(error)) from None
