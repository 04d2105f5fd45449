"""The configuration of one ``openroute run`` server: one TOML file, ``OPENROUTE_...`` environment variables over
it, command-line options over both, validated at start with one clear line per bad key.

```toml
database_url = "postgresql+psycopg://openroute@db/openroute"
database_password_file = "/run/secrets/db"     # or database_password_env = "DB_PASSWORD"
routes = "myapp:app"

[engine]
concurrency = 32
processing_lease = "5m"                        # durations: seconds (30, 1.5) or "500ms", "30s", "5m", "2h", "1d"

[engine.default_retry]
max_attempts = 5
interval = "30s"

[auth.source_systems.CRM]
basic = { username = "crm", password_file = "/run/secrets/crm" }

[[auth.admins]]
username = "ops"
password_env = "OPENROUTE_OPS_PASSWORD"

[confirmations.systems.CRM]
soap = "https://crm.example/confirm"

[tracing]                                      # needs the otel extra; exporter headers: OTEL_EXPORTER_OTLP_HEADERS
enabled = true
endpoint = "http://collector:4318/v1/traces"
```

Environment variables are named after the key, nested keys joined by ``__``: ``OPENROUTE_DATABASE_URL``,
``OPENROUTE_ENGINE__CONCURRENCY``, ``OPENROUTE_LOG__LEVEL``. Secrets (passwords, API keys, the database password)
are given inline, from a file (``..._file``) or from a named environment variable (``..._env``).
The messaging layer's ``[openroute.messaging...]`` tables may sit in the same file (see :mod:`openroute.messaging`).

    from openroute.config import load_config
    config = load_config("openroute.toml", overrides={"port": 9000})
"""

from __future__ import annotations

import json
import os
import re
import tomllib
from collections.abc import Mapping
from datetime import timedelta
from pathlib import Path
from typing import Annotated, Any, Literal, NoReturn

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from openroute.errors import ConfigurationError

__all__ = [
    "AdminConfig",
    "AdminHttpConfig",
    "AuthConfig",
    "ConfirmationTarget",
    "ConfirmationsConfig",
    "EngineConfig",
    "ExternalSystemConfig",
    "InboundConfig",
    "LogConfig",
    "RetryConfig",
    "ServerConfig",
    "SourceSystemConfig",
    "TracingConfig",
    "load_config",
    "read_legacy_auth_config",
]

ENV_PREFIX = "OPENROUTE_"
DEFAULT_DATABASE_URL = "sqlite:///openroute.db"

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")


def _duration(value: Any) -> Any:
    """Seconds (int, float or numeric string) or a number with a unit (``500ms``, ``30s``, ``5m``, ``2h``, ``1d``);
    anything else is left to pydantic (a timedelta, ISO 8601 ``PT5M``)."""
    if isinstance(value, bool):
        raise ValueError("a duration must be seconds or a string like '30s'")
    if isinstance(value, int | float):
        return timedelta(seconds=value)
    if isinstance(value, str):
        match = _DURATION.match(value)
        if match:
            return timedelta(seconds=float(match.group(1)) * _UNITS[match.group(2) or "s"])
    return value


Duration = Annotated[timedelta, BeforeValidator(_duration)]


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _secret(owner: _Section, name: str) -> str | None:
    """The secret ``name`` of ``owner`` from exactly one of ``name``, ``name_file``, ``name_env`` (None if none)."""
    inline: str | None
    inline, file, env = (getattr(owner, name), getattr(owner, f"{name}_file"), getattr(owner, f"{name}_env"))
    given = [key for key, value in ((name, inline), (f"{name}_file", file), (f"{name}_env", env)) if value is not None]
    if len(given) > 1:
        raise ValueError(f"give one of {', '.join(given)}, not several")
    if file is not None:
        try:
            return Path(file).read_text(encoding="utf-8").rstrip("\r\n")
        except OSError as error:
            raise ValueError(f"cannot read {name}_file {str(file)!r}: {error.strerror or error}") from None
    if env is not None:
        if env not in os.environ:
            raise ValueError(f"{name}_env names the environment variable {env!r}, which is not set")
        return os.environ[env]
    return inline


