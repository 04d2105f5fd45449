"""Alert rules over the message store, and what a rule's evaluation changes (pure functions: :func:`decide`).

A rule counts messages (by state, source system, service, operation, error code, updated within ``window``, received
before ``older_than``) or runs one SQL query returning an integer, and holds while that number is above ``limit``.
It notifies when it starts to hold (``firing``), again at most every ``repeat_interval`` while it holds
(``repeat``), and once when it stops (``resolved``): Alertmanager's model.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum

import sqlalchemy as sa

from openroute.definitions.errors import ConfigurationError
from openroute.definitions.names import by_unique_name
from openroute.persistence import MessageState, message_table
from openroute.persistence.alerts import AlertState

__all__ = ["AlertRule", "NotificationKind", "decide"]

_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,100}$")


class NotificationKind(StrEnum):
    """Why a rule notifies."""

    FIRING = "firing"
    REPEAT = "repeat"
    RESOLVED = "resolved"


@dataclass(frozen=True)
class AlertRule:
    """One alert rule. Give count filters (any of ``states``, ``source_system``, ``service``, ``operation``,
    ``error_code``, ``window``, ``older_than``) or ``sql``, not both; the rule holds while the number is > ``limit``.
    """

    name: str
    states: tuple[MessageState, ...] = ()
    source_system: str | None = None
    service: str | None = None
    operation: str | None = None
    error_code: str | None = None
    #: only messages whose last update is within this time before the evaluation
    window: timedelta | None = None
    #: only messages received longer ago than this
    older_than: timedelta | None = None
    #: one query returning an integer (an escape hatch: it runs as written, read-only is your job)
    sql: str | None = None
    limit: int = 0
    #: how often the rule is evaluated (by one node of the cluster)
    interval: timedelta = timedelta(minutes=1)
    #: while the rule holds, notify again at most this often
    repeat_interval: timedelta = timedelta(hours=4)
    #: notifier names (default: every configured notifier)
    notifiers: tuple[str, ...] = ()
    enabled: bool = True
    description: str = ""

    def __post_init__(self) -> None:
        problems = []
        if not isinstance(self.name, str) or not _NAME.match(self.name):
            problems.append(f"the name must be 1-100 letters, digits, '_', '.', '-', got {self.name!r}")
        try:
            object.__setattr__(self, "states", tuple(MessageState(str(s).upper()) for s in self.states))
        except ValueError as error:
            problems.append(f"states: {error}")
        filters = (self.states or self.source_system or self.service or self.operation or self.error_code
                   or self.window or self.older_than)
        if self.sql is not None and filters:
            problems.append("give count filters or sql, not both")
        if self.sql is not None and not self.sql.strip():
            problems.append("sql is empty")
        if isinstance(self.limit, bool) or not isinstance(self.limit, int) or self.limit < 0:
            problems.append(f"limit must be an integer >= 0, got {self.limit!r}")
        for name in ("interval", "repeat_interval"):
            if getattr(self, name) <= timedelta(0):
                problems.append(f"{name} must be positive, got {getattr(self, name)}")
        for name in ("window", "older_than"):
            value = getattr(self, name)
            if value is not None and value <= timedelta(0):
                problems.append(f"{name} must be positive, got {value}")
        if problems:
            raise ConfigurationError(f"alert rule {self.name}: " + "; ".join(problems))
        object.__setattr__(self, "notifiers", tuple(self.notifiers))

    def query(self, now: datetime) -> sa.Executable:
        """The query whose single integer is the rule's value at ``now``."""
        if self.sql is not None:
            return sa.text(self.sql)
        m = message_table.c
        conditions: list[sa.ColumnElement[bool]] = []
        if self.states:
            conditions.append(m.state.in_(list(self.states)))
        for column, value in ((m.source_system, self.source_system), (m.service, self.service),
                              (m.operation, self.operation), (m.last_error_code, self.error_code)):
            if value is not None:
                conditions.append(column == value)
        if self.window is not None:
            conditions.append(m.last_update_ts >= now - self.window)
        if self.older_than is not None:
            conditions.append(m.receive_ts < now - self.older_than)
        return sa.select(sa.func.count()).select_from(message_table).where(sa.true(), *conditions)

    def value(self, connection: sa.Connection, now: datetime) -> int:
        """The rule's number at ``now``; ConfigurationError when its SQL does not return one integer."""
        result = connection.execute(self.query(now)).first()
        if result is None or len(result) != 1 or isinstance(result[0], bool) or not isinstance(result[0], int):
            raise ConfigurationError(f"alert rule {self.name}: its query must return one integer, got {result!r}")
        return int(result[0])


def decide(rule: AlertRule, state: AlertState, value: int, now: datetime
           ) -> tuple[AlertState, NotificationKind | None]:
    """The rule's next state after it evaluated to ``value`` at ``now``, and the notification to send (None)."""
    holds = value > rule.limit
    evaluated = AlertState(state.rule, state.firing, value, state.fired_at, state.notified_at, state.resolved_at, now)
    if holds and not state.firing:
        return AlertState(state.rule, True, value, now, now, None, now), NotificationKind.FIRING
    if holds and (state.notified_at is None or now - state.notified_at >= rule.repeat_interval):
        return AlertState(state.rule, True, value, state.fired_at, now, None, now), NotificationKind.REPEAT
    if not holds and state.firing:
        return AlertState(state.rule, False, value, state.fired_at, now, now, now), NotificationKind.RESOLVED
    return evaluated, None


def rules_by_name(rules: Sequence[AlertRule]) -> dict[str, AlertRule]:
    """``rules`` by name; a name given twice is a ConfigurationError."""
    return by_unique_name(rules, "alert rule {name} is given")
