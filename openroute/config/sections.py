"""The engine's, the inbound's, the HTTP server's, the admin API's, the confirmations', retention's and the
log's sections."""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field, model_validator

from openroute.config.values import Duration, Section
from openroute.definitions.errors import ConfigurationError

if TYPE_CHECKING:
    from openroute.confirmation import ConfirmationCallback, ConfirmationService
    from openroute.definitions.retry import RetryPolicy
    from openroute.engine import EngineSettings
    from openroute.inbound import InboundSettings
    from openroute.persistence import MessageStore
    from openroute.runtime.retention import RetentionPolicy
    from openroute.wire.header_limits import HeaderLimits


class RetryConfig(Section):
    """The default retry policy (see :class:`openroute.definitions.retry.RetryPolicy` for the formula)."""

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

    def policy(self) -> RetryPolicy:
        """The :class:`~openroute.definitions.retry.RetryPolicy` of these settings."""
        from openroute.definitions.retry import RetryPolicy

        return RetryPolicy(self.max_attempts, self.interval, self.backoff, self.max_interval, self.jitter)


class EngineConfig(Section):
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

    def settings(self) -> EngineSettings:
        """The :class:`~openroute.engine.EngineSettings` of these settings."""
        from openroute.engine import EngineSettings

        values = self.model_dump(exclude={"default_retry", "node_id"})
        if self.node_id is not None:
            values["node_id"] = self.node_id
        return EngineSettings(default_retry_policy=self.default_retry.policy(), **values)


class InboundConfig(Section):
    """Limits of the inbound HTTP/SOAP endpoints (see :class:`openroute.inbound.InboundSettings`)."""

    max_body_bytes: int = Field(1024 * 1024, ge=1)
    max_depth: int = Field(64, ge=2, le=1000)
    #: a request (headers and body) must arrive whole this long after its first byte, else the connection is closed
    request_deadline: Duration = timedelta(seconds=30)
    #: the request line and headers of any request together, in bytes; over it: 431, connection closed
    max_header_bytes: int = Field(64 * 1024, ge=1024)
    #: headers a request may have; over it: 431, connection closed
    max_headers: int = Field(100, ge=10)

    @model_validator(mode="after")
    def _check(self) -> InboundConfig:
        if not self.request_deadline > timedelta(0):
            raise ValueError(f"request_deadline must be positive, got {self.request_deadline}")
        return self

    def settings(self) -> InboundSettings:
        """The :class:`~openroute.inbound.InboundSettings` of the node's inbound endpoints."""
        from openroute.inbound import InboundSettings

        return InboundSettings(max_body_bytes=self.max_body_bytes, max_depth=self.max_depth)

    def header_limits(self) -> HeaderLimits:
        """The :class:`~openroute.wire.header_limits.HeaderLimits` of every request to the node."""
        from openroute.wire.header_limits import HeaderLimits

        return HeaderLimits(max_bytes=self.max_header_bytes, max_headers=self.max_headers)


class ServerHttpConfig(Section):
    """How the node's HTTP server learns a client's address (``[server]``)."""

    #: the proxies (addresses or networks such as ``10.0.0.0/8``; ``"*"``: any peer) whose ``Forwarded`` (RFC 7239;
    #: else ``X-Forwarded-For`` and ``X-Forwarded-Proto``) gives the client's address and scheme
    #: (:mod:`openroute.wire.proxy_headers`); none (the default): the socket's peer is the client, whatever a header
    #: says
    forwarded_allow_ips: list[str] = []

    @model_validator(mode="after")
    def _check(self) -> ServerHttpConfig:
        for entry in self.forwarded_allow_ips:
            if entry != "*":
                try:
                    ipaddress.ip_network(entry, strict=False)
                except ValueError:
                    raise ValueError(f"forwarded_allow_ips: {entry!r} is not an IP address, a network "
                                     "(10.0.0.0/8) or \"*\"") from None
        return self



