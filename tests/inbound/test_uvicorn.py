"""The whole app through real uvicorn on a free loopback port: accept, process to OK, metrics, health."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator

import httpx
import pytest
from openroute.persistence import MessageStore, StoredMessage

from openroute.engine import Engine, EngineSettings
from tests._support.servers import serving
from tests.inbound.conftest import AUTH, BINDINGS, SOAP11_HEADERS, basic, create_order, envelope, routes
from tests.inbound.conftest import SETTINGS as INBOUND_SETTINGS


class Served:
    def __init__(self, engine: Engine, url: str, finished: threading.Event, final: list[StoredMessage]) -> None:
        self.engine, self.url, self.finished, self.final = engine, url, finished, final


@pytest.fixture
def served(store: MessageStore) -> Iterator[Served]:
    from openroute.server import create_app

    engine = Engine(store, routes(), EngineSettings(repoll_interval=None, node_id="uvicorn-test"))
    finished = threading.Event()
    final: list[StoredMessage] = []

    async def on_final(message: StoredMessage) -> None:
        final.append(message)
        finished.set()

    engine.on_final_state(on_final)
    app = create_app(engine, BINDINGS, inbound_auth=AUTH, settings=INBOUND_SETTINGS)  # lifespan runs the engine
    with serving(app) as url:  # asserts that uvicorn started, and stopped after the block
        yield Served(engine, url, finished, final)
    assert not engine.running  # the lifespan stopped the engine


async def test_through_uvicorn_accept_process_and_observe(served: Served) -> None:
    async with httpx.AsyncClient(base_url=served.url, timeout=10) as http:
        response = await http.post("/soap/orders", content=envelope(create_order(), trace={"correlationId": "u-1"}),
                                   headers={**SOAP11_HEADERS, **basic()})
        assert response.status_code == 200, response.text
        message_id = int(response.headers["x-message-id"])
        assert await asyncio.to_thread(served.finished.wait, 20)
        assert [(m.id, m.state.value) for m in served.final] == [(message_id, "OK")]

        refused = await http.post("/soap/orders", content=b"<!DOCTYPE x><x/>", headers={**SOAP11_HEADERS, **basic()})
        assert "<ib:code>FORBIDDEN_XML</ib:code>" in refused.text
        big = await http.post("/api/orders/create", content=b"{" + b" " * 200_000 + b"}",
                              headers={"Content-Type": "application/json", **basic()})
        assert big.status_code == 413

        metrics = (await http.get("/metrics")).text
        assert 'openroute_final_messages_total{operation="create",service="orders",state="OK"} 1.0' in metrics
        assert 'openroute_inbound_requests_total{endpoint="soap",outcome="ACCEPTED"} 1.0' in metrics
        assert 'openroute_inbound_requests_total{endpoint="soap",outcome="FORBIDDEN_XML"} 1.0' in metrics
        assert 'openroute_inbound_requests_total{endpoint="json",outcome="PAYLOAD_TOO_LARGE"} 1.0' in metrics
        assert 'openroute_message_latency_seconds_count{operation="create",service="orders",state="OK"} 1.0' in metrics
        assert 'openroute_outcomes_total{state="OK"} 1.0' in metrics
        assert "openroute_retries_total 0.0" in metrics

        health = await http.get("/health")
        assert health.status_code == 200 and health.json()["status"] == "ok" and health.json()["database"] == "ok"
