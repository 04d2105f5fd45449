"""Alerts over the message store: rules, the evaluator (one node per rule and period), notifiers (docs/outage.md).

    from openroute.alerts import AlertEvaluator, AlertRule, LogNotifier, WebhookNotifier
"""

from openroute.alerts.evaluator import AlertEvaluator
from openroute.alerts.examples import EXAMPLE_RULES
from openroute.alerts.notifiers import LogNotifier, Notification, Notifier, SmtpNotifier, WebhookNotifier
from openroute.alerts.rules import AlertRule, NotificationKind, decide

__all__ = [
    "EXAMPLE_RULES",
    "AlertEvaluator",
    "AlertRule",
    "LogNotifier",
    "Notification",
    "NotificationKind",
    "Notifier",
    "SmtpNotifier",
    "WebhookNotifier",
    "decide",
]
