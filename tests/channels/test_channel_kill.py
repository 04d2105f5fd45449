"""``openroute run`` fed by a RabbitMQ queue, SIGKILLed during a load and restarted: every message the broker no
longer holds is in the store, exactly once (persist, then acknowledge); every final state reaches the events queue
at least once, a second time only for an event in flight at a kill, and then with the same event id.

The in-suite load is 200 messages and one kill (two starts of the node); ``benchmarks/channel_kill.py`` runs the issue's
full size (>= 1,000 messages, several kills) against the same code.
"""

from __future__ import annotations

import asyncio
import json
import signal
import time
from collections import Counter
from pathlib import Path

import pytest
import sqlalchemy as sa

from tests.channels.amqp_helpers import delete, publish, ready, take_all, unique
from tests.channels.run_config import with_schema, write_run_config
from tests.inbound.test_cli_run import ROOT, Server, _environment

pytestmark = [pytest.mark.rabbitmq, pytest.mark.slow]

MESSAGES = 200


def stored(url: str) -> list[str]:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as connection:
            return list(connection.execute(sa.text("SELECT correlation_id FROM message")).scalars())
    finally:
        engine.dispose()


def leased_events(url: str) -> set[str]:
    """Event ids of the outbox rows a publisher had leased and not yet deleted: the events in flight."""
    engine = sa.create_engine(url)
    try:
        with engine.connect() as connection:
            return set(connection.execute(sa.text(
                "SELECT event_id FROM outbox WHERE lease_until IS NOT NULL")).scalars())
    finally:
        engine.dispose()


def wait_rows(url: str, at_least: int, timeout: float = 60) -> int:
    deadline = time.monotonic() + timeout
    while (count := len(stored(url))) < at_least:
        assert time.monotonic() < deadline, f"only {count} rows within {timeout} s"
        time.sleep(0.02)
    return count


def test_sigkill_during_a_load_loses_and_doubles_nothing(tmp_path: Path, rabbitmq_url: str) -> None:
    url = with_schema(f"sqlite:///{tmp_path / 'openroute.db'}")
    queue, events = unique("kill"), unique("kill-events")
    # a fixed node id: the restarted node takes back the outbox leases its killed run held
    config = write_run_config(tmp_path, url, rabbitmq_url, queue, events=events, node_id="kill-node")
    ids = [f"m-{i}" for i in range(MESSAGES)]
    in_flight_at_kills: set[str] = set()
    try:
        asyncio.run(publish(rabbitmq_url, queue, [({"customer": {"id": f"C{i}"}}, m) for i, m in enumerate(ids)]))
        for threshold in (MESSAGES // 3,):
            server = Server(["--config", str(config)], ROOT, _environment())
            server.wait_for("serving")
            wait_rows(url, threshold)
            server.process.send_signal(signal.SIGKILL)
            server.process.wait(30)
            in_flight_at_kills |= leased_events(url)
            # the broker gave the killed node's unacked deliveries back: whatever it no longer holds is stored
            left = asyncio.run(ready(rabbitmq_url, queue))
            rows = stored(url)
            assert len(rows) == len(set(rows)), "a message was stored twice"
            assert len(rows) >= MESSAGES - left, f"{MESSAGES - left} acked but only {len(rows)} stored"
        server = Server(["--config", str(config)], ROOT, _environment())
        server.wait_for("serving")
        wait_rows(url, MESSAGES)
        received = wait_events(rabbitmq_url, events, MESSAGES)
        assert server.stop() == 0
        assert asyncio.run(ready(rabbitmq_url, queue)) == 0
        rows = stored(url)
        assert sorted(rows) == sorted(ids)
    finally:
        asyncio.run(delete(rabbitmq_url, queue, events))
    by_message: dict[str, set[str]] = {}
    for event in received:
        by_message.setdefault(str(event["correlationId"]), set()).add(str(event["eventId"]))
    assert sorted(by_message) == sorted(ids)  # every final state published
    assert all(len(event_ids) == 1 for event_ids in by_message.values())  # a message's event keeps its id
    published = Counter(str(event["eventId"]) for event in received)
    twice = {event_id for event_id, count in published.items() if count > 1}
    assert twice <= in_flight_at_kills, "an event not in flight at a kill was published twice"


def wait_events(url: str, queue: str, messages: int, timeout: float = 60) -> list[dict[str, object]]:
    """The events taken from ``queue`` until ``messages`` distinct messages have one."""
    deadline = time.monotonic() + timeout
    received: list[dict[str, object]] = []
    while len({event["correlationId"] for event in received}) < messages:
        assert time.monotonic() < deadline, f"events of {len(received)} messages within {timeout} s"
        received += [json.loads(m.body) for m in asyncio.run(take_all(url, queue))]
        time.sleep(0.1)
    return received
