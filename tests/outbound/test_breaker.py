"""The circuit breaker's rules (openroute/outbound/breaker.py): pure functions, no store."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from openroute import ConfigurationError
from openroute.outbound.breaker import (
    BreakerRow,
    BreakerSettings,
    BreakerState,
    Verdict,
    closed,
    failure_rate,
    forced,
    opened,
    permit,
    trial_result,
)

NOW = datetime(2026, 11, 25, 12, 0, tzinfo=UTC)
SETTINGS = BreakerSettings(failure_rate_threshold=50, window_size=4, minimum_calls=4, open_wait=timedelta(seconds=20),
                           trial_calls=2, trial_timeout=timedelta(seconds=5))
S = BreakerState


def test_closed_allows_and_the_rate_waits_for_the_minimum_number_of_calls() -> None:
    row = BreakerRow("HLR", S.CLOSED, NOW)
    assert permit(row, SETTINGS, NOW).verdict is Verdict.ALLOW
    assert failure_rate([True, True, True], SETTINGS) is None
    assert failure_rate([True, True, False, False], SETTINGS) == 50.0


def test_open_refuses_until_open_wait_then_the_next_call_is_the_first_trial() -> None:
    row = opened(BreakerRow("HLR", S.CLOSED, NOW), SETTINGS, NOW, "75% failed")
    assert row.state is S.OPEN and row.open_until == NOW + timedelta(seconds=20) and row.version == 1
    refused = permit(row, SETTINGS, NOW + timedelta(seconds=19))
    assert refused.verdict is Verdict.REFUSE and refused.retry_at == row.open_until
    later = NOW + timedelta(seconds=20)
    trial = permit(row, SETTINGS, later)
    assert trial.verdict is Verdict.TRIAL and trial.row is not None
    assert trial.row.state is S.HALF_OPEN and trial.row.trials == (later,) and trial.row.version == 2


def test_half_open_lets_trial_calls_through_and_a_hung_trial_frees_its_place() -> None:
    row = BreakerRow("HLR", S.HALF_OPEN, NOW, trials=(NOW,), version=3)
    second = permit(row, SETTINGS, NOW + timedelta(seconds=1))
    assert second.verdict is Verdict.TRIAL and second.row is not None and len(second.row.trials) == 2
    full = permit(second.row, SETTINGS, NOW + timedelta(seconds=2))
    assert full.verdict is Verdict.REFUSE and full.retry_at == NOW + timedelta(seconds=5)
    # the first trial hung past trial_timeout: its place is free again (Resilience4j #903)
    freed = permit(second.row, SETTINGS, NOW + timedelta(seconds=5))
    assert freed.verdict is Verdict.TRIAL


def test_trials_close_on_success_and_open_again_on_a_failure() -> None:
    started = NOW
    row = BreakerRow("HLR", S.HALF_OPEN, NOW, trials=(started, started + timedelta(seconds=1)), version=3)
    one = trial_result(row, started, False, SETTINGS, NOW + timedelta(seconds=2))
    assert one is not None and one.state is S.HALF_OPEN and one.trial_successes == 1 and len(one.trials) == 1
    two = trial_result(one, started + timedelta(seconds=1), False, SETTINGS, NOW + timedelta(seconds=3))
    assert two is not None and two.state is S.CLOSED and two.trials == () and two.trial_successes == 0
    failed = trial_result(row, started, True, SETTINGS, NOW + timedelta(seconds=2))
    assert failed is not None and failed.state is S.OPEN
    assert failed.open_until == NOW + timedelta(seconds=22) and failed.reason == "a trial call failed"
    assert trial_result(closed(row, NOW, "x"), started, True, SETTINGS, NOW) is None, "left HALF_OPEN: no change"


def test_forced_open_stays_open_until_an_admin_closes_it() -> None:
    row = forced(BreakerRow("HLR", S.CLOSED, NOW), S.OPEN, NOW, "ops")
    assert row.state is S.OPEN and row.forced and row.open_until is None and row.reason == "forced open by ops"
    assert permit(row, SETTINGS, NOW + timedelta(days=1)).verdict is Verdict.REFUSE
    back = forced(row, S.CLOSED, NOW, "ops")
    assert back.state is S.CLOSED and not back.forced and back.version == row.version + 1
    with pytest.raises(ConfigurationError, match="OPEN or CLOSED"):
        forced(row, S.HALF_OPEN, NOW, "ops")


def test_bad_settings_are_configuration_errors_naming_each_value() -> None:
    with pytest.raises(ConfigurationError) as raised:
        BreakerSettings(failure_rate_threshold=0, window_size=5, minimum_calls=10, open_wait=timedelta(0))
    text = str(raised.value)
    assert "failure_rate_threshold must be in (0, 100], got 0" in text
    assert "minimum_calls (10) must not exceed window_size (5)" in text
    assert "open_wait must be positive" in text