class RetryConfig(_Section):
    """The default retry policy (see :class:`openroute.retry.RetryPolicy` for the formula)."""

    max_attempts: int = Field(3, ge=1)
    interval: Duration = timedelta(seconds=60)
    backoff: float = Field(2.0, ge=1.0)
    max_interval: Duration = timedelta(hours=1)
    jitter: float = Field(0.0, ge=0.0, lt=1.0)

    @model_validator(mode="after")
    def _check(self) -> RetryConfig:
        if self.interval < timedelta(0):
            raise ValueError(f"interval must not be negative, got {self.interval}")
        if self.max_interval < self.interval:
            raise ValueError(f"max_interval {self.max_interval} is shorter than interval {self.interval}")
        return self

    def policy(self) -> Any:
        """The :class:`~openroute.retry.RetryPolicy` of these settings."""
        from openroute.retry import RetryPolicy

        return RetryPolicy(self.max_attempts, self.interval, self.backoff, self.max_interval, self.jitter)


class EngineConfig(_Section):
    """Settings of the message engine of this node (see :class:`openroute.engine.EngineSettings`)."""

    #: default: host name and process id
    node_id: str | None = Field(None, min_length=1, max_length=100)
    concurrency: int = Field(64, ge=1)
    queue_size: int = Field(256, ge=1)
    max_payload_bytes: int = Field(1024 * 1024, ge=1)
    #: "off" (or false) runs no repoll scheduler
    repoll_interval: Duration | None = timedelta(seconds=10)
    processing_lease: Duration = timedelta(minutes=5)
    new_pickup_age: Duration = timedelta(minutes=1)
    postpone_interval: Duration = timedelta(seconds=30)
    repoll_batch: int = Field(1000, ge=1)
    write_batch: int = Field(256, ge=1)
    db_threads: int = Field(4, ge=1)
    stop_timeout: float = Field(30.0, ge=0)
    heartbeat_interval: Duration = timedelta(seconds=30)
    #: seconds a sender is told to wait (Retry-After) while the database is unreachable
    store_retry_after: int = Field(5, ge=1)
    default_retry: RetryConfig = RetryConfig()

    @model_validator(mode="before")
    @classmethod
    def _off(cls, data: Any) -> Any:
        if isinstance(data, Mapping) and data.get("repoll_interval") in ("off", False, "false"):
            data = {**data, "repoll_interval": None}
        return data

    @model_validator(mode="after")
    def _check(self) -> EngineConfig:
        if self.repoll_interval is not None and self.repoll_interval <= timedelta(0):
            raise ValueError(f"repoll_interval must be positive or 'off', got {self.repoll_interval}")
        for name in ("processing_lease", "new_pickup_age", "postpone_interval", "heartbeat_interval"):
            if getattr(self, name) < timedelta(0):
                raise ValueError(f"{name} must not be negative, got {getattr(self, name)}")
        return self

    def settings(self) -> Any:
        """The :class:`~openroute.engine.EngineSettings` of these settings."""
        from openroute.engine import EngineSettings

        values = self.model_dump(exclude={"default_retry", "node_id"})
        if self.node_id is not None:
            values["node_id"] = self.node_id
        return EngineSettings(default_retry_policy=self.default_retry.policy(), **values)


class InboundConfig(_Section):
    """Limits of the inbound HTTP/SOAP endpoints (see :class:`openroute.inbound.InboundSettings`)."""

    max_body_bytes: int = Field(1024 * 1024, ge=1)
    max_depth: int = Field(64, ge=2, le=1000)
    #: a request (headers and body) must arrive whole this long after its first byte, else the connection is closed
    request_deadline: Duration = timedelta(seconds=30)

    @model_validator(mode="after")
    def _check(self) -> InboundConfig:
        if not self.request_deadline > timedelta(0):
            raise ValueError(f"request_deadline must be positive, got {self.request_deadline}")
        return self

    def settings(self) -> Any:
        from openroute.inbound import InboundSettings

        return InboundSettings(max_body_bytes=self.max_body_bytes, max_depth=self.max_depth)


