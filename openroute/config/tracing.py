"""The ``[tracing]`` section: traces of every message across its hops (:mod:`openroute.runtime.tracing`)."""

from __future__ import annotations

import re
from datetime import timedelta

from pydantic import Field, model_validator

from openroute.config.values import Duration, Section


class TracingConfig(Section):
    """Traces of every message across its hops, exported by OTLP over HTTP (needs the ``otel`` extra;
    :mod:`openroute.runtime.tracing`, docs/operations.md#tracing). Off by default."""

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
        from openroute.runtime import tracing

        tracing.configure(service_name=self.service_name, endpoint=self.endpoint,
                          timeout=self.export_timeout.total_seconds())
        return True
