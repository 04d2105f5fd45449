"""Nodes that compete and nodes that die: exactly-once processing and exactly-once effects."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from datetime import timedelta
from pathlib import Path

import pytest
import sqlalchemy as sa
from openroute.persistence import MessageState, MessageStore, message_table

from openroute import Exchange, Route, RouteRegistry
from openroute.engine import Engine, EngineSettings
from tests.lifecycle.conftest import inbound

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.postgres
@pytest.mark.slow
async def test_two_engines_on_one_postgres_process_each_message_exactly_once(postgres_url: str) -> None:
    count = 2000
    runs = Counter[int]()

    def step(exchange: Exchange) -> None:
        runs[exchange.message.id] += 1

    store = MessageStore(postgres_url)
    store.create_schema()
    engines = []
    for node in ("node-a", "node-b"):
        # every repoll also takes NEW messages the other node accepted: both nodes race for the same rows
        settings = EngineSettings(node_id=node, concurrency=8, queue_size=128, repoll_interval=timedelta(seconds=0.02),
                                  new_pickup_age=timedelta(0))
        engines.append(Engine(MessageStore(postgres_url), RouteRegistry([Route("orders", "create", [step])]), settings))
    try:
        for engine in engines:
            await engine.start()

        async def feed(engine: Engine, first: int) -> None:
            for i in range(first, count, 2):
                await engine.accept(inbound(f"m-{i}"))

        await asyncio.wait_for(asyncio.gather(feed(engines[0], 0), feed(engines[1], 1)), 120)
        async with asyncio.timeout(120):
            while store.count_by_state() != {MessageState.OK: count}:
                await asyncio.gather(*(engine.wait_idle(60) for engine in engines))
                await asyncio.sleep(0.02)
    finally:
        for engine in engines:
            await engine.stop()
    assert len(runs) == count and set(runs.values()) == {1}, "a message was processed twice"
    with store.begin() as connection:
        versions = connection.execute(sa.select(message_table.c.version).distinct()).scalars().all()
        by_node = dict(connection.execute(
            sa.select(message_table.c.node_id, sa.func.count()).group_by(message_table.c.node_id)).all())
    assert versions == [2], "each message was claimed once: NEW -> PROCESSING -> OK"
    assert set(by_node) == {"node-a", "node-b"} and sum(by_node.values()) == count
    lost = sum(engine.stats.lost_claims for engine in engines)
    print(f"\nprocessed by node: {by_node}; claims lost to the other node: {lost}")
    store.dispose()


def _worker(url: str, count: int) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.lifecycle.crash_worker", url, str(count), "crash-node"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )


@pytest.mark.slow
def test_worker_killed_mid_run_loses_nothing_and_applies_no_effect_twice(database_url: str) -> None:
    count = 1000
    store = MessageStore(database_url)
    store.create_schema()
    with store.begin() as connection:
        connection.execute(sa.text("CREATE TABLE effect (message_id INTEGER NOT NULL)"))

    def effects() -> int:
        with store.begin() as connection:
            return connection.execute(sa.text("SELECT count(*) FROM effect")).scalar_one()

    first = _worker(database_url, count)
    deadline = time.monotonic() + 120
    while effects() < count // 3:  # bounded poll on the database for progress
        assert first.poll() is None, first.stdout.read().decode() if first.stdout else ""
        assert time.monotonic() < deadline, "the worker made no progress"
        time.sleep(0.01)
    os.kill(first.pid, signal.SIGKILL)
    first.wait(30)
    assert first.returncode == -signal.SIGKILL
    at_kill = store.count_by_state()
    unfinished = sum(n for state, n in at_kill.items() if not state.is_final)
    assert unfinished > 0, f"the kill came too late to test anything: {at_kill}"

    second = _worker(database_url, count)
    output, _ = second.communicate(timeout=180)
    assert second.returncode == 0, output.decode()

    assert store.count_by_state() == {MessageState.OK: count}, "every message ends in a final state"
    with store.begin() as connection:
        twice = connection.execute(
            sa.text("SELECT message_id FROM effect GROUP BY message_id HAVING count(*) > 1")).scalars().all()
        per_message = connection.execute(sa.text("SELECT count(DISTINCT message_id) FROM effect")).scalar_one()
        calls = connection.execute(sa.text("SELECT count(*) FROM external_call WHERE status = 'OK'")).scalar_one()
    assert twice == [], "an external effect was applied twice"
    assert per_message == count and effects() == count and calls == count
    print(f"\nstate at the kill: { {s.value: n for s, n in at_kill.items()} }")
    store.dispose()
