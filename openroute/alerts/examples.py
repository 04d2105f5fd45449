"""The shipped example rules, all disabled (copy one into ``[alerts.rules.NAME]`` with ``enabled = true``)."""

from __future__ import annotations

from datetime import timedelta

from openroute.alerts.rules import AlertRule
from openroute.persistence import MessageState

__all__ = ["EXAMPLE_RULES"]

EXAMPLE_RULES: tuple[AlertRule, ...] = (
    AlertRule("failed-last-10-min", states=(MessageState.FAILED,), window=timedelta(minutes=10), limit=0,
              enabled=False, description="messages ended FAILED in the last 10 minutes"),
    AlertRule("children-waiting-over-1h", states=(MessageState.WAITING_FOR_CHILDREN,), older_than=timedelta(hours=1),
              limit=0, enabled=False, description="parent messages waiting for their children for more than 1 h"),
    AlertRule("breaker-open", sql="SELECT count(*) FROM circuit_breaker WHERE state = 'OPEN'", limit=0,
              interval=timedelta(seconds=15), enabled=False,
              description="an external system's circuit breaker is open"),
)
