"""Messaging configuration: ``openroute.messaging.(incoming|outgoing).<channel>.<attr>`` and
``openroute.messaging.connector.<name>.<attr>`` from a dict, properties/TOML files and environment variables.

The spec's ``mp.messaging.`` spelling is accepted as an alias. A channel name containing dots is quoted:
``openroute.messaging.incoming."orders.v1".connector``. Attribute names are case-insensitive and ``_`` equals
``-``. Precedence, lowest first: files (in the order given), environment variables, the dict.
Environment variables follow the MicroProfile Config mapping (upper case, every non-alphanumeric character
becomes ``_``): ``OPENROUTE_MESSAGING_INCOMING_ORDERS_V1_CONNECTOR``; they are looked up by channel or
connector name, so they apply to the channels the application declares or that other sources configure.
"""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from openroute.messaging.errors import DeploymentError

PREFIXES = ("openroute.messaging.", "mp.messaging.")
ENV_PREFIXES = ("OPENROUTE_MESSAGING_", "MP_MESSAGING_")
KINDS = ("incoming", "outgoing", "connector")
DEFAULT_BUFFER_SIZE_KEY = "emitter.default-buffer-size"


class ConfigError(DeploymentError):
    """A configuration source cannot be read or holds a malformed key or value."""


def normalize_attribute(name: str) -> str:
    """Canonical attribute name: lower case, ``-`` instead of ``_``."""
    return name.strip().lower().replace("_", "-")


def env_name(text: str) -> str:
    """MicroProfile Config environment mapping of a name: upper case, non-alphanumerics become ``_``."""
    return re.sub(r"[^A-Za-z0-9]", "_", text).upper()


def _split_key(rest: str) -> tuple[str, str, str] | None:
    """``incoming.<name>.<attr>`` -> (kind, name, attr); ``name`` may be double-quoted to hold dots."""
    kind, sep, tail = rest.partition(".")
    if not sep or kind not in KINDS:
        return None
    if tail.startswith('"'):
        end = tail.find('"', 1)
        if end < 0 or tail[end + 1: end + 2] != ".":
            return None
        name, attr = tail[1:end], tail[end + 2:]
    else:
        name, _, attr = tail.partition(".")
    if not name or not attr:
        return None
    return kind, name, normalize_attribute(attr)


def read_properties(path: Path) -> dict[str, str]:
    """Read a Java-style properties file (``key=value`` or ``key: value``; ``#`` and ``!`` start comments)."""
    values: dict[str, str] = {}
    for number, raw in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        line = raw.strip()
        if not line or line[0] in "#!":
            continue
        match = re.match(r"([^=:\s]+)\s*[=:]\s*(.*)$", line)
        if match is None:
            raise ConfigError(f"{path}:{number}: not a 'key=value' line: {raw!r}")
        values[match.group(1)] = match.group(2)
    return values


