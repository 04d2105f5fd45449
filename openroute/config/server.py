"""The one resolution of the server's settings: :class:`ServerConfig` from the TOML file, ``OPENROUTE_...``
environment variables over it and the command line over both (:func:`load_config`), used by ``openroute run``; the
operator commands read its store part alone (:class:`DatabaseConfig`, :func:`load_database_config`)."""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, Self

from pydantic import Field, ValidationError, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from openroute.config.alerts import AlertsConfig
from openroute.config.auth import AuthConfig, read_legacy_auth_config
from openroute.config.external import ExternalSystemConfig
from openroute.config.sections import (
    AdminHttpConfig,
    ConfirmationsConfig,
    EngineConfig,
    InboundConfig,
    LogConfig,
    RetentionConfig,
    ServerHttpConfig,
)
from openroute.config.tracing import TracingConfig
from openroute.config.values import ENV_PREFIX
from openroute.definitions.errors import ConfigurationError
from openroute.persistence import DEFAULT_DATABASE_URL

if TYPE_CHECKING:
    from openroute.inbound.throttling import ThrottleRule
    from openroute.outbound import ExternalCalls, ExternalSystem
    from openroute.persistence import MessageStore


class DatabaseConfig(BaseSettings):
    """Where the store is: the part of the server's configuration the operator commands (``openroute messages``,
    ``openroute spark``, ``openroute db``) read, every other key of the file and of the environment ignored, so that
    an operator needs none of the server's other secrets. Build it with :func:`load_database_config`."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="ignore", frozen=True)

    #: SQLAlchemy URL of the message store
    database_url: str = DEFAULT_DATABASE_URL
    #: the database password, put into database_url (which then carries none)
    database_password_file: Path | None = None
    database_password_env: str | None = None

    @model_validator(mode="after")
    def _one_password_source(self) -> Self:
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

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """The sources in their order: the command line over the environment over the TOML file."""
        # command line (init) over environment over the file; no .env file, no secrets directory
        return init_settings, env_settings, _FileSource(settings_cls, _FILE_VALUES.get(cls, {}))


class ServerConfig(DatabaseConfig):
    """Everything ``openroute run`` needs. Build it with :func:`load_config`."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, env_nested_delimiter="__", extra="forbid", frozen=True)

    #: module:attribute of the application; None: the reference application
    routes: str | None = None
    host: str = "127.0.0.1"
    port: int = Field(8080, ge=0, le=65535)
    #: bring the schema to the newest migration at start (else an old schema stops the start)
    migrate: bool = False
    #: names whose values are masked in every output besides the built-in ones (password, apikey, token, ...;
    #: :func:`openroute.persistence.mask_secrets`)
    secret_names: list[str] = []
    server: ServerHttpConfig = ServerHttpConfig()
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
        return self

    def external_system_list(self) -> list[ExternalSystem]:
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

    def external_calls(self, store: MessageStore) -> ExternalCalls:
        """The guard of the node's calls to the declared external systems over ``store`` (breakers, bulkheads, call
        records: :class:`~openroute.outbound.ExternalCalls`); ConfigurationError as :meth:`external_system_list`."""
        from openroute.outbound import ExternalCalls

        return ExternalCalls(store, self.external_system_list())

    def throttling_rules(self) -> list[ThrottleRule]:
        """The :class:`~openroute.inbound.throttling.ThrottleRule` list of ``throttling`` (ConfigurationError if
        one is malformed)."""
        from openroute.inbound.throttling import parse_rules

        return parse_rules(self.throttling)

    def messaging_config(self) -> dict[str, Any]:
        """The ``openroute.messaging.*`` keys of the file, flattened for :class:`openroute.messaging.MessagingApp`."""
        from openroute.messaging.config import flatten_tables

        tables = {name: table for name, table in (("openroute", self.openroute), ("mp", self.mp)) if table}
        return flatten_tables(tables)


_FILE_VALUES: dict[type, dict[str, Any]] = {}


class _FileSource(PydanticBaseSettingsSource):
    def __init__(self, settings_cls: type[BaseSettings], values: dict[str, Any]) -> None:
        super().__init__(settings_cls)
        self._values = values

    def get_field_value(self, field: Any, field_name: str) -> tuple[Any, str, bool]:  # pragma: no cover - unused
        return self._values.get(field_name), field_name, False

    def __call__(self) -> dict[str, Any]:
        return dict(self._values)



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
    Once loaded, its ``secret_names`` and its external systems' ``records.secret_fields`` are masked in every output
    of the process (:func:`openroute.persistence.add_secret_names`).
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
    from openroute.persistence import add_secret_names

    # what the configuration calls secret is masked in every output of this process from now on (its external
    # systems' secret_fields joined when the check above built them)
    add_secret_names(config.secret_names)
    return config


def load_database_config(path: str | Path | None = None, overrides: Mapping[str, Any] | None = None) -> DatabaseConfig:
    """Where the store is, as :func:`load_config` resolves it (the TOML file ``path``, ``OPENROUTE_...`` environment
    variables over it, ``overrides`` over both), reading nothing else: the file's other sections are neither
    validated nor resolved (a secret of ``[auth]`` need not be set).

    What the file calls secret (``secret_names``, the external systems' ``records.secret_fields``) is masked in every
    output of the process from then on, as :func:`load_config` does: an operator's command shows what the server
    shows.

    Raises ConfigurationError for a file that cannot be read or is not TOML, and for bad database keys."""
    file_values = _read_toml(path) if path is not None else {}
    _FILE_VALUES[DatabaseConfig] = file_values
    try:
        config = DatabaseConfig(**_drop_none(overrides or {}))
    except ValidationError as error:
        _fail(path, [_describe(item) for item in error.errors()])
    finally:
        _FILE_VALUES.pop(DatabaseConfig, None)
    from openroute.persistence import add_secret_names

    add_secret_names(_secret_names(file_values))
    return config


def _secret_names(file_values: Mapping[str, Any]) -> list[str]:
    """The names a configuration file calls secret, read as they are (the sections themselves are not checked)."""
    names = list(file_values.get("secret_names") or [])
    systems = file_values.get("external_systems")
    for system in systems.values() if isinstance(systems, Mapping) else ():
        records = system.get("records") if isinstance(system, Mapping) else None
        if isinstance(records, Mapping):
            names.extend(records.get("secret_fields") or [])
    return [name for name in names if isinstance(name, str) and name]


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
