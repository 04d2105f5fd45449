"""The client's address behind trusted proxies (openroute/wire/proxy_headers.py): RFC 7239 ``Forwarded`` and
``X-Forwarded-For``, which one wins, malformed values, peers that are not named."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from openroute.wire.proxy_headers import Hop, ProxyHeaders, TrustedProxies, client_hop, forwarded_hops, x_forwarded_hops

PROXIES = ["127.0.0.1", "10.0.4.0/24"]


@pytest.mark.parametrize(("value", "hops"), [
    ("for=192.0.2.43", [Hop("192.0.2.43")]),
    ('For="[2001:db8:cafe::17]:4711"', [Hop("2001:db8:cafe::17", 4711)]),
    ('for="[2001:DB8::17]"', [Hop("2001:db8::17")]),
    ('for="192.0.2.43:8080";proto=HTTPS;by=10.0.4.1', [Hop("192.0.2.43", 8080, "https")]),
    ("for=192.0.2.43, for=198.51.100.17", [Hop("192.0.2.43"), Hop("198.51.100.17")]),
    ("for=_hidden.1, for=UNKNOWN", [Hop("_hidden.1"), Hop("unknown")]),
    ('for="\\_hidden"', [Hop("_hidden")]),  # a quoted-pair stands for its character
    ('for="_gazonk:_p4"', [Hop("_gazonk")]),
    ("proto=https;by=10.0.4.1", [Hop("unknown", 0, "https")]),  # no for: a hop nobody named
    ("for=192.0.2.43;, ;for=198.51.100.17", [Hop("192.0.2.43"), Hop("198.51.100.17")]),  # empty pairs, elements
])
def test_forwarded_elements_are_hops_in_order(value: str, hops: list[Hop] | None) -> None:
    assert forwarded_hops([value]) == hops


@pytest.mark.parametrize("value", [
    "for=192.0.2.43:8080",              # a colon is no token: the address with a port must be quoted
    "for=[2001:db8::17]",               # brackets are no token either
    'for="2001:db8::17"',               # IPv6 without brackets
    'for="[2001:db8::17"',              # bracket not closed
    'for="[2001:db8::17]x"',            # text after the bracket
    'for="[192.0.2.43]"',               # IPv4 in brackets
    'for="192.0.2.43:99999"',           # a port out of range
    'for="192.0.2.43:"',                # a colon without a port
    "for=192.0.2.999",                  # no address
    "for=example.com",                  # a host name (neither address, unknown nor _obfuscated)
    'for="192.0.2.43',                  # quoted string not closed
    "for=192.0.2.43;for=198.51.100.17",  # a parameter twice in one element
    "for 192.0.2.43",                   # no "="
    "for=",                             # no value
    ",",                                # no element
    "for=192.0.2.43 198.51.100.17",     # two values
    'for="\\"_q\\""',                     # an escaped quote in the name
])
def test_a_malformed_forwarded_parses_to_none(value: str) -> None:
    assert forwarded_hops([value]) is None


def test_several_forwarded_lines_are_one_list_in_order() -> None:
    assert forwarded_hops(["for=192.0.2.43", 'for="[::1]"']) == [Hop("192.0.2.43"), Hop("::1")]
    assert forwarded_hops(["for=192.0.2.43", "for=nope"]) is None  # one bad line spoils the header


def test_x_forwarded_for_entries_with_and_without_ports() -> None:
    assert x_forwarded_hops(["192.0.2.43, 198.51.100.17:81", "[2001:db8::1]:82, , 10.0.4.2"]) == [
        Hop("192.0.2.43"), Hop("198.51.100.17", 81), Hop("2001:db8::1", 82), Hop("10.0.4.2")]


def test_the_client_is_the_nearest_hop_that_is_not_a_named_proxy() -> None:
    trusted = TrustedProxies(PROXIES)
    hops = [Hop("203.0.113.9"), Hop("192.0.2.43"), Hop("10.0.4.7"), Hop("127.0.0.1")]
    assert client_hop(hops, trusted) == Hop("192.0.2.43")  # 203.0.113.9 is what the client claims: not believed
    assert client_hop([Hop("10.0.4.7"), Hop("10.0.4.8")], trusted) == Hop("10.0.4.7")  # all named: the first
    assert client_hop([Hop("_hidden"), Hop("10.0.4.7")], trusted) == Hop("_hidden")
    assert client_hop([], trusted) is None
    assert client_hop([Hop("203.0.113.9"), Hop("192.0.2.43")], TrustedProxies(["*"])) == Hop("203.0.113.9")


def test_trusted_proxies_are_addresses_and_networks_only() -> None:
    trusted = TrustedProxies(PROXIES)
    assert "127.0.0.1" in trusted and "10.0.4.200" in trusted
    assert "10.0.5.1" not in trusted and "unknown" not in trusted and "_hidden" not in trusted and None not in trusted
    with pytest.raises(ValueError, match=r"proxy\.example"):
        TrustedProxies(["proxy.example"])


def _seen(headers: list[tuple[str, str]], peer: str = "127.0.0.1", kind: str = "http") -> tuple[Any, str]:
    """The client and scheme the app behind :class:`ProxyHeaders` sees for a request from ``peer``."""
    seen: dict[str, Any] = {}

    async def app(scope: Any, receive: Any, send: Any) -> None:
        seen.update(client=scope["client"], scheme=scope["scheme"])

    scope = {"type": kind, "client": (peer, 50000), "scheme": "http" if kind == "http" else "ws",
             "headers": [(name.lower().encode(), value.encode("latin-1")) for name, value in headers]}
    asyncio.run(ProxyHeaders(app, PROXIES)(scope, None, None))
    return seen["client"], seen["scheme"]


def test_forwarded_from_a_named_proxy_gives_the_client_and_its_scheme() -> None:
    assert _seen([("Forwarded", 'for="[2001:db8::17]:4711";proto=https, for=10.0.4.7')]) == (
        ("2001:db8::17", 4711), "https")
    assert _seen([("Forwarded", "for=192.0.2.43;proto=wss")], kind="websocket") == (("192.0.2.43", 0), "wss")


def test_forwarded_wins_over_x_forwarded_for_when_both_are_sent() -> None:
    both = [("X-Forwarded-For", "198.51.100.1"), ("X-Forwarded-Proto", "https"), ("Forwarded", "for=192.0.2.43")]
    assert _seen(both) == (("192.0.2.43", 0), "http")  # the X- headers are not read, the proto neither


def test_x_forwarded_for_is_read_when_there_is_no_forwarded() -> None:
    headers = [("X-Forwarded-For", "203.0.113.9, 192.0.2.43"), ("X-Forwarded-Proto", "https")]
    assert _seen(headers) == (("192.0.2.43", 0), "https")


@pytest.mark.parametrize("value", ["for=192.0.2.43:8080", 'for="[::1', "for=a;for=b", "garbage"])
def test_a_malformed_forwarded_from_a_named_proxy_keeps_the_socket_address(value: str) -> None:
    headers = [("Forwarded", value), ("X-Forwarded-For", "198.51.100.1")]  # not read instead
    assert _seen(headers) == (("127.0.0.1", 50000), "http")


def test_unknown_and_obfuscated_clients_are_named_as_the_proxy_wrote_them() -> None:
    assert _seen([("Forwarded", "for=unknown;proto=https")]) == (("unknown", 0), "https")
    assert _seen([("Forwarded", 'for="_gazonk:_p1", for=10.0.4.2')]) == (("_gazonk", 0), "http")


def test_headers_from_a_peer_that_is_not_named_change_nothing() -> None:
    headers = [("Forwarded", "for=203.0.113.66;proto=https"), ("X-Forwarded-For", "203.0.113.66"),
               ("X-Forwarded-Proto", "https")]
    assert _seen(headers, peer="192.0.2.1") == (("192.0.2.1", 50000), "http")