class AdminHttpConfig(Section):
    """Who may reach the admin API, the console and ``/metrics`` from where (``[admin]``)."""

    #: sites (``https://ops.example:8443``) besides the node's own whose pages may act through the admin API / console
    allowed_origins: list[str] = []
    #: ``/metrics`` needs an admin user (roles metrics, web or admin); off: it is open to anyone who reaches the port
    metrics_auth: bool = False

    @model_validator(mode="after")
    def _check(self) -> AdminHttpConfig:
        from openroute.auth.cross_site import normalize_origins

        try:
            normalize_origins(self.allowed_origins)
        except ConfigurationError as error:
            raise ValueError(str(error)) from None
        return self


class ConfirmationTarget(Section):
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


class ConfirmationsConfig(Section):
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

    def service(self, store: MessageStore, node_id: str | None = None,
                messaging: Mapping[str, Any] | None = None) -> ConfirmationService:
        """The :class:`~openroute.confirmation.ConfirmationService` of these settings over ``store`` (``messaging``:
        the ``openroute.messaging.*`` keys the channel targets are configured by)."""
        from openroute.confirmation import ConfirmationPolicy, ConfirmationService
        from openroute.runtime.logs import repeated_errors
        from openroute.runtime.tracing import confirmation_span

        policy = ConfirmationPolicy(claim_timeout=self.claim_timeout)
        return ConfirmationService(store, self.callback(messaging), policy,
                                   batch_size=self.batch_size, concurrency=self.concurrency,
                                   send_timeout=self.send_timeout.total_seconds(), node_id=node_id,
                                   span=confirmation_span, error_log=repeated_errors)

    def callback(self, messaging: Mapping[str, Any] | None = None) -> ConfirmationCallback:
        """The :class:`~openroute.confirmation.ConfirmationCallback` of these settings (``messaging``: the
        ``openroute.messaging.*`` keys the channel targets are configured by)."""
        from openroute.confirmation import (
            ChannelConfirmation,
            DefaultConfirmationCallback,
            DelegateConfirmationCallback,
            HttpJsonConfirmation,
            SoapConfirmation,
        )
        from openroute.messaging.publisher import ChannelPublisher
        from openroute.outbound import network_transport
        from openroute.runtime import tracing

        if not self.systems:
            return DefaultConfirmationCallback()
        transports: list[Any] = []
        for system, target in self.systems.items():
            try:
                if target.channel is not None:
                    channels = ChannelPublisher(messaging, [target.channel])
                    transports.append(ChannelConfirmation(system, target.channel, channels, timeout=target.timeout))
                elif target.soap is not None:
                    transports.append(SoapConfirmation(system, target.soap, timeout=target.timeout,
                                                       prepare_client=tracing.propagate_from,
                                                       transport=network_transport()))
                else:
                    transports.append(HttpJsonConfirmation(system, target.http or "", timeout=target.timeout,
                                                           headers=target.headers,
                                                           prepare_client=tracing.propagate_from,
                                                           transport=network_transport()))
            except (ValueError, TypeError) as error:  # the transports' own checks (URL, headers)
                raise ConfigurationError(f"confirmations.systems.{system}: {error}") from None
        return DelegateConfirmationCallback(transports)


class RetentionConfig(Section):
    """How long final messages are kept (``[retention]``; see :class:`openroute.runtime.retention.RetentionPolicy`).

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

    def policy(self) -> RetentionPolicy | None:
        """The :class:`~openroute.runtime.retention.RetentionPolicy` (None when ``keep`` is empty)."""
        if not self.keep:
            return None
        from openroute.runtime.retention import RetentionPolicy

        try:
            return RetentionPolicy(dict(self.keep), self.batch_size, self.interval, self.max_batches)
        except ConfigurationError as error:
            raise ValueError(str(error).removeprefix("retention: ")) from None



class LogConfig(Section):
    """The server's log (docs/configuration.md, "The log")."""

    level: Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"] = "INFO"
    format: Literal["text", "json"] = "text"
    #: uvicorn's access log, a line per HTTP request (INFO); off unless asked (or at DEBUG): a routine library line,
    #: which every accepted message's own line and every console refresh would repeat
    access: bool = False

    @model_validator(mode="before")
    @classmethod
    def _upper(cls, data: Any) -> Any:
        if isinstance(data, Mapping) and isinstance(data.get("level"), str):
            data = {**data, "level": data["level"].upper()}
        return data

