"""The way back from a bad day (issue 41), scaled down and on simulated time: a route with a funnel over 10 values and
one call of an external system, under a steady load, while the system is down for 30 s, with the breaker settings of
docs/outage.md. The figures the issue names are asserted: the backlog is final within seconds of the breaker closing,
each message waits once per wait (POSTPONED) and runs at most twice (PROCESSING) but for its real failures, at most two
INFO lines per message, no lease lost. The clock is a ManualClock advanced one second per round; each round accepts
the round's messages, lets the node work and runs the repoll once (benchmarks/badday_bench.py runs the real day with
`openroute run` processes)."""

from __future__ import annotations

import logging
from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from openroute.persistence import MessageState, MessageStore
from openroute.persistence.breaker import BreakerState, BreakerStore

from openroute import TechnicalError
from openroute.definitions.clock import ManualClock
from openroute.definitions.message import InboundMessage
from openroute.definitions.retry import RetryPolicy
from openroute.definitions.route import Route, RouteRegistry
from openroute.engine import Engine, EngineSettings
from openroute.outbound import BreakerSettings, ExternalCalls, ExternalSystem
from openroute.runtime.logs import TransitionLog

START = datetime(2026, 12, 5, 9, 0, tzinfo=UTC)
REMOTE = ExternalSystem("REMOTE", call_timeout=timedelta(seconds=10), breaker=BreakerSettings(
    failure_rate_threshold=50, window_size=20, minimum_calls=10, open_wait=timedelta(seconds=20), trial_calls=2,
    trial_timeout=timedelta(seconds=10)), max_concurrent_calls=8)
RATE = 4
OUTAGE_START, OUTAGE_END = 5, 35
FUNNELS = 10


class Remote:
    def __init__(self) -> None:
        self.down = False
        self.calls_while_down = 0

    def call(self) -> str:
        if self.down:
            self.calls_while_down += 1
            raise TechnicalError("HTTP 503 from REMOTE", code="HTTP_503")
        return "done"


@pytest.mark.parametrize("funnel", [True, False], ids=["funnel", "no-funnel"])
async def test_after_the_outage_the_backlog_drains_at_once_and_nothing_waits_by_polling(
    database_url: str, funnel: bool, caplog: pytest.LogCaptureFixture
) -> None:
    store = MessageStore(database_url)
    store.create_schema()
    clock = ManualClock(START)
    remote = Remote()

    async def call_remote(exchange: Any) -> None:
        await exchange.ext_call("update", remote.call, system="REMOTE")

    route = Route("crm", "update", [call_remote], retry_policy=RetryPolicy(
        max_attempts=5, interval=timedelta(seconds=30), backoff=2.0))
    engine = Engine(store, RouteRegistry([route]), EngineSettings(repoll_interval=None, node_id="n1"), clock=clock,
                    external_calls=ExternalCalls(store, [REMOTE], clock=clock))
    engine.on_transition(TransitionLog())
    caplog.set_level(logging.INFO, logger="openroute")
    await engine.start()
    sent = 0
    closed_at = final_at = None
    outage_lines = 0
    try:
        for second in range(300):
            if second == OUTAGE_START:
                remote.down = True
                caplog.clear()
            if second == OUTAGE_END:
                remote.down = False
                outage_lines = sum(1 for r in caplog.records if r.levelno == logging.INFO)
            if second < OUTAGE_END + 5:
                for _ in range(RATE):
                    sent += 1
                    await engine.accept(InboundMessage(
                        service="crm", operation="update", content_type="application/json", payload="{}",
                        correlation_id=f"load-{sent}", source_system="crm",
                        funnel_value=f"object-{sent % FUNNELS}" if funnel else None))
            await engine.wait_idle(30)
            await engine.repoll_once()
            await engine.wait_idle(30)
            row = BreakerStore(store).get("REMOTE")
            if closed_at is None and second > OUTAGE_END and row is not None and row.state is BreakerState.CLOSED:
                closed_at = second
            counts = store.count_by_state()
            assert counts.get(MessageState.FAILED, 0) == 0, f"second {second}: a message ended FAILED"
            if second > OUTAGE_END + 5 and counts.get(MessageState.OK, 0) == sent:
                final_at = second
                break
            clock.advance(timedelta(seconds=1))
        ids = [m.id for m in store.find()]
        moves = {i: store.transitions.of(i) for i in ids}
    finally:
        await engine.stop()
        store.dispose()

    assert closed_at is not None and final_at is not None, "the breaker closed and every message ended OK"
    arrived_in_outage = RATE * (OUTAGE_END - OUTAGE_START)
    print(f"\n{'funnel' if funnel else 'no funnel'}: REMOTE got {remote.calls_while_down} calls while down; "
          f"breaker closed at second {closed_at}, every message final at {final_at}; "
          f"{outage_lines} INFO lines in the outage for {arrived_in_outage} messages")
    assert final_at - closed_at <= 3, "the backlog drains at once when the breaker closes"
    assert remote.calls_while_down <= 30
    waited = 0
    totals: Counter[str] = Counter()
    for message_id, history in moves.items():
        states = [str(row["to_state"]) for row in history]
        failures = states.count("PARTLY_FAILED")
        runs, waits = states.count("PROCESSING"), states.count("POSTPONED")
        codes = [row["error_code"] for row in history if str(row["to_state"]) == "POSTPONED"]
        shown = f"message {message_id}: " + " ".join(f"{row['to_state']}:{row['error_code']}" for row in history)
        # once per wait: behind the funnel (again after each release from the breaker), on the breaker (again only
        # after a real failure, or once for a trial that found its place taken)
        parks = codes.count("CIRCUIT_OPEN")
        assert codes.count("FUNNEL") <= 1 + parks + failures and parks <= 2 + failures, shown
        assert runs <= 2 + 2 * failures + 1, shown
        assert "PROCESSING_ABANDONED" not in [row["error_code"] for row in history], shown
        waited += waits > 0
        totals.update({"runs": runs, "waits": waits, "failures": failures})
    assert totals["runs"] <= len(ids) + waited + 2 * totals["failures"] + 6, totals
    assert outage_lines <= 2 * arrived_in_outage, f"{outage_lines} INFO lines for {arrived_in_outage} messages"