class BasicConfig(_Section):
    username: str = Field(min_length=1)
    password: str | None = None
    password_file: Path | None = None
    password_env: str | None = None

    @model_validator(mode="after")
    def _resolve(self) -> BasicConfig:
        secret = _secret(self, "password")
        if secret is None:
            raise ValueError("give password, password_file or password_env")
        object.__setattr__(self, "password", secret)
        return self


class SourceSystemConfig(_Section):
    """The credentials one source system may send with: HTTP basic and/or an API key (``X-API-Key``)."""

    basic: BasicConfig | None = None
    api_key: str | None = None
    api_key_file: Path | None = None
    api_key_env: str | None = None

    @model_validator(mode="after")
    def _resolve(self) -> SourceSystemConfig:
        object.__setattr__(self, "api_key", _secret(self, "api_key"))
        if self.basic is None and self.api_key is None:
            raise ValueError("give basic and/or api_key (or api_key_file / api_key_env)")
        return self


class AdminConfig(_Section):
    """A user of the admin API."""

    username: str = Field(min_length=1)
    password: str | None = None
    password_file: Path | None = None
    password_env: str | None = None
    roles: list[str] = ["admin"]

    @model_validator(mode="after")
    def _resolve(self) -> AdminConfig:
        secret = _secret(self, "password")
        if secret is None:
            raise ValueError("give password, password_file or password_env")
        object.__setattr__(self, "password", secret)
        return self


class AuthConfig(_Section):
    """Who may send messages (``source_systems``) and who may use the admin API (``admins``); empty: no checks."""

    source_systems: dict[str, SourceSystemConfig] = {}
    admins: list[AdminConfig] = []
    #: failed logins of one user from one client address within failed_login_window before it gets 429
    max_failed_logins: int = Field(10, ge=1)
    #: failed logins from one client address (any user) within failed_login_window before it gets 429
    max_failed_logins_per_address: int = Field(50, ge=1)
    failed_login_window: Duration = timedelta(minutes=1)

    def build(self) -> tuple[Any, Any]:
        """``(SourceSystemAuth | None, AdminAuth | None)``, sharing one :class:`~openroute.inbound.LoginLimiter`."""
        from openroute.inbound import AdminAuth, AdminUser, ApiKey, BasicCredentials, LoginLimiter, SourceSystemAuth

        limiter = LoginLimiter(self.max_failed_logins, self.max_failed_logins_per_address,
                               self.failed_login_window.total_seconds())

        inbound = None
        if self.source_systems:
            systems: dict[str, list[Any]] = {}
            for name, system in self.source_systems.items():
                items: list[Any] = []
                if system.basic is not None:
                    items.append(BasicCredentials(system.basic.username, system.basic.password or ""))
                if system.api_key is not None:
                    items.append(ApiKey(system.api_key))
                systems[name] = items
            inbound = SourceSystemAuth(systems, limiter=limiter)
        admin = None
        if self.admins:
            admin = AdminAuth((AdminUser(a.username, a.password or "", frozenset(a.roles)) for a in self.admins),
                              limiter=limiter)
        return inbound, admin


class AdminHttpConfig(_Section):
    """Who may reach the admin API, the console and ``/metrics`` from where (``[admin]``)."""

    #: sites (``https://ops.example:8443``) besides the node's own whose pages may act through the admin API / console
    allowed_origins: list[str] = []
    #: ``/metrics`` needs an admin user (roles metrics, web or admin); off: it is open to anyone who reaches the port
    metrics_auth: bool = False

    @model_validator(mode="after")
    def _check(self) -> AdminHttpConfig:
        from openroute.admin.cross_site import normalize_origins

        try:
            normalize_origins(self.allowed_origins)
        except ConfigurationError as error:
            raise ValueError(str(error)) from None
        return self


class ConfirmationTarget(_Section):
    """Where one source system is told a message's outcome: a SOAP endpoint, an HTTP JSON URL or an outgoing
    channel of the ``[openroute.messaging...]`` tables (docs/channels.md)."""

    soap: str | None = None
    http: str | None = None
    channel: str | None = None
    headers: dict[str, str] = {}
    timeout: float = Field(10.0, gt=0)

    @model_validator(mode="after")
    def _one(self) -> ConfirmationTarget:
        if self.channel is None and (self.soap is None) == (self.http is None):
            raise ValueError("give exactly one of soap = url or http = url")
        if self.channel is not None and (self.soap is not None or self.http is not None):
            raise ValueError("give exactly one of soap = url, http = url or channel = name")
        if self.soap is not None and self.headers:
            raise ValueError("headers apply to http targets only")
        return self


