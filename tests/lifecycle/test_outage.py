"""Store outages under the loops of a node: the repair after an outage, and a real outage (a TCP proxy in front of
PostgreSQL, cut and restored) under every loop of a node, each logging it once and recovering. The outage's own
rules (unreachable or not, the back-off, one WARNING and one INFO) are tests/persistence/test_outage.py."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
from openroute.confirmation import ConfirmationService, DefaultConfirmationCallback
from openroute.persistence import (
    MessageState,
    MessageStore,
    NewMessage,
    NodeState,
    StoredMessage,
    confirmation_table,
    message_table,
)

from openroute.alerts import AlertEvaluator, AlertRule, LogNotifier
from openroute.definitions.clock import ManualClock
from openroute.definitions.route import Route, RouteRegistry
from openroute.engine import Engine, EngineSettings, EngineStats, states
from openroute.engine import outcome as outcomes
from openroute.engine.outbox import OutboxPublisher, OutboxSettings, OutcomeEvents
from openroute.engine.repoll import Repoll
from openroute.jobs import MessageCounts
from openroute.runtime.retention import RetentionPolicy
from openroute.server import create_app
from tests.lifecycle.conftest import START
from tests.tcp_proxy import proxy_to

#: the store's view of each loop of a node, as its WARNING and INFO lines begin
LOOPS = ("message store", "message store (confirmation loop)", "message store (retention job)",
         "message store (alert evaluator)", "message store (outbox publisher)",
         "message store (work signal listener)", "message store (message counts)", "message store (payload indexer)")


class KeptLog(DefaultConfirmationCallback):
    """The log's confirmation kept as rows, as a remote system's is (the confirmation loop reads them)."""

    @property
    def durable(self) -> bool:
        return True


async def test_after_an_outage_only_messages_abandoned_before_it_ended_are_repaired(store: MessageStore) -> None:
    """The repoll's first run after an outage repairs this node's PROCESSING messages that left its pipeline (their
    outcome could not be written). A message accepted and claimed while that run reads the store (the store is back,
    requests come in) is in flight, not abandoned: it is left alone (CI once saw the repair race its OK)."""

    def new(key: str) -> NewMessage:
        return NewMessage(service="orders", operation="create", payload="{}", content_type="application/json",
                          correlation_id=key, source_system="CRM", receive_ts=START)

    node = "node-1"
    abandoned = states.claim(store, [store.insert_message(new("abandoned")).message], node, START)[0]
    in_flight = store.insert_message(new("in-flight")).message
    clock = ManualClock(START + timedelta(seconds=1))
    queued: set[int] = set()
    repaired: list[tuple[int, MessageState]] = []

    async def run_db(work: Callable[[], object]) -> object:
        if in_flight.id not in queued:  # a request is accepted and its message claimed just before the first read
            queued.add(in_flight.id)
            states.claim(store, [in_flight], node, clock.advance(timedelta(seconds=1)))
        return work()

    class Pipeline:  # the commit pipeline as far as repoll writes through it: the repairs are noted, not written
        stats = EngineStats()

        async def apply(self, message: StoredMessage, decision: outcomes.Decision, now: object,
                        cause: str) -> StoredMessage:
            repaired.append((message.id, decision.target))
            return message

        async def submit(self, _operation: object) -> list[str]:
            return []  # no funnel waits without a holder

    class Idle:  # the reads, queue, feeder and parking of a node with no room and nothing waiting
        node_state = NodeState.RUN
        ids = queued
        run = staticmethod(run_db)

        async def feed(self, _cutoff: object) -> int:
            return 0

        async def survey(self) -> None:
            return None

    idle: Any = Idle()
    pipeline: Any = Pipeline()
    repoll = Repoll(store, RouteRegistry([Route("orders", "create", [_ok])]), clock, EngineSettings(node_id=node),
                    reads=idle, pipeline=pipeline, queue=idle, feeder=idle, funnel=idle, parking=idle)
    store.outage.failed(_unreachable(), "repoll")
    store.outage.succeeded()
    await repoll._repoll_job()
    assert repaired == [(abandoned.id, MessageState.PARTLY_FAILED)]


def _unreachable() -> sa.exc.OperationalError:
    return sa.exc.OperationalError("SELECT 1", {}, ConnectionRefusedError("connection refused"))


def _ok(_exchange: object) -> None:
    return None


def _lines(caplog: pytest.LogCaptureFixture, level: int, text: str) -> set[str]:
    """The loops (see LOOPS) that logged ``text`` at ``level``."""
    found = set()
    for record in caplog.records:
        message = record.getMessage()
        if record.levelno == level and text in message:
            found.add(message.split(f" {text}")[0])
    return found


async def _until(check: Callable[[], bool], what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"not within {timeout} s: {what}"
        await asyncio.sleep(0.05)


def _state(store: MessageStore, correlation_id: str) -> tuple[str | None, str | None]:
    """(message state, confirmation status) of one message, read around the proxy."""
    with store.engine.connect() as connection:
        row = connection.execute(
            sa.select(message_table.c.state, confirmation_table.c.status)
            .select_from(message_table.outerjoin(confirmation_table,
                                                 confirmation_table.c.message_id == message_table.c.id))
            .where(message_table.c.correlation_id == correlation_id)
        ).first()
    return (None, None) if row is None else (row.state, row.status)


async def test_every_loop_of_a_node_logs_a_real_outage_once_and_recovers(
    postgres_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Cut PostgreSQL under a node running every background loop (repoll, heartbeat, confirmations, retention,
    alerts, outbox, work signal listener, message counts, payload indexer): one WARNING and one INFO per loop, no
    traceback, and afterwards the node takes a new message to OK and confirms it without a restart."""
    caplog.set_level(logging.INFO)
    setup = MessageStore(postgres_url)
    setup.create_schema()
    setup.dispose()
    direct = MessageStore(postgres_url)  # around the proxy: what the database really holds
    tick = 0.2
    with proxy_to(postgres_url) as proxy:
        store = MessageStore(proxy.url(postgres_url))
        engine = Engine(store, RouteRegistry([Route("orders", "create", [_ok])]),
                        EngineSettings(node_id="outage-loops", repoll_interval=timedelta(seconds=tick),
                                       heartbeat_interval=timedelta(seconds=tick)))
        confirmation = ConfirmationService(store, KeptLog(), node_id="outage-loops")
        outbox = OutboxPublisher(store, [OutcomeEvents("events")],
                                 {"openroute.messaging.outgoing.events.connector": "in-memory"},
                                 node_id="outage-loops", settings=OutboxSettings(interval=tick), environ={})
        alerts = AlertEvaluator(store, [AlertRule("failed", states=("FAILED",), window=timedelta(minutes=10), limit=0,
                                                  interval=timedelta(seconds=tick))],
                                [LogNotifier()], node_id="outage-loops")
        app = create_app(engine, confirmation=confirmation, confirmation_interval=tick, outbox=outbox, alerts=alerts,
                         retention=RetentionPolicy(keep={"OK": timedelta(days=30)},
                                                   interval=timedelta(seconds=tick)),
                         counts=MessageCounts(store, fold_interval=tick))
        headers = {"Content-Type": "application/json", "X-Source-System": "CRM"}
        try:
            async with app.router.lifespan_context(app), httpx.AsyncClient(
                    transport=httpx.ASGITransport(app=app), base_url="http://node") as http:
                before = await http.post("/api/orders/create", content=json.dumps({"n": 1}),
                                         headers={**headers, "X-Correlation-Id": "before"})
                assert before.status_code == 202, before.text
                await _until(lambda: _state(direct, "before") == ("OK", "SENT"), "the first message confirmed")

                proxy.cut()
                await _until(lambda: _lines(caplog, logging.WARNING, "unreachable") == set(LOOPS),
                             "every loop said the store is unreachable")
                down = await http.post("/api/orders/create", content=json.dumps({"n": 2}),
                                       headers={**headers, "X-Correlation-Id": "down"})
                assert down.status_code == 503
                # the loops keep failing meanwhile (every 0.2 s, backing off): awaited, not slept
                loops = [confirmation.outage, app.state.retention.outage, alerts.outage, outbox.outage,
                         app.state.counts.outage, app.state.payload_indexer.outage]
                await _until(lambda: all(outage.failures >= 3 for outage in loops), "three failed passes per loop")

                proxy.restore()
                await _until(lambda: _lines(caplog, logging.INFO, "reachable again") == set(LOOPS),
                             "every loop said the store is back")
                after = await http.post("/api/orders/create", content=json.dumps({"n": 3}),
                                        headers={**headers, "X-Correlation-Id": "after"})
                assert after.status_code == 202, after.text
                await _until(lambda: _state(direct, "after") == ("OK", "SENT"), "the new message confirmed")
        finally:
            store.dispose()
            direct.dispose()

    assert _state(direct, "down") == (None, None)
    records = caplog.records
    assert not [r.getMessage() for r in records if r.exc_info], "a traceback was logged"
    for level, text in ((logging.WARNING, "unreachable"), (logging.INFO, "reachable again")):
        logged = sorted(r.getMessage().split(f" {text}")[0] for r in records
                        if r.levelno == level and f" {text}" in r.getMessage())
        assert logged == sorted(LOOPS), logged
    # psycopg itself may say once that it dropped a pipeline of the lost connection: not openroute's line
    others = [r.getMessage() for r in records if r.name.startswith("openroute") and r.levelno >= logging.WARNING
              and "unreachable" not in r.getMessage()]
    assert not others, others
    assert engine.stats.outcomes[MessageState.OK] == 2
