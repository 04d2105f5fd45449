"""The ``[alerts]`` section: notifiers and alert rules."""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING, Literal

from pydantic import Field, model_validator

from openroute.config.values import Duration, PasswordSection, Section
from openroute.definitions.errors import ConfigurationError

if TYPE_CHECKING:
    from openroute.alerts import AlertEvaluator, Notifier
    from openroute.persistence import MessageStore


class NotifierConfig(PasswordSection):
    """Where alert notifications go (``[alerts.notifiers.NAME]``): ``type`` webhook, smtp or log."""

    type: Literal["webhook", "smtp", "log"]
    url: str | None = None
    headers: dict[str, str] = {}
    timeout: float = Field(10.0, gt=0)
    host: str | None = None
    port: int = Field(25, ge=1, le=65535)
    sender: str = "openroute@localhost"
    recipients: list[str] = []
    username: str | None = None
    starttls: bool = False

    @model_validator(mode="after")
    def _check(self) -> NotifierConfig:
        if self.type == "webhook" and self.url is None:
            raise ValueError("a webhook notifier needs url")
        if self.type == "smtp" and (self.host is None or not self.recipients):
            raise ValueError("an smtp notifier needs host and recipients")
        return self

    def notifier(self, name: str) -> Notifier:
        """The :class:`~openroute.alerts.Notifier` of these settings."""
        from openroute.alerts import LogNotifier, SmtpNotifier, WebhookNotifier

        if self.type == "webhook":
            return WebhookNotifier(name, self.url or "", headers=self.headers, timeout=self.timeout)
        if self.type == "smtp":
            return SmtpNotifier(name, self.host or "", self.recipients, sender=self.sender, port=self.port,
                                username=self.username, password=self.password, starttls=self.starttls,
                                timeout=self.timeout)
        return LogNotifier(name)


class AlertRuleConfig(Section):
    """One alert rule (``[alerts.rules.NAME]``; see :class:`openroute.alerts.AlertRule`)."""

    enabled: bool = True
    description: str = ""
    states: list[str] = []
    source_system: str | None = None
    service: str | None = None
    operation: str | None = None
    error_code: str | None = None
    window: Duration | None = None
    older_than: Duration | None = None
    sql: str | None = None
    limit: int = Field(0, ge=0)
    interval: Duration = timedelta(minutes=1)
    repeat_interval: Duration = timedelta(hours=4)
    notifiers: list[str] = []


class AlertsConfig(Section):
    """Alert rules over the store and where they notify (docs/outage.md); without rules no evaluator runs."""

    notifiers: dict[str, NotifierConfig] = {}
    rules: dict[str, AlertRuleConfig] = {}

    def evaluator(self, store: MessageStore, node_id: str) -> AlertEvaluator | None:
        """The :class:`~openroute.alerts.AlertEvaluator` of these settings (None without enabled rules).

        Raises ConfigurationError for a rule or notifier that cannot work (named)."""
        from openroute.alerts import AlertEvaluator, AlertRule, LogNotifier

        rules = []
        for name, rule in self.rules.items():
            rules.append(AlertRule(name, **rule.model_dump()))
        if not any(rule.enabled for rule in rules):
            return None
        notifiers = [config.notifier(name) for name, config in self.notifiers.items()] or [LogNotifier()]
        return AlertEvaluator(store, rules, notifiers, node_id=node_id)

    def check(self) -> None:
        """Build the rules and notifiers once (their own checks) without a store."""
        from openroute.alerts import AlertRule

        names = set(self.notifiers)
        for name, rule in self.rules.items():
            AlertRule(name, **rule.model_dump())
            unknown = sorted(set(rule.notifiers) - names)
            if unknown:
                raise ConfigurationError(f"rules.{name}: notifiers {unknown} are not configured")
        for name, config in self.notifiers.items():
            config.notifier(name)

