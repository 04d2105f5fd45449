"""``openroute run`` fed by a RabbitMQ queue, SIGKILLed during a load and restarted: every message the broker no
longer holds is in the store, exactly once (persist, then acknowledge).

The in-suite load is 200 messages and one kill (two starts of the node); ``benchmarks/channel_kill.py`` runs the issue's
full size (>= 1,000 messages, several kills) against the same code.
"""

from __future__ import annotations

import asyncio
import signal
import textwrap
import time
from pathlib import Path

import pytest
import sqlalchemy as sa
from openroute.persistence import MessageStore

from tests.channels.amqp_helpers import delete, publish, ready, unique
from tests.inbound.test_cli_run import ROOT, Server, _environment

pytestmark = [pytest.mark.rabbitmq, pytest.mark.slow]

MESSAGES = 200


def write_config(tmp_path: Path, database_url: str, broker: str, queue: str) -> Path:
    path = tmp_path / "openroute.toml"
    path.write_text(textwrap.dedent(f'''
        database_url = "{database_url}"
        routes = "tests.channels.channel_app:app"

        [openroute.messaging.connector.amqp]
        url = "{broker}"

        [openroute.messaging.incoming.crm-in]
        connector = "amqp"
        queue = "{queue}"
        source-system = "CRM"
    '''))
    return path


def stored(url: str) -> list[str]:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as connection:
            return list(connection.execute(sa.text("SELECT correlation_id FROM message")).scalars())
    finally:
        engine.dispose()


def wait_rows(url: str, at_least: int, timeout: float = 60) -> int:
    deadline = time.monotonic() + timeout
    while (count := len(stored(url))) < at_least:
        assert time.monotonic() < deadline, f"only {count} rows within {timeout} s"
        time.sleep(0.02)
    return count


def test_sigkill_during_a_load_loses_and_doubles_nothing(tmp_path: Path, rabbitmq_url: str) -> None:
    url = f"sqlite:///{tmp_path / 'openroute.db'}"
    store = MessageStore(url)
    store.create_schema()
    store.dispose()
    queue = unique("kill")
    config = write_config(tmp_path, url, rabbitmq_url, queue)
    ids = [f"m-{i}" for i in range(MESSAGES)]
    try:
        asyncio.run(publish(rabbitmq_url, queue, [({"customer": {"id": f"C{i}"}}, m) for i, m in enumerate(ids)]))
        for threshold in (MESSAGES // 3,):
            server = Server(["--config", str(config)], ROOT, _environment())
            server.wait_for("serving")
            wait_rows(url, threshold)
            server.process.send_signal(signal.SIGKILL)
            server.process.wait(30)
            # the broker gave the killed node's unacked deliveries back: whatever it no longer holds is stored
            left = asyncio.run(ready(rabbitmq_url, queue))
            rows = stored(url)
            assert len(rows) == len(set(rows)), "a message was stored twice"
            assert len(rows) >= MESSAGES - left, f"{MESSAGES - left} acked but only {len(rows)} stored"
        server = Server(["--config", str(config)], ROOT, _environment())
        server.wait_for("serving")
        wait_rows(url, MESSAGES)
        assert server.stop() == 0
        assert asyncio.run(ready(rabbitmq_url, queue)) == 0
        rows = stored(url)
        assert sorted(rows) == sorted(ids)
    finally:
        asyncio.run(delete(rabbitmq_url, queue))
