"""Where alert notifications go: a webhook (JSON POST), e-mail (SMTP) or the log. Each notifier is independent: one
that fails is logged in one line and does not keep the others from being told."""

from __future__ import annotations

import asyncio
import logging
import smtplib
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from email.message import EmailMessage
from typing import Any
from urllib.parse import urlsplit

import httpx

from openroute.alerts.rules import NotificationKind
from openroute.definitions.errors import ConfigurationError
from openroute.persistence.secrets import mask_secrets

__all__ = ["LogNotifier", "Notification", "Notifier", "SmtpNotifier", "WebhookNotifier"]

log = logging.getLogger("openroute.alerts")


@dataclass(frozen=True)
class Notification:
    """What a rule tells: its name, why (firing / repeat / resolved), its value and limit, when."""

    rule: str
    kind: NotificationKind
    value: int
    limit: int
    at: datetime
    description: str = ""
    node_id: str = ""

    def to_json(self) -> dict[str, Any]:
        """The webhook body."""
        return {"rule": self.rule, "status": self.kind.value, "value": self.value, "limit": self.limit,
                "at": self.at.isoformat(), "description": mask_secrets(self.description), "node": self.node_id}

    def summary(self) -> str:
        """One line, e.g. ``alert failed-last-10-min firing: 3 > 0``."""
        relation = ">" if self.kind is not NotificationKind.RESOLVED else "<="
        return f"alert {self.rule} {self.kind.value}: {self.value} {relation} {self.limit}"


class Notifier(ABC):
    """Sends notifications somewhere; ``name`` is what rules refer to."""

    name: str

    @abstractmethod
    async def notify(self, notification: Notification) -> None:
        """Send ``notification``; raises on failure (the evaluator logs it and goes on with the other notifiers)."""


class LogNotifier(Notifier):
    """Logs each notification at WARNING (resolved at INFO) on ``openroute.alerts``."""

    def __init__(self, name: str = "log") -> None:
        self.name = name

    async def notify(self, notification: Notification) -> None:
        """Log the notification's summary line, with its description when it has one."""
        level = logging.INFO if notification.kind is NotificationKind.RESOLVED else logging.WARNING
        log.log(level, "%s%s", notification.summary(),
                f" ({notification.description})" if notification.description else "")


class WebhookNotifier(Notifier):
    """POSTs the notification as JSON to ``url``; an answer other than 2xx is a failure."""

    def __init__(self, name: str, url: str, *, headers: Mapping[str, str] | None = None, timeout: float = 10.0,
                 transport: httpx.AsyncBaseTransport | None = None) -> None:
        parts = urlsplit(url)
        if parts.scheme not in {"http", "https"} or not parts.netloc:
            raise ConfigurationError(f"notifier {name}: url must be an absolute http(s) URL, got {url!r}")
        self.name, self.url, self.headers, self.timeout = name, url, dict(headers or {}), timeout
        self._transport = transport

    async def notify(self, notification: Notification) -> None:
        """POST :meth:`Notification.to_json` to ``url``; raises RuntimeError for an answer other than 2xx, httpx's
        errors when the server cannot be reached."""
        async with httpx.AsyncClient(transport=self._transport, timeout=self.timeout) as client:
            response = await client.post(self.url, json=notification.to_json(), headers=self.headers)
        if response.status_code // 100 != 2:
            raise RuntimeError(f"webhook {self.url} answered HTTP {response.status_code}")


class SmtpNotifier(Notifier):
    """Sends an e-mail per notification through an SMTP server (``starttls`` upgrades the connection)."""

    def __init__(self, name: str, host: str, recipients: Sequence[str], *, sender: str = "openroute@localhost",
                 port: int = 25, username: str | None = None, password: str | None = None, starttls: bool = False,
                 timeout: float = 10.0) -> None:
        if not recipients:
            raise ConfigurationError(f"notifier {name}: give at least one recipient")
        self.name, self.host, self.port, self.recipients = name, host, port, list(recipients)
        self.sender, self.username, self.password = sender, username, password
        self.starttls, self.timeout = starttls, timeout

    async def notify(self, notification: Notification) -> None:
        """Mail the summary (as the subject) and the fields of the notification to ``recipients``; raises smtplib's
        errors or OSError on failure.

        The SMTP exchange runs in a worker thread, so the event loop is not blocked meanwhile.
        """
        email = EmailMessage()
        email["Subject"] = f"[openroute] {notification.summary()}"
        email["From"] = self.sender
        email["To"] = ", ".join(self.recipients)
        email.set_content("\n".join(f"{key}: {value}" for key, value in notification.to_json().items()))
        await asyncio.to_thread(self._send, email)

    def _send(self, email: EmailMessage) -> None:
        with smtplib.SMTP(self.host, self.port, timeout=self.timeout) as smtp:
            if self.starttls:
                smtp.starttls()
            if self.username is not None:
                smtp.login(self.username, self.password or "")
            smtp.send_message(email)
