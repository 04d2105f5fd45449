"""Throttling per source system and operation: rule precedence, 429 / SOAP fault before anything is stored,
refused requests not counted, counters shared by all nodes (two real ``openroute run`` processes on PostgreSQL)."""

from __future__ import annotations

import asyncio
import re
import textwrap
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from lxml import etree
from openroute.persistence import MessageStore, ThrottleCounters

from openroute.config import load_config
from openroute.definitions.errors import ConfigurationError, ThrottledError
from openroute.engine import Engine
from openroute.inbound.throttling import LEASE_SHARE, ThrottleRule, Throttling, parse_rules
from openroute.server import create_app
from tests.inbound.conftest import BINDINGS, SOAP11, SOAP11_HEADERS, create_order, envelope, stored
from tests.inbound.test_cli_run import USER_APP, Server, _environment

HEADERS = {"Content-Type": "application/json"}


def _order(number: int) -> dict[str, object]:
    return {"orderId": f"O-{number}", "customer": {"id": "C-1"}}


class Clock:
    """Seconds since the epoch, moved by the test."""

    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_the_most_specific_rule_wins() -> None:
    rules = parse_rules({"CRM": {"create": "1/60", "*": "2/60"}, "*.create": "3/1m", "*.*": "4/500ms"})
    throttling = Throttling(rules, counters=None, clock=lambda: 0.0)  # type: ignore[arg-type]
    assert throttling.rule_for("CRM", "create") == ThrottleRule("CRM", "create", 1, 60.0)
    assert throttling.rule_for("CRM", "cancel") == ThrottleRule("CRM", "*", 2, 60.0)
    assert throttling.rule_for("ERP", "create") == ThrottleRule("*", "create", 3, 60.0)
    assert throttling.rule_for("ERP", "cancel") == ThrottleRule("*", "*", 4, 0.5)
    assert Throttling(parse_rules({"CRM.create": "1/1"}), None).rule_for("ERP", "create") is None  # type: ignore[arg-type]


@pytest.mark.parametrize(("rules", "problem"), [
    ({"CRM.create": "ten/60"}, "throttling.CRM.create: expected 'limit/interval'"),
    ({"CRM.create": "0/60"}, "the limit must be an integer >= 1"),
    ({"CRM.create": "5/0"}, "the interval must be at least 1 ms"),
    ({"CRM": "5/60"}, "throttling.CRM: give 'system.operation"),
    ({"CRM.create": "1/60", "CRM": {"create": "2/60"}}, "throttling.CRM.create: given twice"),
])
def test_bad_rules_are_configuration_errors(rules: dict[str, object], problem: str) -> None:
    with pytest.raises(ConfigurationError, match=re.escape(problem)):
        parse_rules(rules)


def test_openroute_toml_throttling_table(tmp_path: Path) -> None:
    path = tmp_path / "openroute.toml"
    path.write_text('throttling.CRM.create = "10/1m"\n[throttling."*"]\n"*" = "60/60"\n', encoding="utf-8")
    config = load_config(path)
    assert config.throttling_rules() == [ThrottleRule("CRM", "create", 10, 60.0), ThrottleRule("*", "*", 60, 60.0)]
    path.write_text('throttling.CRM.create = "10 per minute"\n', encoding="utf-8")
    with pytest.raises(ConfigurationError, match=re.escape("throttling.CRM.create: expected 'limit/interval'")):
        load_config(path)
    assert load_config().throttling_rules() == []  # default: off


@pytest.fixture
async def throttled(engine: Engine) -> AsyncIterator[tuple[httpx.AsyncClient, Clock, ThrottleCounters]]:
    clock = Clock(1_800_000_000.0)  # the start of a 60 s window
    counters = ThrottleCounters(engine.store)
    throttling = Throttling(parse_rules({"CRM.create": "2/60", "*.*": "1/60"}), counters, clock)
    app = create_app(engine, BINDINGS, manage_engine=False, throttling=throttling)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://node") as http:
        yield http, clock, counters


