"""External systems as declared once in ``openroute.toml`` (``[external_systems.NAME]``): where they are, how long a
call may take, their circuit breaker and whether their calls are recorded.

```toml
[external_systems.HLR]
base_url = "http://hlr.internal:8080/"
timeout = "5s"                       # each read / write / connect of the HTTP client
call_timeout = "10s"                 # the whole call, whatever client the route uses
headers = { X-Client = "openroute" } # sent with every call of the system's HTTP client

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

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any
from urllib.parse import urlsplit

import httpx

from openroute.errors import ConfigurationError
from openroute.names import by_unique_name
from openroute.outbound.breaker import BreakerSettings

__all__ = ["CallRecordSettings", "ExternalSystem", "mask"]

MASK = "***"


@dataclass(frozen=True)
class CallRecordSettings:
    """Whether and how the calls of one system are recorded (``[external_systems.NAME.records]``)."""

    enabled: bool = False
    #: the call keys recorded: a regular expression matching the whole key (None: every call)
    operations: str | None = None
    #: JSON keys / XML element names / form fields whose values are replaced by ``***`` (case-insensitive)
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

    def records(self, key: str) -> bool:
        """Is the call ``key`` recorded?"""
        return self.enabled and (self.operations is None or re.fullmatch(self.operations, key) is not None)

    def clean(self, text: str | None) -> str | None:
        """``text`` masked (see :func:`mask`) and cut to ``max_chars``."""
        if text is None:
            return None
        text = mask(text, self.secret_fields)
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


def systems_by_name(systems: Iterable[ExternalSystem]) -> dict[str, ExternalSystem]:
    """``systems`` by name; a name given twice is a ConfigurationError."""
    return by_unique_name(systems, "external system {name} is declared")


_XML_FIELD = r"(<(?:[\w.-]+:)?{name}\b[^>]*>)([^<]*)(</(?:[\w.-]+:)?{name}\s*>)"
_FORM_FIELD = r"((?:^|[?&\s]){name}=)([^&\s]*)"


def mask(text: str, secret_fields: Iterable[str]) -> str:
    """``text`` with the values of ``secret_fields`` replaced by ``***``: JSON object keys at any depth (when the
    text is JSON), XML elements (any namespace prefix) and ``name=value`` form or query fields otherwise."""
    names = [name for name in secret_fields if name]
    if not names or not text:
        return text
    lowered = {name.lower() for name in names}
    try:
        document = json.loads(text)
    except ValueError:
        document = _NOT_JSON
    if document is not _NOT_JSON:
        return json.dumps(_mask_json(document, lowered), ensure_ascii=False)
    for name in names:
        quoted = re.escape(name)
        text = re.sub(_XML_FIELD.format(name=quoted), rf"\g<1>{MASK}\g<3>", text, flags=re.IGNORECASE)
        text = re.sub(_FORM_FIELD.format(name=quoted), rf"\g<1>{MASK}", text, flags=re.IGNORECASE)
    return text


_NOT_JSON = object()


def _mask_json(value: Any, names: set[str]) -> Any:
    if isinstance(value, dict):
        return {k: (MASK if isinstance(k, str) and k.lower() in names else _mask_json(v, names))
                for k, v in value.items()}
    if isinstance(value, list):
        return [_mask_json(item, names) for item in value]
    return value
