"""The ``[auth]`` section (source systems' credentials, admin users), and the legacy JSON ``--auth-config`` file."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, Self

from pydantic import Field, model_validator

from openroute.config.values import Duration, PasswordSection, Section
from openroute.definitions.errors import ConfigurationError

if TYPE_CHECKING:
    from openroute.inbound import AdminAuth, ApiKey, BasicCredentials, SourceSystemAuth


class _Login(PasswordSection):
    """A user name and its password: given inline, in ``password_file`` or in the variable ``password_env``."""

    username: str = Field(min_length=1)

    @model_validator(mode="after")
    def _require_password(self) -> Self:
        if self.password is None:
            raise ValueError("give password, password_file or password_env")
        return self


class BasicConfig(_Login):
    """HTTP basic credentials of a source system."""


class SourceSystemConfig(Section):
    """The credentials one source system may send with: HTTP basic and/or an API key (``X-API-Key``)."""

    secrets = ("api_key",)

    basic: BasicConfig | None = None
    api_key: str | None = None
    api_key_file: Path | None = None
    api_key_env: str | None = None

    @model_validator(mode="after")
    def _check(self) -> SourceSystemConfig:
        if self.basic is None and self.api_key is None:
            raise ValueError("give basic and/or api_key (or api_key_file / api_key_env)")
        return self


class AdminConfig(_Login):
    """A user of the admin API."""

    roles: list[str] = ["admin"]


class AuthConfig(Section):
    """Who may send messages (``source_systems``) and who may use the admin API (``admins``); empty: no checks."""

    source_systems: dict[str, SourceSystemConfig] = {}
    admins: list[AdminConfig] = []
    #: failed logins of one user from one client address within failed_login_window before it gets 429
    max_failed_logins: int = Field(10, ge=1)
    #: failed logins from one client address (any user) within failed_login_window before it gets 429
    max_failed_logins_per_address: int = Field(50, ge=1)
    failed_login_window: Duration = timedelta(minutes=1)

    def build(self) -> tuple[SourceSystemAuth | None, AdminAuth | None]:
        """``(SourceSystemAuth | None, AdminAuth | None)``, sharing one :class:`~openroute.inbound.LoginLimiter`."""
        from openroute.inbound import AdminAuth, AdminUser, ApiKey, BasicCredentials, LoginLimiter, SourceSystemAuth

        limiter = LoginLimiter(self.max_failed_logins, self.max_failed_logins_per_address,
                               self.failed_login_window.total_seconds())

        inbound = None
        if self.source_systems:
            systems: dict[str, list[BasicCredentials | ApiKey]] = {}
            for name, system in self.source_systems.items():
                items: list[BasicCredentials | ApiKey] = []
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

