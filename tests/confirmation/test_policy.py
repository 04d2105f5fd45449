"""ConfirmationPolicy: schedule of retries and validation."""

from __future__ import annotations

from datetime import timedelta

import pytest
from openroute.confirmation import ConfirmationPolicy, InvalidConfirmationError

from openroute.definitions.errors import ConfigurationError
from openroute.definitions.retry import RetryPolicy


def test_delays_grow_by_backoff_up_to_the_cap() -> None:
    policy = ConfirmationPolicy(max_attempts=6, interval=10, backoff=3, max_interval=timedelta(minutes=2))
    assert [policy.delay(n).total_seconds() for n in range(1, 6)] == [10, 30, 90, 120, 120]
    assert [policy.exhausted(n) for n in (1, 5, 6, 7)] == [False, False, True, True]


def test_constant_interval_and_huge_exponent() -> None:
    assert ConfirmationPolicy(interval=5, backoff=1, max_interval=5).delay(1000) == timedelta(seconds=5)
    huge = ConfirmationPolicy(backoff=1e6, max_interval=timedelta(days=1))
    assert huge.delay(10_000) == timedelta(days=1)  # float overflow is capped, not raised


def test_seconds_become_timedeltas() -> None:
    policy = ConfirmationPolicy(interval=1.5, max_interval=60, claim_timeout=30)
    assert (policy.interval, policy.max_interval, policy.claim_timeout) == (
        timedelta(seconds=1.5), timedelta(minutes=1), timedelta(seconds=30))


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"max_attempts": 0}, "max_attempts"),
        ({"max_attempts": 2.5}, "max_attempts"),
        ({"max_attempts": True}, "max_attempts"),
        ({"interval": -1}, "interval"),
        ({"interval": "10s"}, "interval"),
        ({"backoff": 0.5}, "backoff"),
        ({"backoff": None}, "backoff"),
        ({"max_interval": 1, "interval": 10}, "max_interval"),
        ({"claim_timeout": 0}, "claim_timeout"),
    ],
)
def test_bad_policy_is_rejected(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(InvalidConfirmationError, match=match):
        ConfirmationPolicy(**kwargs)  # type: ignore[arg-type]


def test_delay_needs_a_failed_attempt() -> None:
    with pytest.raises(ValueError, match="failed_count"):
        ConfirmationPolicy().delay(0)


def test_a_confirmation_policy_is_a_retry_policy_with_the_same_formula_and_names() -> None:
    policy = ConfirmationPolicy(max_attempts=4, interval=10, backoff=3, max_interval=timedelta(minutes=2))
    same = RetryPolicy(max_attempts=4, interval=timedelta(seconds=10), backoff=3, max_interval=timedelta(minutes=2))
    assert isinstance(policy, RetryPolicy)
    assert [policy.delay(n) for n in range(1, 6)] == [same.delay(n) for n in range(1, 6)]
    assert [policy.exhausted(n) for n in range(1, 6)] == [same.exhausted(n) for n in range(1, 6)]
    assert policy.max_interval == timedelta(minutes=2)


def test_a_bad_jitter_is_an_invalid_confirmation_error() -> None:
    with pytest.raises(InvalidConfirmationError, match="jitter"):
        ConfirmationPolicy(jitter=1.5)
    assert issubclass(InvalidConfirmationError, ConfigurationError)