async def test_over_the_limit_gets_429_with_retry_after_and_nothing_is_stored(
    throttled: tuple[httpx.AsyncClient, Clock, ThrottleCounters], store: MessageStore
) -> None:
    http, clock, counters = throttled
    window = int(clock.now * 1000)
    for number in (1, 2):
        answer = await http.post("/api/orders/create", json=_order(number),
                                 headers={**HEADERS, "X-Source-System": "CRM"})
        assert answer.status_code == 202, answer.text
    clock.now += 15
    for number in (3, 4):
        refused = await http.post("/api/orders/create", json=_order(number),
                                  headers={**HEADERS, "X-Source-System": "CRM", "X-Correlation-Id": f"c-{number}"})
        assert refused.status_code == 429
        assert refused.headers["Retry-After"] == "45"
        assert refused.headers["X-Correlation-Id"] == f"c-{number}"
        assert refused.json()["error"] == "THROTTLED"
        assert "nothing was stored" in refused.json()["reason"]
    assert [row["payload"] for row in stored(store)] == [f'{{"orderId":"O-{n}","customer":{{"id":"C-1"}}}}'
                                                         for n in (1, 2)]
    assert counters.count("CRM", "create", window) == 2  # the refused ones were not counted

    # the wildcard rule counts per real system: ERP has its own 1 per minute
    assert (await http.post("/api/orders/create", json=_order(5),
                            headers={**HEADERS, "X-Source-System": "ERP"})).status_code == 202
    assert (await http.post("/api/orders/create", json=_order(6),
                            headers={**HEADERS, "X-Source-System": "ERP"})).status_code == 429

    clock.now += 45  # the next window
    assert (await http.post("/api/orders/create", json=_order(7),
                            headers={**HEADERS, "X-Source-System": "CRM"})).status_code == 202
    assert len(stored(store)) == 4
    assert counters.count("CRM", "create", window) == 0  # the old window's row is gone


async def test_soap_over_the_limit_gets_a_throttling_fault(
    throttled: tuple[httpx.AsyncClient, Clock, ThrottleCounters], store: MessageStore
) -> None:
    http, _clock, _counters = throttled
    answers = [
        await http.post("/soap/orders", content=envelope(create_order(f"O-{n}"), trace={"sourceSystem": "CRM"}),
                        headers=SOAP11_HEADERS)
        for n in range(3)
    ]
    assert [a.status_code for a in answers] == [200, 200, 429]
    assert answers[2].headers["Retry-After"] == "60"
    root = etree.fromstring(answers[2].content)
    assert root.findtext(f".//{{{SOAP11}}}Fault/faultcode") == "env:Client"
    assert root.findtext(".//{urn:openroute:inbound:v1}code") == "THROTTLED"
    assert len(stored(store)) == 2


async def test_a_throttled_re_send_of_an_accepted_message_is_answered_duplicate(
    throttled: tuple[httpx.AsyncClient, Clock, ThrottleCounters], store: MessageStore
) -> None:
    """Over the limit, a re-send of a message already stored (same source system and correlation id) gets the
    duplicate's answer, JSON and SOAP alike; a new message is still refused with 429, and nothing is stored twice."""
    http = throttled[0]
    crm = {**HEADERS, "X-Source-System": "CRM"}
    for number in (1, 2):
        answer = await http.post("/api/orders/create", json=_order(number),
                                 headers={**crm, "X-Correlation-Id": f"c-{number}"})
        assert answer.status_code == 202, answer.text
    resent = await http.post("/api/orders/create", json=_order(1), headers={**crm, "X-Correlation-Id": "c-1"})
    assert resent.status_code == 200, resent.text
    assert resent.json()["status"] == "DUPLICATE" and resent.json()["correlationId"] == "c-1"
    new = await http.post("/api/orders/create", json=_order(3), headers={**crm, "X-Correlation-Id": "c-3"})
    assert new.status_code == 429 and new.json()["error"] == "THROTTLED"
    soap = [await http.post("/soap/orders", headers=SOAP11_HEADERS, content=envelope(
        create_order(f"O-{n}"), trace={"sourceSystem": "ERP", "correlationId": "s-1"})) for n in range(2)]
    assert [a.status_code for a in soap] == [200, 200]  # ERP's 1 a minute: the second is the re-send
    assert b"DUPLICATE" in soap[1].content and b"ACCEPTED" in soap[0].content
    assert sorted(row["correlation_id"] for row in stored(store)) == ["c-1", "c-2", "s-1"]


async def _admitted(throttling: Throttling, requests: int) -> int:
    """How many of ``requests`` concurrent requests of CRM / create ``throttling`` admits, 10 ms after the previous
    ones (on its clock, when it is a :class:`Clock`: a rate of 100 per second per request of a round)."""
    if isinstance(throttling.clock, Clock):
        throttling.clock.now += 0.01
    answers = await asyncio.gather(*(throttling.check("CRM", "create") for _ in range(requests)),
                                   return_exceptions=True)
    assert all(answer is None or isinstance(answer, ThrottledError) for answer in answers), answers
    return sum(answer is None for answer in answers)