class ConfirmationsConfig(_Section):
    """Confirmations of final states; without ``systems`` outcomes are only logged."""

    #: how often failed confirmations are retried and stuck ones repaired
    interval: Duration = timedelta(seconds=10)
    #: the lease of a node on a confirmation it sends, renewed every third of it while sending: the claims of a node
    #: that died are taken again after at most this (plus one ``interval``)
    claim_timeout: Duration = timedelta(seconds=15)
    #: a send with no answer after this is a failed attempt (retried per the confirmation policy)
    send_timeout: Duration = timedelta(minutes=5)
    #: confirmations claimed per query, and sent at once at most
    batch_size: int = Field(100, ge=1)
    concurrency: int = Field(8, ge=1)
    systems: dict[str, ConfirmationTarget] = {}

    @model_validator(mode="after")
    def _durations(self) -> ConfirmationsConfig:
        for name in ("interval", "claim_timeout", "send_timeout"):
            if getattr(self, name) <= timedelta(0):
                raise ValueError(f"{name} must be positive")
        return self

    def service(self, store: Any, node_id: str | None = None, messaging: Mapping[str, Any] | None = None) -> Any:
        """The :class:`~openroute.confirmation.ConfirmationService` of these settings over ``store`` (``messaging``:
        the ``openroute.messaging.*`` keys the channel targets are configured by)."""
        from openroute.confirmation import ConfirmationPolicy, ConfirmationService

        policy = ConfirmationPolicy(claim_timeout=self.claim_timeout)
        return ConfirmationService(store, self.callback(messaging), policy,
                                   batch_size=self.batch_size, concurrency=self.concurrency,
                                   send_timeout=self.send_timeout.total_seconds(), node_id=node_id)

    def callback(self, messaging: Mapping[str, Any] | None = None) -> Any:
        """The :class:`~openroute.confirmation.ConfirmationCallback` of these settings (``messaging``: the
        ``openroute.messaging.*`` keys the channel targets are configured by)."""
        from openroute.confirmation import (
            ChannelConfirmation,
            DefaultConfirmationCallback,
            DelegateConfirmationCallback,
            HttpJsonConfirmation,
            SoapConfirmation,
        )

        if not self.systems:
            return DefaultConfirmationCallback()
        transports: list[Any] = []
        for system, target in self.systems.items():
            try:
                if target.channel is not None:
                    transports.append(ChannelConfirmation(system, target.channel, messaging, timeout=target.timeout))
                elif target.soap is not None:
                    transports.append(SoapConfirmation(system, target.soap, timeout=target.timeout))
                else:
                    transports.append(HttpJsonConfirmation(system, target.http or "", timeout=target.timeout,
                                                           headers=target.headers))
            except (ValueError, TypeError) as error:  # the transports' own checks (URL, headers)
                raise ConfigurationError(f"confirmations.systems.{system}: {error}") from None
        return DelegateConfirmationCallback(transports)


class RetentionConfig(_Section):
    """How long final messages are kept (``[retention]``; see :class:`openroute.retention.RetentionPolicy`).

    ``keep`` maps a final state to its keep time, e.g. ``keep = { OK = "30d", FAILED = "180d" }``; with no
    ``keep`` nothing is deleted and no job runs.
    """

    keep: dict[str, Duration] = {}
    batch_size: int = Field(1000, ge=1)
    interval: Duration = timedelta(hours=1)
    max_batches: int = Field(100, ge=1)

    @model_validator(mode="after")
    def _check(self) -> RetentionConfig:
        self.policy()  # the policy's own checks: final states only, non-negative keep times
        return self

    def policy(self) -> Any:
        """The :class:`~openroute.retention.RetentionPolicy` (None when ``keep`` is empty)."""
        if not self.keep:
            return None
        from openroute.retention import RetentionPolicy

        try:
            return RetentionPolicy(dict(self.keep), self.batch_size, self.interval, self.max_batches)
        except ConfigurationError as error:
            raise ValueError(str(error).removeprefix("retention: ")) from None


