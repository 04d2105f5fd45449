"""Authentication of source systems (inbound) and operators (admin API) from configuration.

Credentials are compared in constant time; secrets are kept out of ``repr`` and never logged. A request is
authenticated from its headers alone, before its body is read.
"""

from __future__ import annotations

import base64
import binascii
import hmac
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from openroute.auth.errors import AuthenticationError, ForbiddenError
from openroute.auth.login_limit import LoginLimiter
from openroute.definitions.errors import ConfigurationError

API_KEY_HEADER = "x-api-key"


@dataclass(frozen=True)
class BasicCredentials:
    """HTTP Basic user name and password of one source system."""

    username: str
    password: str = field(repr=False)


@dataclass(frozen=True)
class ApiKey:
    """An API key sent in the ``X-API-Key`` header (or ``Authorization: ApiKey <key>``)."""

    key: str = field(repr=False)


Credentials = BasicCredentials | ApiKey


def _basic(authorization: str | None) -> tuple[str, str] | None:
    if not authorization:
        return None
    scheme, _, value = authorization.partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        decoded = base64.b64decode(value.strip(), validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        raise AuthenticationError("malformed Basic credentials") from None
    user, sep, password = decoded.partition(":")
    if not sep:
        raise AuthenticationError("malformed Basic credentials")
    return user, password


def _api_key(headers: Mapping[str, str]) -> str | None:
    key = headers.get(API_KEY_HEADER)
    if key:
        return key
    authorization = headers.get("authorization") or ""
    scheme, _, value = authorization.partition(" ")
    if scheme.lower() == "apikey" and value.strip():
        return value.strip()
    return None


def _equal(a: str, b: str) -> bool:
    return hmac.compare_digest(a.encode("utf-8"), b.encode("utf-8"))


_Account = TypeVar("_Account")


def _password_login(
    limiter: LoginLimiter, name: str, password: str, account: tuple[str, _Account] | None, client: str | None
) -> _Account:
    """What ``account`` (its password, then what it proves; None: no user ``name``) stands for when ``password`` is
    its password, counted by the failed-login ``limiter``. Raises TooManyFailedLoginsError while ``name`` at the
    address ``client``, or ``client`` itself, failed too often (the password is then not compared), and
    AuthenticationError for an unknown user or a wrong password."""
    limiter.check(name, client)
    if account is None:
        _equal(password, password)  # same work as a known user
    elif _equal(password, account[0]):
        limiter.succeeded(name, client)
        return account[1]
    limiter.failed(name, client)
    raise AuthenticationError("invalid credentials")


class SourceSystemAuth:
    """Which credentials identify which source system.

    ``systems`` maps a source system name to its :class:`BasicCredentials` or :class:`ApiKey` (or a list of
    them). :meth:`authenticate` returns the source system a request's headers prove, or raises
    :class:`AuthenticationError`.
    """

    def __init__(
        self, systems: Mapping[str, Credentials | Iterable[Credentials]], *, limiter: LoginLimiter | None = None
    ) -> None:
        #: failed logins per (user or key, client address) and per address (see :class:`LoginLimiter`)
        self.limiter = limiter if limiter is not None else LoginLimiter()
        self._basic: dict[str, tuple[str, str]] = {}
        self._keys: list[tuple[str, str]] = []
        if not isinstance(systems, Mapping) or not systems:
            raise ConfigurationError("source system authentication needs at least one system")
        for system, credentials in systems.items():
            if not isinstance(system, str) or not system.strip() or len(system) > 100:
                raise ConfigurationError(f"invalid source system name {system!r}")
            items = [credentials] if isinstance(credentials, BasicCredentials | ApiKey) else list(credentials)
            if not items:
                raise ConfigurationError(f"source system {system!r} has no credentials")
            for item in items:
                self._add(system, item)

    def _add(self, system: str, item: Any) -> None:
        if isinstance(item, BasicCredentials):
            if not item.username or not item.password or ":" in item.username:
                raise ConfigurationError(f"source system {system!r}: Basic needs a user (no ':') and a password")
            if item.username in self._basic:
                raise ConfigurationError(f"user {item.username!r} is configured for two source systems")
            self._basic[item.username] = (item.password, system)
        elif isinstance(item, ApiKey):
            if not item.key or len(item.key) < 16:
                raise ConfigurationError(f"source system {system!r}: an API key needs at least 16 characters")
            if any(_equal(item.key, key) for key, _ in self._keys):
                raise ConfigurationError(f"source system {system!r}: the same API key is configured twice")
            self._keys.append((item.key, system))
        else:
            raise ConfigurationError(f"source system {system!r}: expected BasicCredentials or ApiKey, got {item!r}")

    @property
    def systems(self) -> frozenset[str]:
        """The configured source systems."""
        return frozenset(s for _, s in self._basic.values()) | frozenset(s for _, s in self._keys)

    def authenticate(self, headers: Mapping[str, str], client: str | None = None, *, claimed: str | None = None) -> str:
        """The source system proven by ``headers`` (lower-case names) sent from the address ``client``.

        Raises AuthenticationError for missing or wrong credentials, TooManyFailedLoginsError while the user (an API
        key counts as the user ``"api key"``) at ``client``, or ``client`` itself, failed too often, and
        ForbiddenError when the request ``claimed`` to speak for another source system (:func:`require_system`)."""
        system = self._proven(headers, client)
        require_system(system, claimed)
        return system

    def _proven(self, headers: Mapping[str, str], client: str | None) -> str:
        key = _api_key(headers)
        if key is not None:
            self.limiter.check("api key", client)
            found = None
            for configured, system in self._keys:  # compare with all keys so timing tells nothing
                if _equal(key, configured):
                    found = system
            if found is None:
                self.limiter.failed("api key", client)
                raise AuthenticationError("invalid credentials")
            return found
        basic = _basic(headers.get("authorization"))
        if basic is None:
            raise AuthenticationError("credentials required (HTTP Basic or API key)")
        user, password = basic
        return _password_login(self.limiter, user, password, self._basic.get(user), client)


#: the role that may read the admin API and the console (search, detail, counts, nodes); the authenticator's role
#: (``admin``) may read and act
WEB_ROLE = "web"


@dataclass(frozen=True)
class AdminUser:
    """An operator of the admin API (HTTP Basic) and their roles."""

    username: str
    password: str = field(repr=False)
    roles: frozenset[str] = frozenset({"admin"})


class AdminAuth:
    """HTTP Basic authentication of operators; every admin endpoint needs the ``role`` (default ``admin``)."""

    def __init__(self, users: Iterable[AdminUser], role: str = "admin", *, limiter: LoginLimiter | None = None) -> None:
        #: failed logins per (user, client address) and per address (see :class:`LoginLimiter`)
        self.limiter = limiter if limiter is not None else LoginLimiter()
        self._users: dict[str, AdminUser] = {}
        for user in users:
            if not isinstance(user, AdminUser):
                raise ConfigurationError(f"expected an AdminUser, got {user!r}")
            if not user.username or ":" in user.username or not user.password:
                raise ConfigurationError("an admin user needs a name (no ':') and a password")
            if user.username in self._users:
                raise ConfigurationError(f"admin user {user.username!r} is configured twice")
            self._users[user.username] = AdminUser(user.username, user.password, frozenset(user.roles))
        self.role = role

    def authorize(
        self, headers: Mapping[str, str], roles: Iterable[str] | None = None, client: str | None = None
    ) -> str:
        """The user name; AuthenticationError without valid credentials, ForbiddenError without one of ``roles``
        (default: the authenticator's ``role``), TooManyFailedLoginsError while the user at the address ``client``,
        or ``client`` itself, failed too often (the password is then not compared)."""
        basic = _basic(headers.get("authorization"))
        if basic is None:
            raise AuthenticationError("admin credentials required (HTTP Basic)")
        name, password = basic
        known = self._users.get(name)
        user = _password_login(self.limiter, name, password, None if known is None else (known.password, known), client)
        wanted = [self.role] if roles is None else list(roles)
        if not user.roles & set(wanted):
            needed = " or ".join(repr(role) for role in wanted)
            raise ForbiddenError(f"user {name!r} does not have the {needed} role")
        return name

    def operator(self, headers: Mapping[str, str], client: str | None, *, act: bool = False) -> str:
        """The name of an operator of the admin API or the console who may read (the :data:`WEB_ROLE` or this
        authenticator's role) or, with ``act``, act (this authenticator's role only); errors as :meth:`authorize`."""
        return self.authorize(headers, [self.role] if act else [WEB_ROLE, self.role], client)


# C901 over 12: reads each section of the legacy auth file in turn (one error per bad entry)
def load_auth_config(config: Mapping[str, Any]) -> tuple[SourceSystemAuth | None, AdminAuth | None]:  # noqa: C901
    """Build both authenticators from a JSON-like mapping (the ``openroute run --auth-config`` file).

    ``{"sourceSystems": {"CRM": {"basic": {"username": "crm", "password": "..."}}, "ERP": {"apiKey": "..."}},
    "admins": [{"username": "ops", "password": "...", "roles": ["admin"]}]}``
    """
    if not isinstance(config, Mapping):
        raise ConfigurationError("the authentication configuration must be a JSON object")
    unknown = set(config) - {"sourceSystems", "admins"}
    if unknown:
        raise ConfigurationError(f"unknown authentication settings: {sorted(unknown)}")
    inbound: SourceSystemAuth | None = None
    systems = config.get("sourceSystems")
    if systems:
        if not isinstance(systems, Mapping):
            raise ConfigurationError("sourceSystems must map a system name to its credentials")
        parsed: dict[str, list[Credentials]] = {}
        for name, entry in systems.items():
            if not isinstance(entry, Mapping) or not ({"basic", "apiKey"} & set(entry)):
                raise ConfigurationError(f"source system {name!r}: give 'basic' and/or 'apiKey'")
            items: list[Credentials] = []
            if "basic" in entry:
                basic = entry["basic"]
                if not isinstance(basic, Mapping) or not {"username", "password"} <= set(basic):
                    raise ConfigurationError(f"source system {name!r}: basic needs username and password")
                items.append(BasicCredentials(str(basic["username"]), str(basic["password"])))
            if "apiKey" in entry:
                items.append(ApiKey(str(entry["apiKey"])))
            parsed[name] = items
        inbound = SourceSystemAuth(parsed)
    admin: AdminAuth | None = None
    admins = config.get("admins")
    if admins:
        if not isinstance(admins, list) or not all(isinstance(a, Mapping) for a in admins):
            raise ConfigurationError("admins must be a list of {username, password, roles}")
        try:
            admin = AdminAuth(
                AdminUser(str(a["username"]), str(a["password"]), frozenset(a.get("roles", ["admin"])))
                for a in admins
            )
        except KeyError as missing:
            raise ConfigurationError(f"an admin entry lacks {missing}") from None
    return inbound, admin


def require_system(authenticated: str, claimed: str | None) -> None:
    """A request may only speak for the source system it authenticated as."""
    if claimed is not None and claimed != authenticated:
        raise ForbiddenError(f"authenticated as {authenticated!r}, cannot send as {claimed!r}")