def flatten_tables(table: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested TOML tables as dotted keys (``{"a": {"b": 1}}`` -> ``{"a.b": 1}``; a key with a dot is quoted)."""
    flat: dict[str, Any] = {}
    for key, value in table.items():
        segment = f'"{key}"' if "." in key else key
        name = f"{prefix}.{segment}" if prefix else segment
        if isinstance(value, Mapping):
            flat.update(flatten_tables(value, name))
        else:
            flat[name] = value
    return flat


def read_toml(path: Path) -> dict[str, Any]:
    """Read a TOML file; nested tables become dotted keys (a key with dots becomes a quoted segment)."""
    try:
        with path.open("rb") as handle:
            return flatten_tables(tomllib.load(handle))
    except tomllib.TOMLDecodeError as error:
        raise ConfigError(f"{path}: invalid TOML: {error}") from error


def read_file(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read a ``.toml`` file as TOML and anything else as a properties file."""
    file = Path(path)
    if not file.is_file():
        raise ConfigError(f"configuration file not found: {file}")
    return read_toml(file) if file.suffix.lower() == ".toml" else read_properties(file)


@dataclass(frozen=True)
class ChannelConfig:
    """The resolved attributes of one connector-backed channel (channel values over connector values)."""

    direction: str
    channel: str
    connector: str | None
    attributes: Mapping[str, Any] = field(default_factory=dict)

    def get(self, attribute: str, default: Any = None) -> Any:
        """Raw value of ``attribute`` (``default`` when unset)."""
        return self.attributes.get(normalize_attribute(attribute), default)

    def _problem(self, attribute: str, value: Any, expected: str) -> ConfigError:
        return ConfigError(
            f"{self.direction} channel '{self.channel}': attribute '{attribute}' must be {expected}, got {value!r}")

    def get_str(self, attribute: str, default: str | None = None) -> str | None:
        """``attribute`` as a string."""
        value = self.get(attribute)
        return default if value is None else str(value)

    def get_int(self, attribute: str, default: int | None = None) -> int | None:
        """``attribute`` as an int (``ConfigError`` naming the channel when it is not one)."""
        value = self.get(attribute)
        if value is None:
            return default
        if isinstance(value, bool):
            raise self._problem(attribute, value, "an integer")
        try:
            return int(value)
        except (TypeError, ValueError):
            raise self._problem(attribute, value, "an integer") from None

    def get_float(self, attribute: str, default: float | None = None) -> float | None:
        """``attribute`` as a float."""
        value = self.get(attribute)
        if value is None:
            return default
        try:
            return float(value)
        except (TypeError, ValueError):
            raise self._problem(attribute, value, "a number") from None

    def get_bool(self, attribute: str, default: bool = False) -> bool:
        """``attribute`` as a bool (``true/false/yes/no/1/0``)."""
        value = self.get(attribute)
        if value is None:
            return default
        if isinstance(value, bool):
            return value
        text = str(value).strip().lower()
        if text in {"true", "yes", "1", "on"}:
            return True
        if text in {"false", "no", "0", "off"}:
            return False
        raise self._problem(attribute, value, "a boolean")

    def require(self, attribute: str) -> Any:
        """``attribute`` or ``DeploymentError`` naming the channel when it is missing."""
        value = self.get(attribute)
        if value is None or value == "":
            raise DeploymentError(
                f"{self.direction} channel '{self.channel}': mandatory attribute '{attribute}' is missing")
        return value


def select_channels(values: Mapping[str, Any], incoming: Iterable[str] = (),
                    outgoing: Iterable[str] = ()) -> dict[str, Any]:
    """The keys of ``values`` an application using only the ``incoming`` and ``outgoing`` channels needs: theirs,
    the connectors' and the global ones (another application's channels would fail its assembly validation)."""
    wanted = {("incoming", name) for name in incoming} | {("outgoing", name) for name in outgoing}
    kept: dict[str, Any] = {}
    for key, value in values.items():
        prefix = next((p for p in PREFIXES if isinstance(key, str) and key.startswith(p)), None)
        split = _split_key(key[len(prefix):]) if prefix is not None else None
        if split is None or split[0] == "connector" or (split[0], split[1]) in wanted:
            kept[key] = value
    return kept


class MessagingConfig:
    """All messaging configuration of one application (no global state: each app has its own)."""

    def __init__(
        self,
        values: Mapping[str, Any] | None = None,
        *,
        files: Iterable[str | os.PathLike[str]] = (),
        environ: Mapping[str, str] | None = None,
    ) -> None:
        merged: dict[str, Any] = {}
        for file in files:
            merged.update(read_file(file))
        self._environ = {k: v for k, v in (environ or {}).items() if k.startswith(ENV_PREFIXES)}
        self._file_entries, self._file_globals, self._file_connectors = self._parse(merged)
        self._dict_entries, self._dict_globals, self._dict_connectors = self._parse(dict(values or {}))

    @staticmethod
    def _parse(
        values: Mapping[str, Any],
    ) -> tuple[dict[tuple[str, str], dict[str, Any]], dict[str, Any], dict[str, Any]]:
        entries: dict[tuple[str, str], dict[str, Any]] = {}
        globals_: dict[str, Any] = {}
        # unquoted connector keys as written after "connector.": the name/attribute split needs the registered
        # connector names (a name may contain dots), so it is made when a channel's configuration is resolved
        connectors: dict[str, Any] = {}
        for key, value in values.items():
            if not isinstance(key, str):
                raise ConfigError(f"configuration keys must be strings, got {key!r}")
            prefix = next((p for p in PREFIXES if key.startswith(p)), None)
            if prefix is None:
                continue  # other layers' keys share the sources
            rest = key[len(prefix):]
            split = _split_key(rest)
            if split is None:
                if rest.split(".", 1)[0] in KINDS:
                    raise ConfigError(f"malformed messaging configuration key: {key!r}")
                globals_[normalize_attribute(rest)] = value
                continue
            kind, name, attr = split
            entries.setdefault((kind, name), {})[attr] = value
            if kind == "connector" and not rest[len("connector."):].startswith('"'):
                connectors[rest[len("connector."):]] = value
        return entries, globals_, connectors

    def _env_entries(self, kind: str, name: str) -> dict[str, Any]:
        found: dict[str, Any] = {}
        for env_prefix in ENV_PREFIXES:
            head = f"{env_prefix}{kind.upper()}_{env_name(name)}_"
            for key, value in self._environ.items():
                if key.startswith(head) and len(key) > len(head):
                    found[normalize_attribute(key[len(head):])] = value
        return found

    def section(self, kind: str, name: str) -> dict[str, Any]:
        """The attributes configured for ``(kind, name)``, sources merged by precedence."""
        return {**self._file_entries.get((kind, name), {}), **self._env_entries(kind, name),
                **self._dict_entries.get((kind, name), {})}

    def connector_section(self, name: str, known: Iterable[str] = ()) -> dict[str, Any]:
        """The attributes of connector ``name``; a key belongs to the longest of ``known`` names it starts with.

        ``connector.acme.kafka.bootstrap.servers`` is attribute ``bootstrap.servers`` of connector ``acme.kafka``
        when ``acme.kafka`` is registered (and attribute ``kafka.bootstrap.servers`` of ``acme`` otherwise).
        """
        names = sorted({*known, name}, key=len, reverse=True)

        def owned(raw: Mapping[str, Any], quoted: Mapping[str, Any]) -> dict[str, Any]:
            found = dict(quoted)
            for tail, value in raw.items():
                owner = next((n for n in names if tail.startswith(n + ".") and len(tail) > len(n) + 1), None)
                if owner is None:
                    continue
                attr = normalize_attribute(tail[len(owner) + 1:])
                if owner == name:
                    found[attr] = value
                elif tail.startswith(name + "."):
                    # the first-dot split filed it under the shorter name: it belongs to the longer one
                    found.pop(normalize_attribute(tail[len(name) + 1:]), None)
            return found

        longer = [env_name(n) for n in names if n != name and n.startswith(name + ".")]
        env = {attr: value for attr, value in self._env_entries("connector", name).items()
               if not any(env_name(attr).startswith(n[len(env_name(name)) + 1:] + "_") for n in longer)}
        return {**owned(self._file_connectors, self._file_entries.get(("connector", name), {})), **env,
                **owned(self._dict_connectors, self._dict_entries.get(("connector", name), {}))}

    def names(self, kind: str) -> set[str]:
        """Channel (or connector) names configured in the files or the dict for ``kind``."""
        return {n for (k, n) in (*self._file_entries, *self._dict_entries) if k == kind}

    def channel(self, direction: str, channel: str, connectors: Iterable[str] = ()) -> ChannelConfig:
        """The resolved configuration of a channel: its attributes over its connector's attributes.

        ``connectors``: the registered connector names, so that dotted names are matched longest first.
        """
        own = self.section(direction, channel)
        connector = own.get("connector")
        connector_name = str(connector) if connector not in (None, "") else None
        base = self.connector_section(connector_name, connectors) if connector_name else {}
        return ChannelConfig(direction, channel, connector_name, {**base, **own, "channel-name": channel})

    def get_global(self, name: str, default: Any = None) -> Any:
        """A key directly under the prefix, such as ``emitter.default-buffer-size``."""
        key = normalize_attribute(name)
        if key in self._dict_globals:
            return self._dict_globals[key]
        for env_prefix in ENV_PREFIXES:
            if f"{env_prefix}{env_name(key)}" in self._environ:
                return self._environ[f"{env_prefix}{env_name(key)}"]
        return self._file_globals.get(key, default)