class BreakerConfig(_Section):
    """The circuit breaker of one external system (see :class:`openroute.outbound.BreakerSettings`)."""

    enabled: bool = True
    failure_rate_threshold: float = Field(50.0, gt=0, le=100)
    window_size: int = Field(100, ge=1)
    minimum_calls: int = Field(100, ge=1)
    open_wait: Duration = timedelta(seconds=60)
    trial_calls: int = Field(10, ge=1)
    trial_timeout: Duration = timedelta(seconds=30)
    refresh: Duration = timedelta(seconds=1)

    def settings(self) -> Any:
        """The :class:`~openroute.outbound.BreakerSettings` (None when the breaker is off)."""
        if not self.enabled:
            return None
        from openroute.outbound import BreakerSettings

        return BreakerSettings(**self.model_dump(exclude={"enabled"}))


class CallRecordsConfig(_Section):
    """Whether the calls of one external system are recorded (see :class:`openroute.outbound.CallRecordSettings`)."""

    enabled: bool = False
    #: the call keys recorded: a regular expression matching the whole key (default: every call)
    operations: str | None = None
    secret_fields: list[str] = []
    max_chars: int = Field(100_000, ge=100)


class ExternalSystemConfig(_Section):
    """One external system (``[external_systems.NAME]``; see :class:`openroute.outbound.ExternalSystem`)."""

    base_url: str | None = None
    wsdl: str | None = None
    timeout: Duration = timedelta(seconds=10)
    connect_timeout: Duration | None = None
    call_timeout: Duration = timedelta(seconds=30)
    headers: dict[str, str] = {}
    breaker: BreakerConfig = BreakerConfig()
    records: CallRecordsConfig = CallRecordsConfig()

    def system(self, name: str) -> Any:
        """The :class:`~openroute.outbound.ExternalSystem` of these settings."""
        from openroute.outbound import CallRecordSettings, ExternalSystem

        records = self.records
        return ExternalSystem(
            name, base_url=self.base_url, wsdl=self.wsdl, timeout=self.timeout.total_seconds(),
            connect_timeout=None if self.connect_timeout is None else self.connect_timeout.total_seconds(),
            call_timeout=self.call_timeout, headers=self.headers, breaker=self.breaker.settings(),
            records=CallRecordSettings(records.enabled, records.operations, tuple(records.secret_fields),
                                       records.max_chars),
        )


class NotifierConfig(_Section):
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
    password: str | None = None
    password_file: Path | None = None
    password_env: str | None = None
    starttls: bool = False

    @model_validator(mode="after")
    def _check(self) -> NotifierConfig:
        object.__setattr__(self, "password", _secret(self, "password"))
        if self.type == "webhook" and self.url is None:
            raise ValueError("a webhook notifier needs url")
        if self.type == "smtp" and (self.host is None or not self.recipients):
            raise ValueError("an smtp notifier needs host and recipients")
        return self

    def notifier(self, name: str) -> Any:
        """The :class:`~openroute.alerts.Notifier` of these settings."""
        from openroute.alerts import LogNotifier, SmtpNotifier, WebhookNotifier

        if self.type == "webhook":
            return WebhookNotifier(name, self.url or "", headers=self.headers, timeout=self.timeout)
        if self.type == "smtp":
            return SmtpNotifier(name, self.host or "", self.recipients, sender=self.sender, port=self.port,
                                username=self.username, password=self.password, starttls=self.starttls,
                                timeout=self.timeout)
        return LogNotifier(name)


class AlertRuleConfig(_Section):
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


class AlertsConfig(_Section):
    """Alert rules over the store and where they notify (docs/outage.md); without rules no evaluator runs."""

    notifiers: dict[str, NotifierConfig] = {}
    rules: dict[str, AlertRuleConfig] = {}

    def evaluator(self, store: Any, node_id: str) -> Any:
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


