"""The client's address and scheme behind trusted proxies, from ``Forwarded`` (RFC 7239) or ``X-Forwarded-For``.

:class:`ProxyHeaders` is an ASGI middleware that ``openroute run`` puts in front of the node when ``[server]
forwarded_allow_ips`` names proxies (it replaces uvicorn's proxy-headers middleware, which reads only
``X-Forwarded-For``). A request whose socket peer is not one of them keeps the peer's address, whatever its headers
say. From a named proxy:

- ``Forwarded`` wins when the request has one (the standard form): its elements are the hops, the client nearest
  the proxies; ``X-Forwarded-For`` and ``X-Forwarded-Proto`` are then not read. A ``Forwarded`` that does not parse
  (a bad quoted string, an IPv6 address without brackets, a parameter twice in an element...) is ignored as a
  whole: the socket's address is kept, ``X-Forwarded-For`` is not read instead;
- else ``X-Forwarded-For`` (and ``X-Forwarded-Proto``), as uvicorn reads them.

Either way the client is the nearest hop, read right to left, that is not a named proxy (all of them named: the
first); its ``proto`` (``Forwarded``) gives the scheme. A hop written ``for=unknown`` or with an obfuscated
identifier (``for=_hidden``) is that client, its address the identifier as written::

    from openroute.wire.proxy_headers import ProxyHeaders

    app = ProxyHeaders(app, ["127.0.0.1", "10.0.4.0/24"])
    # from 127.0.0.1: Forwarded: for="[2001:db8::17]:4711";proto=https, for=10.0.4.7
    # -> scope["client"] == ("2001:db8::17", 4711), scope["scheme"] == "https" (10.0.4.7 is a named proxy)
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

__all__ = ["Hop", "ProxyHeaders", "TrustedProxies", "client_hop", "forwarded_hops", "x_forwarded_hops"]

#: the schemes a proxy may report (others are ignored)
SCHEMES = frozenset({"http", "https", "ws", "wss"})

# RFC 7230 token and quoted-string, the forms of a Forwarded parameter's name and value
_TOKEN = r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+"  # noqa: S105  a grammar's token, no password
_QUOTED = r'"(?:[\t !\x23-\x5b\x5d-\x7e\x80-\xff]|\\[\t \x21-\x7e\x80-\xff])*"'
_PAIR = re.compile(rf"[ \t]*(?P<name>{_TOKEN})=(?P<value>{_TOKEN}|{_QUOTED})[ \t]*")
# RFC 7239 section 6: an obfuscated node name or port
_OBFUSCATED = re.compile(r"_[A-Za-z0-9._-]+")


@dataclass(frozen=True)
class Hop:
    """One hop of a request on its way to the node: ``host`` an IP address (IPv6 without brackets), ``unknown`` or
    an obfuscated identifier (``_hidden``); ``port`` 0 when not given or obfuscated; ``proto`` the scheme the hop
    used, when the header says."""

    host: str
    port: int = 0
    proto: str | None = None


class TrustedProxies:
    """The proxies of ``[server] forwarded_allow_ips``: addresses, networks (``10.0.0.0/8``) or ``"*"`` (any peer).

    Raises ValueError for an entry that is none of these."""

    def __init__(self, entries: Iterable[str]) -> None:
        entries = list(entries)
        self.any = "*" in entries
        self.networks = tuple(ipaddress.ip_network(entry, strict=False) for entry in entries if entry != "*")

    def __contains__(self, host: object) -> bool:
        if self.any:
            return True
        if not isinstance(host, str):
            return False
        try:
            address = ipaddress.ip_address(host)
        except ValueError:  # unknown, an obfuscated identifier, a unix socket: never a named proxy
            return False
        return any(address in network for network in self.networks)


def forwarded_hops(values: Iterable[str]) -> list[Hop] | None:
    """The hops of the ``Forwarded`` header ``values`` (each line as sent, in order; the proxy nearest the node
    last); None when a value does not parse as RFC 7239 says. An element without ``for`` is an ``unknown`` hop."""
    hops = []
    for value in values:
        for element in _split_elements(value):
            if element is None:
                return None
            params: dict[str, str] = {}
            for pair in element.split(";") if element.strip() else []:
                if not pair.strip():
                    continue
                match = _PAIR.fullmatch(pair)
                if match is None or match["name"].lower() in params:
                    return None
                params[match["name"].lower()] = _unquoted(match["value"])
            node = _node(params.get("for", "unknown"))
            if node is None:
                return None
            proto = params.get("proto", "").lower() or None
            hops.append(Hop(node[0], node[1], proto))
    return hops or None


def x_forwarded_hops(values: Iterable[str]) -> list[Hop]:
    """The hops of the ``X-Forwarded-For`` header ``values``: addresses, ``host:port`` or ``[IPv6]:port``, comma
    separated (empty entries left out)."""
    hops = []
    for value in values:
        for entry in value.split(","):
            entry = entry.strip()
            if entry:
                hops.append(Hop(*_host_port(entry)))
    return hops


def client_hop(hops: list[Hop], trusted: TrustedProxies) -> Hop | None:
    """The client among ``hops``: the nearest one, read right to left, that is not a named proxy; the first when
    all are named; None for no hops."""
    for hop in reversed(hops):
        if hop.host not in trusted:
            return hop
    return hops[0] if hops else None


class ProxyHeaders:
    """ASGI middleware: the client's address (``scope["client"]``) and scheme from the headers of a named proxy
    (``Forwarded``, else ``X-Forwarded-For`` / ``X-Forwarded-Proto``; see the module's docstring), the socket's
    peer otherwise."""

    def __init__(self, app: Any, trusted: Iterable[str]) -> None:
        self.app = app
        self.trusted = TrustedProxies(trusted)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        """ASGI entry: for a connection from a named proxy, set ``scope["client"]`` and ``scope["scheme"]`` from its
        headers, then call the application."""
        if scope["type"] in ("http", "websocket"):
            peer = scope.get("client")
            if peer and peer[0] in self.trusted:
                self._rewrite(scope)
        await self.app(scope, receive, send)

    def _rewrite(self, scope: Any) -> None:
        forwarded: list[str] = []
        x_for: list[str] = []
        x_proto: str | None = None
        for name, value in scope["headers"]:
            if name == b"forwarded":
                forwarded.append(value.decode("latin-1"))
            elif name == b"x-forwarded-for":
                x_for.append(value.decode("latin-1"))
            elif name == b"x-forwarded-proto":
                x_proto = value.decode("latin-1").strip().lower()
        if forwarded:
            hops = forwarded_hops(forwarded)
            if hops is None:  # a broken header from a named proxy: believe the socket, guess nothing
                return
            hop = client_hop(hops, self.trusted)
            proto = hop.proto if hop is not None else None
        else:
            hop = client_hop(x_forwarded_hops(x_for), self.trusted)
            proto = x_proto
        if proto in SCHEMES:
            scope["scheme"] = proto.replace("http", "ws") if scope["type"] == "websocket" else proto
        if hop is not None:
            scope["client"] = (hop.host, hop.port)


def _split_elements(value: str) -> list[str | None]:
    """``value`` split at the commas outside quoted strings; [None] when a quoted string is not closed."""
    elements, start, quoted, escaped = [], 0, False, False
    for index, char in enumerate(value):
        if escaped:
            escaped = False
        elif quoted and char == "\\":
            escaped = True
        elif char == '"':
            quoted = not quoted
        elif char == "," and not quoted:
            elements.append(value[start:index])
            start = index + 1
    if quoted:
        return [None]
    elements.append(value[start:])
    return [element for element in elements if element.strip()] or [None]


def _unquoted(value: str) -> str:
    if value.startswith('"'):
        return re.sub(r"\\(.)", r"\1", value[1:-1])
    return value


def _node(value: str) -> tuple[str, int] | None:
    """A ``for`` value (RFC 7239 section 6) as (host, port); None when it is no node."""
    if value.startswith("["):
        end = value.find("]")
        if end == -1:
            return None
        host, rest = value[1:end], value[end + 1:]
        try:
            host = str(ipaddress.IPv6Address(host))
        except ValueError:
            return None
    else:
        host, colon, port_text = value.partition(":")
        rest = f"{colon}{port_text}"
        if host.lower() == "unknown":
            host = "unknown"
        elif _OBFUSCATED.fullmatch(host) is None:
            try:
                host = str(ipaddress.IPv4Address(host))
            except ValueError:
                return None
    if not rest:
        return host, 0
    port = rest[1:]
    if not rest.startswith(":") or not port:
        return None
    if _OBFUSCATED.fullmatch(port):
        return host, 0
    return (host, int(port)) if _is_port(port) else None


def _is_port(text: str) -> bool:
    return text.isascii() and text.isdigit() and len(text) <= 5 and int(text) <= 65535


def _host_port(entry: str) -> tuple[str, int]:
    """An ``X-Forwarded-For`` entry as (host, port), as uvicorn reads it: a malformed one is the host as written."""
    if entry.startswith("["):
        end = entry.find("]")
        rest = entry[end + 1:] if end != -1 else ""
        if end == -1 or (rest and not rest.startswith(":")):
            return entry, 0
        host = entry[1:end]
        return (host, int(rest[1:])) if _is_port(rest[1:]) else (host, 0)
    if entry.count(":") == 1:
        host, port = entry.split(":")
        return (host, int(port)) if _is_port(port) else (entry, 0)
    return entry, 0
