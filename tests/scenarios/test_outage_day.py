"""The bad day of issue 25, scaled down and on simulated time: the reference app under a steady load while its MNO
(the HLR of docs/outage.md) answers every call with HTTP 503 for 30 s, with the breaker settings of docs/outage.md.

The MNO gets few calls during the outage (the breaker opens after ``minimum_calls`` and lets a trial through every
``open_wait``), no message ends FAILED because of it, the breaker-open alert notifies once when it fires and once when
it resolves, and after the MNO returns every message ends OK. The clock is a ManualClock advanced one second per
round; each round accepts the load's messages, processes them and runs the repoll."""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta

from openroute.persistence import MessageState, MessageStore
from openroute.persistence.breaker import BreakerState, BreakerStore
from openroute_reference import build_application, external_systems

from openroute.alerts import EXAMPLE_RULES, AlertEvaluator, AlertRule, Notification, Notifier
from openroute.definitions.clock import ManualClock
from openroute.definitions.message import InboundMessage
from openroute.engine import Engine, EngineSettings
from openroute.outbound import BreakerSettings, ExternalCalls, ExternalSystem

START = datetime(2026, 11, 25, 9, 0, tzinfo=UTC)
#: the settings of docs/outage.md
MNO = ExternalSystem("MNO", call_timeout=timedelta(seconds=10), breaker=BreakerSettings(
    failure_rate_threshold=50, window_size=20, minimum_calls=10, open_wait=timedelta(seconds=20), trial_calls=2,
    trial_timeout=timedelta(seconds=10)))
# messages per (simulated) second and the outage's length; the full size: OPENROUTE_OUTAGE_RATE=20
# OPENROUTE_OUTAGE_SECONDS=60 (minutes of run time, so not the suite's default)
RATE = int(os.environ.get("OPENROUTE_OUTAGE_RATE", "4"))
OUTAGE_START = 5
OUTAGE_END = OUTAGE_START + int(os.environ.get("OPENROUTE_OUTAGE_SECONDS", "30"))


class Collected(Notifier):
    name = "collected"

    def __init__(self) -> None:
        self.sent: list[Notification] = []

    async def notify(self, notification: Notification) -> None:
        self.sent.append(notification)


async def test_the_mno_stops_for_30_s_the_breaker_spares_it_and_every_message_ends_ok(sqlite_url: str) -> None:
    systems = external_systems()
    mno = systems.mno_fake
    assert mno is not None
    store = MessageStore(sqlite_url)
    store.create_schema()
    clock = ManualClock(START)
    calls = ExternalCalls(store, [MNO, ExternalSystem("BILLING")], clock=clock)
    engine = Engine(store, build_application(systems).routes, EngineSettings(repoll_interval=None, node_id="n1"),
                    clock=clock, external_calls=calls)
    breaker_rule = next(rule for rule in EXAMPLE_RULES if rule.name == "breaker-open")
    notifier = Collected()
    alerts = AlertEvaluator(store, [AlertRule(breaker_rule.name, sql=breaker_rule.sql, interval=timedelta(seconds=1))],
                            [notifier], node_id="n1", clock=clock)
    await engine.start()
    sent = 0
    outage_calls = 0
    states_seen: set[BreakerState] = set()
    try:
        for second in range(400):
            if second == OUTAGE_START:
                mno.fail_next(10**9)
                before = mno.total_calls
            if second == OUTAGE_END:
                outage_calls = mno.total_calls - before
                mno.fail_next(0)
            if second < OUTAGE_END + 5:  # the load stops 5 s after the MNO returns; then the backlog drains
                for _ in range(RATE):
                    sent += 1
                    await engine.accept(InboundMessage(
                        service="crm", operation="setCustomer", content_type="application/json",
                        payload=f'{{"customerId": "C-{sent}", "msisdn": "420777{sent:06d}"}}',
                        correlation_id=f"load-{sent}", source_system="CRM", object_id=f"C-{sent}",
                        entity_type="customer"))
            await engine.wait_idle(30)
            await engine.repoll_once()
            await engine.wait_idle(30)
            await alerts.evaluate_once()
            row = BreakerStore(store).get("MNO")
            if row is not None:
                states_seen.add(row.state)
            counts = store.count_by_state()
            assert counts.get(MessageState.FAILED, 0) == 0, f"second {second}: a message ended FAILED"
            if second > OUTAGE_END + 5 and counts.get(MessageState.OK, 0) == sent:
                break
            clock.advance(timedelta(seconds=1))
    finally:
        await engine.stop()
        store.dispose()
    print(f"MNO calls during the {OUTAGE_END - OUTAGE_START} s outage: {outage_calls} "
          f"(of {RATE * (OUTAGE_END - OUTAGE_START)} messages); drained at second {second}")
    assert outage_calls <= 30, outage_calls
    assert BreakerState.OPEN in states_seen and row is not None and row.state is BreakerState.CLOSED
    assert [n.kind.value for n in notifier.sent] == ["firing", "resolved"]
    assert second < 399, "the backlog did not drain"