class TracingConfig(_Section):
    """Traces of every message across its hops, exported by OTLP over HTTP (needs the ``otel`` extra;
    :mod:`openroute.tracing`, docs/operations.md#tracing). Off by default."""

    enabled: bool = False
    #: the ``service.name`` of the spans
    service_name: str = Field("openroute", min_length=1)
    #: the collector's traces URL (``http://collector:4318/v1/traces``); None: the standard
    #: ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` / ``OTEL_EXPORTER_OTLP_ENDPOINT`` (default ``http://localhost:4318``)
    endpoint: str | None = None
    #: longest wait for one export
    export_timeout: Duration = timedelta(seconds=10)

    @model_validator(mode="after")
    def _check(self) -> TracingConfig:
        if self.endpoint is not None and not re.match(r"^https?://[^/\s]+", self.endpoint):
            raise ValueError(f"endpoint must be an http(s) URL, got {self.endpoint!r}")
        if self.export_timeout <= timedelta(0):
            raise ValueError(f"export_timeout must be positive, got {self.export_timeout}")
        return self

    def start(self) -> bool:
        """Turn tracing on when ``enabled`` (returns whether it is on). Raises ConfigurationError when the ``otel``
        extra is not installed."""
        if not self.enabled:
            return False
        from openroute import tracing

        tracing.configure(service_name=self.service_name, endpoint=self.endpoint,
                          timeout=self.export_timeout.total_seconds())
        return True


class LogConfig(_Section):
    level: Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"] = "INFO"
    format: Literal["text", "json"] = "text"

    @model_validator(mode="before")
    @classmethod
    def _upper(cls, data: Any) -> Any:
        if isinstance(data, Mapping) and isinstance(data.get("level"), str):
            data = {**data, "level": data["level"].upper()}
        return data


