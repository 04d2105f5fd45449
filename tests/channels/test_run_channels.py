"""``openroute run`` with a channel-fed route and outcome events: /health reports the channel, every final state
reaches the events queue, a clean stop exits 0."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import httpx
import pytest
import sqlalchemy as sa
from openroute.persistence import MessageStore

from tests.channels.amqp_helpers import delete, publish, take_all, unique
from tests.channels.run_config import with_schema, write_run_config
from tests.inbound.test_cli_run import ROOT, Server, _environment

pytestmark = pytest.mark.rabbitmq


def test_run_serves_the_channel_and_publishes_the_outcomes(tmp_path: Path, rabbitmq_url: str) -> None:
    url = with_schema(f"sqlite:///{tmp_path / 'openroute.db'}")
    queue, events = unique("run-in"), unique("run-events")
    config = write_run_config(tmp_path, url, rabbitmq_url, queue, events=events)
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


def test_two_run_processes_on_one_queue_store_each_message_once(
    tmp_path: Path, postgres_url: str, rabbitmq_url: str
) -> None:
    store = MessageStore(postgres_url)
    store.create_schema()
    queue = unique("two-nodes")
    config = write_run_config(tmp_path, postgres_url, rabbitmq_url, queue, concurrency=8, queue_size=8)
    messages = [({"customer": {"id": f"C{i}"}}, f"m-{i}") for i in range(150)]
    servers = []
    try:
        for _ in range(2):
            servers.append(Server(["--config", str(config)], ROOT, _environment()))
        for server in servers:
            server.wait_for("serving")  # both consume before anything is published: the broker shares the load
        asyncio.run(publish(rabbitmq_url, queue, [*messages, *messages]))  # each twice: copies reach either node
        deadline = time.monotonic() + 60
        while len(rows := _rows(store)) < 150:
            assert time.monotonic() < deadline, f"{len(rows)} rows within 60 s"
            time.sleep(0.1)
        assert all(server.stop() == 0 for server in servers)
        rows = _rows(store)
        assert sorted(correlation for correlation, _node in rows) == sorted(m for _, m in messages)  # none twice
        assert len({node for _correlation, node in rows}) == 2  # each node stored its share
        # copies still unsettled at the stop went back to the queue: each one is stored already
        left = {m.message_id for m in asyncio.run(take_all(rabbitmq_url, queue))}
        assert left <= {correlation for correlation, _node in rows}
    finally:
        for server in servers:
            if server.process.poll() is None:
                server.process.kill()
                server.process.wait(30)
        store.dispose()
        asyncio.run(delete(rabbitmq_url, queue))


def _rows(store: MessageStore) -> list[tuple[str, str]]:
    """(correlation id, node that stored it) of every stored message."""
    with store.engine.connect() as connection:
        return [(row[0], row[1]) for row in connection.execute(sa.text(
            "SELECT m.correlation_id, t.node_id FROM message m JOIN message_transition t ON t.message_id = m.id "
            "AND t.to_state = 'NEW'"))]


def test_a_broker_refusing_the_login_ends_the_start_in_one_line_and_exit_7(tmp_path: Path, rabbitmq_url: str) -> None:
    """A wrong broker password: one error line naming the broker (password masked) and exit code 7, no traceback
    and nothing said about "serving"."""
    from tests.inbound.test_cli_run import run_fails

    url = with_schema(f"sqlite:///{tmp_path / 'openroute.db'}")
    wrong = rabbitmq_url.replace("guest:guest@", "guest:Wr0ngPassw0rd@")
    assert wrong != rabbitmq_url, "the test broker's URL carries guest:guest"
    config = write_run_config(tmp_path, url, wrong, unique("refused"))
    failed = run_fails(["--config", str(config), "--port", "0"], ROOT)
    output = failed.stdout + failed.stderr
    assert failed.returncode == 7, output
    errors = [line for line in output.splitlines() if "ERROR" in line or line.startswith("openroute run:")]
    assert errors == [errors[0]] and errors[0].startswith("openroute run: amqp: cannot connect to amqp://guest:***@")
    assert "ACCESS_REFUSED" in errors[0] and "Wr0ngPassw0rd" not in output
    assert "Traceback" not in output and "serving" not in output and "startup failed" not in output
