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

from openroute.config.auth import AdminConfig, AuthConfig, SourceSystemConfig, read_legacy_auth_config
from openroute.config.external import ExternalSystemConfig
from openroute.config.sections import (
    AdminHttpConfig,
    ConfirmationsConfig,
    ConfirmationTarget,
    EngineConfig,
    InboundConfig,
    LogConfig,
    RetryConfig,
)
from openroute.config.server import DatabaseConfig, ServerConfig, load_config, load_database_config
from openroute.config.tracing import TracingConfig

__all__ = [
    "AdminConfig",
    "AdminHttpConfig",
    "AuthConfig",
    "ConfirmationTarget",
    "ConfirmationsConfig",
    "DatabaseConfig",
    "EngineConfig",
    "ExternalSystemConfig",
    "InboundConfig",
    "LogConfig",
    "RetryConfig",
    "ServerConfig",
    "SourceSystemConfig",
    "TracingConfig",
    "load_config",
    "load_database_config",
    "read_legacy_auth_config",
]