class ServerConfig(BaseSettings):
    """Everything ``openroute run`` needs. Build it with :func:`load_config`."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, env_nested_delimiter="__", extra="forbid", frozen=True)

    #: SQLAlchemy URL of the message store
    database_url: str = DEFAULT_DATABASE_URL
    #: the database password, put into database_url (which then carries none)
    database_password_file: Path | None = None
    database_password_env: str | None = None
    #: module:attribute of the application; None: the reference application
    routes: str | None = None
    host: str = "127.0.0.1"
    port: int = Field(8080, ge=0, le=65535)
    #: bring the schema to the newest migration at start (else an old schema stops the start)
    migrate: bool = False
    log: LogConfig = LogConfig()
    tracing: TracingConfig = TracingConfig()
    engine: EngineConfig = EngineConfig()
    inbound: InboundConfig = InboundConfig()
    auth: AuthConfig = AuthConfig()
    admin: AdminHttpConfig = AdminHttpConfig()
    confirmations: ConfirmationsConfig = ConfirmationsConfig()
    retention: RetentionConfig = RetentionConfig()
    #: the external systems routes call, by name (``ext_call(..., system=NAME)``)
    external_systems: dict[str, ExternalSystemConfig] = {}
    alerts: AlertsConfig = AlertsConfig()
    #: throttling rules ``system.operation = "limit/interval"`` (either part ``*``); none: no throttling
    throttling: dict[str, str | dict[str, str]] = {}
    #: the messaging layer's ``openroute.messaging.*`` keys (read by :mod:`openroute.messaging.config`)
    openroute: dict[str, Any] = {}
    #: the same keys in the MicroProfile spelling ``mp.messaging.*``
    mp: dict[str, Any] = {}

    @model_validator(mode="after")
    def _check(self) -> ServerConfig:
        if self.admin.metrics_auth and not self.auth.admins:
            raise ValueError("admin.metrics_auth needs admin users ([[auth.admins]]): /metrics would refuse everyone")
        for name in ("openroute", "mp"):
            unknown = sorted(set(getattr(self, name)) - {"messaging"})
            if unknown:
                raise ValueError(f"only [{name}.messaging...] tables may sit under [{name}], got {unknown}")
        if self.routes is not None:
            module, sep, attr = self.routes.partition(":")
            if not (sep and module and attr):
                raise ValueError(f"routes must be 'module:attribute', got {self.routes!r}")
        if self.database_password_file is not None and self.database_password_env is not None:
            raise ValueError("give one of database_password_file, database_password_env, not both")
        return self

    def resolved_database_url(self) -> str:
        """``database_url`` with the password of ``database_password_file`` / ``_env`` put in.

        Raises ConfigurationError when the file or variable cannot be read or the URL is malformed."""
        if self.database_password_file is None and self.database_password_env is None:
            return self.database_url
        from sqlalchemy.engine import make_url
        from sqlalchemy.exc import ArgumentError

        try:
            if self.database_password_file is not None:
                password = self.database_password_file.read_text(encoding="utf-8").rstrip("\r\n")
            else:
                password = os.environ[self.database_password_env or ""]
            return make_url(self.database_url).set(password=password).render_as_string(hide_password=False)
        except OSError as error:
            raise ConfigurationError(
                f"database_password_file: cannot read {str(self.database_password_file)!r}: {error.strerror}"
            ) from None
        except KeyError:
            raise ConfigurationError(
                f"database_password_env names {self.database_password_env!r}, which is not set") from None
        except ArgumentError as error:
            raise ConfigurationError(f"database_url: {error}") from None

    def external_system_list(self) -> list[Any]:
        """The declared :class:`~openroute.outbound.ExternalSystem` objects (ConfigurationError naming the system for a
        value that cannot work)."""
        systems, problems = [], []
        for name, declared in self.external_systems.items():
            try:
                systems.append(declared.system(name))
            except ConfigurationError as error:
                problems.append(f"external_systems.{name}: {error}")
        if problems:
            raise ConfigurationError("; ".join(problems))
        return systems

    def throttling_rules(self) -> list[Any]:
        """The :class:`~openroute.inbound.throttling.ThrottleRule` list of ``throttling`` (ConfigurationError if
        one is malformed)."""
        from openroute.inbound.throttling import parse_rules

        return parse_rules(self.throttling)

    def messaging_config(self) -> dict[str, Any]:
        """The ``openroute.messaging.*`` keys of the file, flattened for :class:`openroute.messaging.MessagingApp`."""
        from openroute.messaging.config import _flatten

        return _flatten({name: table for name, table in (("openroute", self.openroute), ("mp", self.mp)) if table})

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # command line (init) over environment over the file; no .env file, no secrets directory
        return init_settings, env_settings, _FileSource(settings_cls, _FILE_VALUES.get(cls, {}))


_FILE_VALUES: dict[type, dict[str, Any]] = {}


class _FileSource(PydanticBaseSettingsSource):
    def __init__(self, settings_cls: type[BaseSettings], values: dict[str, Any]) -> None:
        super().__init__(settings_cls)
        self._values = values

    def get_field_value(self, field: Any, field_name: str) -> tuple[Any, str, bool]:  # pragma: no cover - unused
        return self._values.get(field_name), field_name, False

    def __call__(self) -> dict[str, Any]:
        return dict(self._values)


def read_legacy_auth_config(path: str | Path) -> dict[str, Any]:
    """The JSON ``--auth-config`` file (``sourceSystems``, ``admins``, ``confirmations``) as the ``auth`` and
    ``confirmations`` sections of the TOML configuration. Raises ConfigurationError for an unreadable file or
    unknown top-level keys."""
    try:
        with open(path, encoding="utf-8") as file:
            data = json.load(file)
    except (OSError, ValueError) as error:
        raise ConfigurationError(f"cannot read --auth-config {path}: {error}") from None
    if not isinstance(data, dict):
        raise ConfigurationError(f"--auth-config {path}: the file must hold a JSON object")
    unknown = sorted(set(data) - {"sourceSystems", "admins", "confirmations"})
    if unknown:
        raise ConfigurationError(f"--auth-config {path}: unknown keys {unknown} "
                                 "(known: sourceSystems, admins, confirmations)")
    values: dict[str, Any] = {}
    auth: dict[str, Any] = {}
    systems = data.get("sourceSystems")
    if systems is not None:
        if not isinstance(systems, dict):
            raise ConfigurationError(f"--auth-config {path}: sourceSystems must map a system to its credentials")
        auth["source_systems"] = {
            name: ({_LEGACY_KEYS.get(k, k): v for k, v in entry.items()} if isinstance(entry, dict) else entry)
            for name, entry in systems.items()
        }
    if data.get("admins") is not None:
        auth["admins"] = data["admins"]
    if auth:
        values["auth"] = auth
    if data.get("confirmations") is not None:
        values["confirmations"] = {"systems": data["confirmations"]}
    return values


_LEGACY_KEYS = {"apiKey": "api_key", "apiKeyFile": "api_key_file", "apiKeyEnv": "api_key_env"}


def _read_toml(path: str | Path) -> dict[str, Any]:
    try:
        with open(path, "rb") as file:
            return tomllib.load(file)
    except OSError as error:
        raise ConfigurationError(f"cannot read configuration file {path}: {error.strerror or error}") from None
    except tomllib.TOMLDecodeError as error:
        raise ConfigurationError(f"configuration file {path} is not valid TOML: {error}") from None


def _merge(low: Mapping[str, Any], high: Mapping[str, Any]) -> dict[str, Any]:
    merged = dict(low)
    for key, value in high.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def _describe(error: Mapping[str, Any]) -> str:
    location = [str(part) for part in error["loc"]]
    # a model validator's error ends in no field; drop pydantic's internal tags ("function-after[...]")
    location = [part for part in location if "[" not in part]
    key = ".".join(location) or "(top level)"
    env = ENV_PREFIX + "__".join(part.upper() for part in location) if location else ""
    kind = error.get("type")
    if kind == "extra_forbidden":
        what = "unknown setting"
    elif kind == "missing":
        what = "missing"
    else:
        what = str(error["msg"]).removeprefix("Value error, ")
        if "input" in error and not isinstance(error["input"], dict | list):
            what += f", got {error['input']!r}"
    leaf = kind not in ("extra_forbidden", "value_error") and not any(part.isdigit() for part in location)
    return f"{key}: {what}" + (f" (environment: {env})" if env and leaf else "")


def load_config(
    path: str | Path | None = None,
    overrides: Mapping[str, Any] | None = None,
    *,
    auth_config: str | Path | None = None,
) -> ServerConfig:
    """The server's configuration: the TOML file ``path`` (optional), the legacy JSON ``auth_config`` file over it,
    ``OPENROUTE_...`` environment variables over both, then ``overrides`` (the command line; nested mappings,
    ``None`` values are ignored).

    Raises ConfigurationError listing every bad key, one per line, each with what was wrong and the value given.
    """
    file_values = _read_toml(path) if path is not None else {}
    if auth_config is not None:
        file_values = _merge(file_values, read_legacy_auth_config(auth_config))
    init = _drop_none(overrides or {})
    _FILE_VALUES[ServerConfig] = file_values
    try:
        config = ServerConfig(**init)
    except ValidationError as error:
        _fail(path, [_describe(item) for item in error.errors()])
    finally:
        _FILE_VALUES.pop(ServerConfig, None)
    problems = []
    # the objects' own checks (an API key's length, a confirmation URL) are configuration problems too
    for section, build in (("engine", config.engine.settings), ("inbound", config.inbound.settings),
                           ("auth", config.auth.build), ("confirmations", config.confirmations.callback),
                           ("external_systems", config.external_system_list), ("alerts", config.alerts.check),
                           ("throttling", config.throttling_rules)):
        try:
            build()
        except ConfigurationError as error:
            text = str(error)
            problems.append(text if text.startswith(f"{section}.") else f"{section}: {text}")
    if problems:
        _fail(path, problems)
    return config


def _fail(path: str | Path | None, problems: list[str]) -> NoReturn:
    where = f"configuration{f' ({path})' if path is not None else ''}"
    lines = "\n".join(f"  {problem}" for problem in problems)
    raise ConfigurationError(f"{where} has {len(problems)} problem{'s' if len(problems) > 1 else ''}:\n{lines}")


def _drop_none(values: Mapping[str, Any]) -> dict[str, Any]:
    kept: dict[str, Any] = {}
    for key, value in values.items():
        if isinstance(value, Mapping):
            value = _drop_none(value)
            if value:
                kept[key] = value
        elif value is not None:
            kept[key] = value
    return kept