async def test_a_busy_node_takes_permits_ahead_and_spends_them_without_the_store(store: MessageStore) -> None:
    counters = ThrottleCounters(store)
    throttling = Throttling(parse_rules({"*.*": "800/60"}), counters, Clock(1_800_000_000.0))
    admitted = 0
    for _ in range(10):
        admitted += await _admitted(throttling, 20)
    assert admitted == 200
    assert throttling.reservations < 10  # not one counting transaction per request, nor per batch of 20
    held = counters.count("CRM", "create", 1_800_000_000_000) - admitted
    assert 0 <= held <= 800 // LEASE_SHARE  # taken ahead: at most the limit's share


async def test_a_busy_node_takes_its_next_permits_in_the_background(store: MessageStore) -> None:
    """When its permits fall to half of what it took ahead, a node takes the next ones while it spends the rest:
    its requests do not wait for the store, and it never holds more than the limit's share."""
    counters = ThrottleCounters(store)
    throttling = Throttling(parse_rules({"*.*": "800/60"}), counters, Clock(1_800_000_000.0))
    # counted (no rate yet), then counted with the limit's share taken ahead (2,000 requests/s x LEASE_SECONDS)
    assert await _admitted(throttling, 20) + await _admitted(throttling, 20) == 40
    assert throttling.waits == 40
    assert counters.count("CRM", "create", 1_800_000_000_000) - 40 == 800 // LEASE_SHARE
    reservations = throttling.reservations
    for _ in range(5):  # each round spends half of the permits and takes them again while they are spent
        assert await _admitted(throttling, 20) == 20
        await throttling.counted()
    assert throttling.waits == 40  # no request of those rounds waited for the store
    assert throttling.reservations == reservations + 5
    assert counters.count("CRM", "create", 1_800_000_000_000) - 140 == 800 // LEASE_SHARE  # never more held


async def test_a_full_window_is_refused_without_the_store(store: MessageStore) -> None:
    clock = Clock(1_800_000_000.0)
    throttling = Throttling(parse_rules({"CRM.create": "5/60"}), ThrottleCounters(store), clock)
    assert await _admitted(throttling, 7) == 5
    reservations = throttling.reservations
    assert await _admitted(throttling, 10) == 0
    assert throttling.reservations == reservations  # the store said the window is full: its count only grows
    clock.now += 60
    assert await _admitted(throttling, 1) == 1  # the next window is counted again


async def test_two_busy_nodes_taking_permits_ahead_admit_the_limit_exactly(store: MessageStore) -> None:
    """Permits taken ahead come from the shared counter: two nodes admit the limit between them, never more, and
    all of it while both keep receiving requests."""
    clock = Clock(1_800_000_000.0)
    nodes = [Throttling(parse_rules({"CRM.create": "80/60"}), ThrottleCounters(store), clock) for _ in range(2)]
    admitted = 0
    while True:
        this_round = await asyncio.gather(*(_admitted(node, 10) for node in nodes))
        admitted += sum(this_round)
        if this_round == [0, 0]:
            break
    assert admitted == 80
    assert ThrottleCounters(store).count("CRM", "create", 1_800_000_000_000) == 80
    assert sum(node.reservations for node in nodes) < 80


@pytest.mark.parametrize("database_url", ["postgres"], indirect=True)
def test_two_nodes_share_the_limit(database_url: str, tmp_path: Path) -> None:
    """Two ``openroute run`` processes on one PostgreSQL database admit the limit once between them."""
    (tmp_path / "shopapp.py").write_text(USER_APP, encoding="utf-8")
    (tmp_path / "openroute.toml").write_text(textwrap.dedent(f'''
        database_url = "{database_url}"
        routes = "shopapp:app"
        migrate = true
        throttling.SHOP.order = "5/1h"
    '''), encoding="utf-8")
    MessageStore(database_url).create_schema()
    servers = [Server(["--config", "openroute.toml"], tmp_path, _environment()) for _ in range(2)]
    try:
        for server in servers:
            server.wait_for("serving")
        statuses = []
        for number in range(10):
            server = servers[number % 2]
            answer = httpx.post(f"{server.base}/api/shop/order", json={"n": number},
                                headers={"X-Source-System": "SHOP"}, timeout=30)
            statuses.append(answer.status_code)
        assert sorted(statuses) == [202] * 5 + [429] * 5, statuses
        assert statuses[:5] == [202] * 5  # both nodes took part before the limit was reached
    finally:
        for server in servers:
            server.stop()
    check = MessageStore(database_url)
    try:
        assert len(stored(check)) == 5
    finally:
        check.dispose()
