"""The ``[external_systems.NAME]`` sections: the remote systems routes call, their breaker and call records."""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING

from pydantic import Field

from openroute.config.values import Duration, Section

if TYPE_CHECKING:
    from openroute.outbound import BreakerSettings, ExternalSystem


class BreakerConfig(Section):
    """The circuit breaker of one external system (see :class:`openroute.outbound.BreakerSettings`)."""

    enabled: bool = True
    failure_rate_threshold: float = Field(50.0, gt=0, le=100)
    window_size: int = Field(100, ge=1)
    minimum_calls: int = Field(100, ge=1)
    open_wait: Duration = timedelta(seconds=60)
    trial_calls: int = Field(10, ge=1)
    trial_timeout: Duration = timedelta(seconds=30)
    refresh: Duration = timedelta(seconds=1)

    def settings(self) -> BreakerSettings | None:
        """The :class:`~openroute.outbound.BreakerSettings` (None when the breaker is off)."""
        if not self.enabled:
            return None
        from openroute.outbound import BreakerSettings

        return BreakerSettings(**self.model_dump(exclude={"enabled"}))


class CallRecordsConfig(Section):
    """Whether the calls of one external system are recorded (see :class:`openroute.outbound.CallRecordSettings`)."""

    enabled: bool = False
    #: the call keys recorded: a regular expression matching the whole key (default: every call)
    operations: str | None = None
    secret_fields: list[str] = []
    max_chars: int = Field(100_000, ge=100)


class ExternalSystemConfig(Section):
    """One external system (``[external_systems.NAME]``; see :class:`openroute.outbound.ExternalSystem`)."""

    base_url: str | None = None
    wsdl: str | None = None
    timeout: Duration = timedelta(seconds=10)
    connect_timeout: Duration | None = None
    call_timeout: Duration = timedelta(seconds=30)
    headers: dict[str, str] = {}
    breaker: BreakerConfig = BreakerConfig()
    records: CallRecordsConfig = CallRecordsConfig()
    #: the bulkhead: calls in flight per node (default: no limit)
    max_concurrent_calls: int | None = Field(None, ge=1)
    #: call starts per second per node (default: no limit)
    max_calls_per_second: float | None = Field(None, gt=0)

    def system(self, name: str) -> ExternalSystem:
        """The :class:`~openroute.outbound.ExternalSystem` of these settings."""
        from openroute.outbound import CallRecordSettings, ExternalSystem

        records = self.records
        return ExternalSystem(
            name, base_url=self.base_url, wsdl=self.wsdl, timeout=self.timeout.total_seconds(),
            connect_timeout=None if self.connect_timeout is None else self.connect_timeout.total_seconds(),
            call_timeout=self.call_timeout, headers=self.headers, breaker=self.breaker.settings(),
            records=CallRecordSettings(records.enabled, records.operations, tuple(records.secret_fields),
                                       records.max_chars),
            max_concurrent_calls=self.max_concurrent_calls, max_calls_per_second=self.max_calls_per_second,
        )

