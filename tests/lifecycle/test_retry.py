"""RetryPolicy arithmetic and its configuration errors."""

from __future__ import annotations

import random
from datetime import timedelta

import pytest

from openroute.definitions.errors import ConfigurationError
from openroute.definitions.retry import RetryPolicy
from tests.lifecycle.conftest import START


def test_exponential_backoff_with_cap() -> None:
    policy = RetryPolicy(max_attempts=6, interval=timedelta(seconds=10), backoff=3, max_interval=timedelta(seconds=100))
    assert [policy.delay(n).total_seconds() for n in range(1, 6)] == [10, 30, 90, 100, 100]
    assert policy.next_attempt(2, START) == START + timedelta(seconds=30)
    assert not policy.exhausted(5) and policy.exhausted(6)
    assert policy.next_attempt(6, START) is None


def test_jitter_stays_in_its_band_and_under_the_cap() -> None:
    policy = RetryPolicy(interval=timedelta(seconds=100), backoff=1, max_interval=timedelta(seconds=110), jitter=0.2,
                         rng=random.Random(7))
    delays = [policy.delay(1).total_seconds() for _ in range(500)]
    assert min(delays) >= 80 and max(delays) <= 110
    assert len(set(delays)) > 100  # it does vary
    assert sum(d < 100 for d in delays) > 150


def test_delay_needs_a_failure() -> None:
    with pytest.raises(ValueError):
        RetryPolicy().delay(0)


@pytest.mark.parametrize(
    "arguments",
    [
        {"max_attempts": 0},
        {"interval": timedelta(seconds=-1)},
        {"backoff": 0.5},
        {"interval": timedelta(seconds=10), "max_interval": timedelta(seconds=5)},
        {"jitter": 1.0},
        {"jitter": -0.1},
    ],
)
def test_bad_policies_are_refused(arguments: dict) -> None:
    with pytest.raises(ConfigurationError):
        RetryPolicy(**arguments)
