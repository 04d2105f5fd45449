"""``.from_channel()`` in the route DSL: what it builds and what it refuses."""

from __future__ import annotations

import pytest

from openroute import route
from openroute.definitions.errors import DeploymentError
from openroute.dsl import Application
from openroute.engine import Engine, EngineSettings
from openroute.inbound.channel import ChannelInbound


def noop(exchange: object) -> None:
    return None


def test_a_channel_only_route_has_no_http_binding_and_takes_the_bodies_it_declares() -> None:
    app = Application(route("crm", "a").from_channel("in").require(json="$.id").object_id(json="$.id").process(noop))
    assert app.bindings == []
    [channel] = app.channels
    assert (channel.channel, channel.key, channel.optional) == ("in", ("crm", "a"), False)
    # no SOAP request declared: JSON only (issue 42: no default element the route never declared)
    assert channel.json is not None and channel.json.required == ("$.id",) and channel.xml is None
    soap_only = Application(route("crm", "b").from_channel("b").soap("{urn:crm}b").process(noop)).channels[0]
    assert soap_only.json is None and soap_only.xml is not None and soap_only.xml.request_element == "{urn:crm}b"
    both = Application(route("crm", "c").from_channel("c").soap("{urn:crm}c").json().process(noop)).channels[0]
    assert both.json is not None and both.xml is not None


def test_beside_http_the_route_keeps_its_endpoints() -> None:
    app = Application(route("crm", "a").json().from_channel("in", optional=True).process(noop))
    assert [b.content_type for b in app.bindings or []] == ["json"]
    assert app.channels[0].optional


def test_a_channel_given_twice_or_feeding_two_routes_is_refused() -> None:
    with pytest.raises(DeploymentError, match="given twice"):
        route("crm", "a").from_channel("in").from_channel("in", optional=True)
    with pytest.raises(DeploymentError, match="channel in feeds both crm/a and crm/b"):
        Application(route("crm", "a").from_channel("in").process(noop),
                    route("crm", "b").from_channel("in").process(noop))


@pytest.mark.parametrize("name", ["", " in", 3])
def test_a_bad_channel_name_is_refused(name: object) -> None:
    with pytest.raises(DeploymentError, match="channel name"):
        route("crm", "a").from_channel(name)  # type: ignore[arg-type]


def test_an_optional_channel_without_a_connector_is_left_out(sqlite_url: str) -> None:
    app = Application(route("crm", "a").json().from_channel("in", optional=True).process(noop))
    engine = Engine(sqlite_url, app.routes, EngineSettings(repoll_interval=None))
    assert ChannelInbound(engine, app.channels, {}, environ={}).channels == []
