"""``openroute run`` with a channel-fed route and outcome events: /health reports the channel, every final state
reaches the events queue, a clean stop exits 0."""

from __future__ import annotations

import asyncio
import json
import textwrap
import time
from pathlib import Path

import httpx
import pytest
from openroute.persistence import MessageStore

from tests.channels.amqp_helpers import delete, publish, take_all, unique
from tests.inbound.test_cli_run import ROOT, Server, _environment

pytestmark = pytest.mark.rabbitmq


def test_run_serves_the_channel_and_publishes_the_outcomes(tmp_path: Path, rabbitmq_url: str) -> None:
    url = f"sqlite:///{tmp_path / 'openroute.db'}"
    store = MessageStore(url)
    store.create_schema()
    store.dispose()
    queue, events = unique("run-in"), unique("run-events")
    config = tmp_path / "openroute.toml"
    config.write_text(textwrap.dedent(f'''
        database_url = "{url}"
        routes = "tests.channels.channel_app:app"

        [openroute.messaging.connector.amqp]
        url = "{rabbitmq_url}"

        [openroute.messaging.incoming.crm-in]
        connector = "amqp"
        queue = "{queue}"
        source-system = "CRM"

        [openroute.messaging.outgoing.crm-events]
        connector = "amqp"
        queue = "{events}"
        outcome-events = "final"
    '''))
    try:
        server = Server(["--config", str(config)], ROOT, _environment())
        line = server.wait_for("serving")
        assert "channels crm-in" in line
        health = httpx.get(f"{server.base}/health", timeout=10).json()
        assert health["channels"] == {"crm-in": "connected"} and health["status"] == "ok"
        asyncio.run(publish(rabbitmq_url, queue, [({"customer": {"id": f"C{i}"}}, f"m-{i}") for i in range(5)]))
        received: list[dict[str, object]] = []
        deadline = time.monotonic() + 30
        while len(received) < 5:
            assert time.monotonic() < deadline, f"only {len(received)} events within 30 s"
            received += [json.loads(m.body) for m in asyncio.run(take_all(rabbitmq_url, events))]
            time.sleep(0.1)
        assert sorted(e["correlationId"] for e in received) == [f"m-{i}" for i in range(5)]
        assert {e["state"] for e in received} == {"OK"} and {e["sourceSystem"] for e in received} == {"CRM"}
        assert server.stop() == 0
    finally:
        asyncio.run(delete(rabbitmq_url, queue, events))
