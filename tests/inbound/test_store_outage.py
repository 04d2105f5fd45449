"""A real database outage (a TCP proxy in front of PostgreSQL, cut and restored): inbound answers 503 / a SOAP Server
fault, nothing is stored, the log has one WARNING and one INFO, and the node works again without a restart."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterator
from datetime import timedelta

import httpx
import pytest
from lxml import etree
from openroute.persistence import MessageState, MessageStore

from openroute.engine import Engine, EngineSettings
from openroute.server import create_app
from tests.inbound.conftest import BINDINGS, SOAP11, SOAP11_HEADERS, create_order, envelope, routes, stored
from tests.tcp_proxy import TcpProxy, proxy_to

JSON_HEADERS = {"Content-Type": "application/json", "X-Source-System": "CRM"}


@pytest.fixture
def proxy(postgres_url: str) -> Iterator[TcpProxy]:
    MessageStore(postgres_url).create_schema()
    with proxy_to(postgres_url) as running:
        yield running


async def _wait_all_ok(store: MessageStore, count: int, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while True:
        states = [row["state"] for row in stored(store)]
        if len(states) == count and all(state == MessageState.OK for state in states):
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"not all {count} messages OK within {timeout} s: {states}")
        await asyncio.sleep(0.05)


async def test_outage_answers_503_stores_nothing_logs_once_and_recovers(
    proxy: TcpProxy, postgres_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="openroute")
    direct = MessageStore(postgres_url)  # around the proxy: what the database really holds
    engine = Engine(
        MessageStore(proxy.url(postgres_url)), routes(),
        EngineSettings(node_id="outage-node", repoll_interval=timedelta(seconds=0.2),
                       heartbeat_interval=timedelta(seconds=1), store_retry_after=7),
    )
    await engine.start()
    app = create_app(engine, BINDINGS, manage_engine=False)
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://node") as http:
            before = await http.post("/api/orders/create", json={"orderId": "O-1", "customer": {"id": "C-1"}},
                                     headers=JSON_HEADERS)
            assert before.status_code == 202
            await _wait_all_ok(direct, 1)

            proxy.cut()
            for number in range(3):
                answer = await http.post(
                    "/api/orders/create", json={"orderId": f"O-down-{number}", "customer": {"id": "C-2"}},
                    headers={**JSON_HEADERS, "X-Correlation-Id": f"down-{number}"},
                )
                assert answer.status_code == 503, answer.text
                assert answer.headers["Retry-After"] == "7"
                assert answer.json()["error"] == "STORE_UNAVAILABLE"
                assert "retry" in answer.json()["reason"]
            fault = await http.post(
                "/soap/orders", content=envelope(create_order("O-down-soap"), trace={"sourceSystem": "CRM"}),
                headers=SOAP11_HEADERS,
            )
            assert fault.status_code == 503
            assert fault.headers["Retry-After"] == "7"
            root = etree.fromstring(fault.content)
            assert root.findtext(f".//{{{SOAP11}}}Fault/faultcode") == "env:Server"
            assert "retry" in (root.findtext(f".//{{{SOAP11}}}Fault/faultstring") or "")
            assert root.findtext(".//{urn:openroute:inbound:v1}code") == "STORE_UNAVAILABLE"
            # repoll (every 0.2 s) and heartbeat (every 1 s) tick against the dead store meanwhile: an absence of
            # log lines cannot be awaited, so give them a few ticks
            await asyncio.sleep(1.5)
            assert [row["correlation_id"] for row in stored(direct)] == [before.json()["correlationId"]]

            proxy.restore()
            after = await http.post("/api/orders/create", json={"orderId": "O-2", "customer": {"id": "C-3"}},
                                    headers=JSON_HEADERS)
            assert after.status_code == 202, after.text
            await _wait_all_ok(direct, 2)
            deadline = time.monotonic() + 30  # the work signal listener connects again after its back-off
            while sum("reachable again" in r.getMessage() for r in caplog.records) < 2:
                assert time.monotonic() < deadline, "the work signal listener did not listen again within 30 s"
                await asyncio.sleep(0.05)
    finally:
        await engine.stop()
        engine.store.dispose()
        direct.dispose()

    records = [r for r in caplog.records if r.name.startswith("openroute")]
    warnings = [r for r in records if r.levelno >= logging.WARNING]
    # one for the requests, repoll and heartbeat, one for the work signal listener's own connection (PostgreSQL)
    assert sorted((r.levelname, r.name, r.getMessage().split(" unreachable")[0]) for r in warnings) == [
        ("WARNING", "openroute.store", "message store"),
        ("WARNING", "openroute.store", "message store (work signal listener)"),
    ], [r.getMessage() for r in warnings]
    assert not any(r.exc_info for r in records), [r.getMessage() for r in records if r.exc_info]
    back = [r for r in records if "reachable again" in r.getMessage()]
    assert [r.levelname for r in back] == ["INFO", "INFO"]


async def test_metrics_during_an_outage_answer_with_one_warning_and_no_traceback(
    proxy: TcpProxy, postgres_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A Prometheus server scrapes every 15 s whatever the database does: each scrape used to log a traceback for
    the backlog and another for the circuit breakers while the store was away."""
    caplog.set_level(logging.DEBUG, logger="openroute")
    engine = Engine(MessageStore(proxy.url(postgres_url)), routes(),
                    EngineSettings(node_id="metrics-outage", repoll_interval=None))
    await engine.start()
    app = create_app(engine, BINDINGS, manage_engine=False)
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://node") as http:
            proxy.cut()  # before any scrape: the backlog's cache (a few seconds) must not answer for the store
            for _ in range(3):
                scrape = await http.get("/metrics")
                assert scrape.status_code == 200
                assert "openroute_accepted_total 0.0" in scrape.text  # this node's own counters still answer
                assert "openroute_messages{" not in scrape.text  # the store's figures are missing, not made up
            proxy.restore()
            back = await http.get("/metrics")
            assert back.status_code == 200
    finally:
        await engine.stop()
        engine.store.dispose()

    records = [r for r in caplog.records if r.name.startswith("openroute")]
    warnings = [r.getMessage() for r in records if r.levelno >= logging.WARNING]
    # the scrapes' one line (the work signal listener's own connection, PostgreSQL, has its own)
    scrapes = [w for w in warnings if "work signal listener" not in w]
    assert len(scrapes) == 1 and scrapes[0].startswith("message store (/metrics) unreachable (the messages per route)")
    assert not any(r.exc_info for r in records), [r.getMessage() for r in records if r.exc_info]
    assert [r.levelname for r in records if r.getMessage().startswith("message store (/metrics) reachable again")] \
        == ["INFO"]
