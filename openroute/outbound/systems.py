"""External systems as declared once in ``openroute.toml`` (``[external_systems.NAME]``): where they are, how long a
call may take, their circuit breaker and whether their calls are recorded.

```toml
[external_systems.HLR]
base_url = "http://hlr.internal:8080/"
timeout = "5s"                       # each read / write / connect of the HTTP client
call_timeout = "10s"                 # the whole call, whatever client the route uses
headers = { X-Client = "openroute" } # sent with every call of the system's HTTP client
max_concurrent_calls = 10            # the bulkhead: calls in flight per node (more wait in memory)
max_calls_per_second = 50            # and call starts per second per node (optional)

[external_systems.HLR.breaker]
failure_rate_threshold = 50
window_size = 20
minimum_calls = 10
open_wait = "20s"
trial_calls = 2

[external_systems.HLR.records]
enabled = true
operations = "activate.*"            # call keys (regular expression, whole key); default: all
secret_fields = ["pin", "password"]  # masked in the stored request and response
```
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from urllib.parse import urlsplit

import httpx

from openroute.definitions.errors import ConfigurationError
from openroute.definitions.names import by_unique_name
from openroute.outbound.breaker import BreakerSettings
from openroute.outbound.bulkhead import Bulkhead
from openroute.persistence.secrets import add_secret_names, mask_secrets

__all__ = ["CallRecordSettings", "ExternalSystem"]


@dataclass(frozen=True)
class CallRecordSettings:
    """Whether and how the calls of one system are recorded (``[external_systems.NAME.records]``)."""

    enabled: bool = False
    #: the call keys recorded: a regular expression matching the whole key (None: every call)
    operations: str | None = None
    #: names (JSON members, XML elements and attributes, form and query fields, headers) whose values are replaced
    #: by ``***``, in the records and in everything else this process shows (:func:`~openroute.persistence.secrets.
    #: mask_secrets`; its well-known names, ``password``, ``apikey``, ``Authorization``..., are masked anyway)
    secret_fields: tuple[str, ...] = ()
    #: a request or response longer than this is cut (with "...")
    max_chars: int = 100_000

    def __post_init__(self) -> None:
        if self.operations is not None:
            try:
                re.compile(self.operations)
            except re.error as error:
                raise ConfigurationError(f"records: operations is not a regular expression: {error}") from None
        if self.max_chars < 100:
            raise ConfigurationError(f"records: max_chars must be >= 100, got {self.max_chars}")
        object.__setattr__(self, "secret_fields", tuple(self.secret_fields))
        # a system's secret is masked wherever it shows (an error text, an externalCalls result, the log), not only
        # in its records
        add_secret_names(self.secret_fields)

    def records(self, key: str) -> bool:
        """Is the call ``key`` recorded?"""
        return self.enabled and (self.operations is None or re.fullmatch(self.operations, key) is not None)

    def clean(self, text: str | None) -> str | None:
        """``text`` masked (:func:`~openroute.persistence.secrets.mask_secrets` with ``secret_fields``) and cut to
        ``max_chars``."""
        if text is None:
            return None
        text = mask_secrets(text, self.secret_fields)
        return text if len(text) <= self.max_chars else text[: self.max_chars - 3] + "..."


@dataclass(frozen=True)
class ExternalSystem:
    """One external system: its address (``base_url`` for HTTP, ``wsdl`` for SOAP), timeouts, circuit breaker
    (None: no breaker) and call records."""

    name: str
    base_url: str | None = None
    wsdl: str | None = None
    #: seconds for each read / write / pool wait of the shipped HTTP client
    timeout: float = 10.0
    #: seconds to connect (default: ``timeout``)
    connect_timeout: float | None = None
    #: the whole call, whatever client makes it: cut off and counted as a failure (code TIMEOUT) after it
    call_timeout: timedelta = timedelta(seconds=30)
    #: headers the shipped HTTP client sends with every call
    headers: Mapping[str, str] = field(default_factory=dict)
    breaker: BreakerSettings | None = field(default_factory=BreakerSettings)
    records: CallRecordSettings = field(default_factory=CallRecordSettings)
    #: the bulkhead: at most this many calls in flight per node (None: no limit); the others wait for a place
    max_concurrent_calls: int | None = None
    #: at most this many call starts per second per node (None: no limit)
    max_calls_per_second: float | None = None
    #: replaces the network for the shipped clients' calls of this system (``ExternalHttpClient``, ``SoapService``
    #: inside an ``ext_call(..., system=NAME)``): a test's fake (:mod:`openroute.testing`); None: the network
    transport: httpx.AsyncBaseTransport | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name or len(self.name) > 100:
            raise ConfigurationError(f"an external system needs a name of 1-100 characters, got {self.name!r}")
        if self.base_url is not None:
            parts = urlsplit(self.base_url)
            if parts.scheme not in {"http", "https"} or not parts.netloc:
                raise ConfigurationError(f"external system {self.name}: base_url must be an absolute http(s) URL, "
                                         f"got {self.base_url!r}")
        for name in ("timeout", "connect_timeout"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int | float) or value <= 0):
                raise ConfigurationError(f"external system {self.name}: {name} must be a positive number of "
                                         f"seconds, got {value!r}")
        if self.call_timeout <= timedelta(0):
            raise ConfigurationError(f"external system {self.name}: call_timeout must be positive, "
                                     f"got {self.call_timeout}")
        if self.transport is not None and not isinstance(self.transport, httpx.AsyncBaseTransport):
            raise ConfigurationError(f"external system {self.name}: transport must be an httpx.AsyncBaseTransport, "
                                     f"got {self.transport!r}")
        object.__setattr__(self, "headers", dict(self.headers))
        Bulkhead(self.name, self.max_concurrent_calls, self.max_calls_per_second)  # checks both limits


def systems_by_name(systems: Iterable[ExternalSystem]) -> dict[str, ExternalSystem]:
    """``systems`` by name; a name given twice is a ConfigurationError."""
    return by_unique_name(systems, "external system {name} is declared")
