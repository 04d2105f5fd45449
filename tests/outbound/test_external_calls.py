"""Calls to declared external systems (openroute/outbound/calls.py): every state change of the circuit breaker on
SQLite and PostgreSQL, the breaker shared by two nodes on one PostgreSQL database, call records with masking (stored
by the guard, or by the caller's writer: an engine's group commit)."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from openroute.persistence import MessageState, MessageStore, StoredMessage
from openroute.persistence.breaker import BreakerStore
from openroute.persistence.call_records import CallRecord, CallRecordStore

from openroute import BusinessError, TechnicalError
from openroute.definitions.clock import ManualClock
from openroute.definitions.errors import CircuitOpenError
from openroute.definitions.message import InboundMessage
from openroute.outbound import BreakerSettings, BreakerState, CallRecordSettings, ExternalCalls, ExternalSystem

NOW = datetime(2026, 11, 25, 12, 0, tzinfo=UTC)
BREAKER = BreakerSettings(failure_rate_threshold=50, window_size=4, minimum_calls=4, open_wait=timedelta(seconds=20),
                          trial_calls=2, trial_timeout=timedelta(seconds=5), refresh=timedelta(0))
HLR = ExternalSystem("HLR", base_url="http://hlr.test/", breaker=BREAKER,
                     records=CallRecordSettings(enabled=True, operations="activate.*", secret_fields=("pin",)))


def stored_message(store: MessageStore, correlation_id: str = "c-1") -> StoredMessage:
    new = InboundMessage(service="crm", operation="activate", payload="{}", content_type="application/json",
                         correlation_id=correlation_id, source_system="crm").to_new_message(NOW)
    return store.insert_message(new).message


def fails() -> Any:
    raise ConnectionError("connection refused")


async def attempt(calls: ExternalCalls, message: StoredMessage, call: Callable[[], Any], key: str = "activate"
                  ) -> str:
    """What became of one guarded call: ok, business, failed or refused."""
    try:
        await calls.guard("HLR", key, message, call)
    except CircuitOpenError:
        return "refused"
    except BusinessError:
        return "business"
    except (ConnectionError, TechnicalError):
        return "failed"
    return "ok"


async def test_every_state_change_of_the_breaker_is_stored_and_logged_once(
    store: MessageStore, caplog: pytest.LogCaptureFixture
) -> None:
    clock = ManualClock(NOW)
    calls = ExternalCalls(store, [HLR], clock=clock)
    message = stored_message(store)
    breakers = BreakerStore(store)
    caplog.set_level(logging.INFO, "openroute.outbound")
    # CLOSED: business errors are answers, they do not open it; 2 failures of 4 calls (50%) do
    assert await attempt(calls, message, lambda: "ok") == "ok"
    assert await attempt(calls, message, lambda: (_ for _ in ()).throw(BusinessError("NO_SIM", "no sim"))) \
        == "business"
    assert breakers.get("HLR").state is BreakerState.CLOSED  # type: ignore[union-attr]
    assert await attempt(calls, message, fails) == "failed"
    assert breakers.get("HLR").state is BreakerState.CLOSED  # type: ignore[union-attr]
    assert await attempt(calls, message, fails) == "failed"
    row = breakers.get("HLR")
    assert row is not None and row.state is BreakerState.OPEN and row.open_until == NOW + timedelta(seconds=20)
    assert row.reason == "50% of the last 4 calls failed"
    # OPEN: refused (not called) until open_wait passed; the error says when to retry
    called: list[int] = []
    with pytest.raises(CircuitOpenError) as refused:
        await calls.guard("HLR", "activate", message, lambda: called.append(1))
    assert refused.value.retry_at == NOW + timedelta(seconds=20) and called == []
    # HALF_OPEN: the next call after open_wait is a trial; a failed trial opens it again
    clock.advance(timedelta(seconds=20))
    assert await attempt(calls, message, fails) == "failed"
    row = breakers.get("HLR")
    assert row is not None and row.state is BreakerState.OPEN and row.reason == "a trial call failed"
    assert row.open_until == clock.now() + timedelta(seconds=20)
    # two successful trials close it
    clock.advance(timedelta(seconds=20))
    assert await attempt(calls, message, lambda: "ok") == "ok"
    assert breakers.get("HLR").state is BreakerState.HALF_OPEN  # type: ignore[union-attr]
    assert await attempt(calls, message, lambda: "ok") == "ok"
    assert breakers.get("HLR").state is BreakerState.CLOSED  # type: ignore[union-attr]
    changes = [r.getMessage() for r in caplog.records if "circuit breaker" in r.getMessage()]
    assert [line.split(":")[0] for line in changes] == [
        "circuit breaker HLR OPEN (was CLOSED)", "circuit breaker HLR HALF_OPEN",
        "circuit breaker HLR OPEN (was HALF_OPEN)", "circuit breaker HLR HALF_OPEN",
        "circuit breaker HLR CLOSED (was HALF_OPEN for 0 s)",
    ]
    assert calls.stats[("HLR", "REFUSED")] == 1 and calls.stats[("HLR", "FAILED")] == 3


async def test_an_admin_forces_the_breaker_open_and_closed(store: MessageStore) -> None:
    clock = ManualClock(NOW)
    calls = ExternalCalls(store, [HLR], clock=clock)
    message = stored_message(store)
    row = await calls.force("HLR", BreakerState.OPEN, "ops")
    assert row.state is BreakerState.OPEN and row.forced and row.reason == "forced open by ops"
    clock.advance(timedelta(days=1))
    assert await attempt(calls, message, lambda: "ok") == "refused", "forced open: no trial after open_wait"
    await calls.force("HLR", BreakerState.CLOSED, "ops")
    assert await attempt(calls, message, lambda: "ok") == "ok"


async def test_a_hung_call_times_out_and_counts_as_a_failure(store: MessageStore) -> None:
    import asyncio

    system = ExternalSystem("HLR", breaker=BREAKER, call_timeout=timedelta(milliseconds=50))
    calls = ExternalCalls(store, [system], clock=ManualClock(NOW))
    message = stored_message(store)
    with pytest.raises(TechnicalError) as raised:
        await calls.guard("HLR", "activate", message, lambda: asyncio.sleep(10))
    assert raised.value.code == "TIMEOUT" and "no answer within 0.05 s" in str(raised.value)
    assert calls.stats[("HLR", "TIMEOUT")] == 1


@pytest.mark.postgres
async def test_a_breaker_opened_by_one_node_stops_the_other(postgres_url: str) -> None:
    node_a, node_b = MessageStore(postgres_url), MessageStore(postgres_url)
    node_a.create_schema()
    try:
        clock = ManualClock(NOW)
        slow_refresh = ExternalSystem("HLR", breaker=BreakerSettings(
            window_size=4, minimum_calls=4, open_wait=timedelta(seconds=20), trial_calls=1,
            refresh=timedelta(hours=1)))
        a = ExternalCalls(node_a, [slow_refresh], clock=clock)
        b = ExternalCalls(node_b, [slow_refresh], clock=clock)
        message = stored_message(node_a)
        assert await attempt(b, message, lambda: "ok") == "ok"  # B has read CLOSED (and keeps it for an hour)
        for _ in range(4):
            await attempt(a, message, fails)
        assert BreakerStore(node_b).get("HLR").state is BreakerState.OPEN  # type: ignore[union-attr]
        # B's next success does not re-read; a failure makes it read before its next call, which is then refused
        assert await attempt(b, message, fails) == "failed"
        assert await attempt(b, message, lambda: "ok") == "refused"
        # after open_wait both race for the one trial place: exactly one wins it
        clock.advance(timedelta(seconds=20))
        import asyncio

        gate, trial_running = asyncio.Event(), asyncio.Event()

        async def held() -> str:
            trial_running.set()  # A holds the trial place from here on
            await gate.wait()
            return "ok"

        first = asyncio.ensure_future(attempt(a, message, held))
        await asyncio.wait_for(trial_running.wait(), 10)
        assert await attempt(b, message, lambda: "ok") == "refused", "the trial place is taken by node A"
        gate.set()
        assert await first == "ok"
        assert BreakerStore(node_b).get("HLR").state is BreakerState.CLOSED  # type: ignore[union-attr]
        assert await attempt(b, message, lambda: "ok") == "ok"
    finally:
        node_a.dispose()
        node_b.dispose()


async def test_calls_are_recorded_masked_and_a_failure_to_record_never_fails_the_call(
    store: MessageStore, caplog: pytest.LogCaptureFixture
) -> None:
    calls = ExternalCalls(store, [HLR], clock=ManualClock(NOW))
    message = stored_message(store)
    assert await calls.guard("HLR", "activateSim", message, lambda: {"msisdn": "420777", "pin": "1234"}) \
        == {"msisdn": "420777", "pin": "1234"}
    await attempt(calls, message, fails, key="activateSim")
    await calls.guard("HLR", "lookup", message, lambda: "not recorded: the key does not match")
    records = CallRecordStore(store).of_message(message.id)
    assert [(r.call_key, r.outcome) for r in records] == [("activateSim", "OK"), ("activateSim", "FAILED")]
    assert records[0].response == '{"msisdn": "420777", "pin": "***"}'
    assert records[1].error == "ConnectionError: connection refused" and records[1].response is None
    assert all(r.message_id == message.id and r.started_at == NOW and r.duration_ms >= 0 for r in records)

    def broken(_record: Any, connection: Any = None) -> int:
        raise RuntimeError("disk full")

    calls.records.add = broken  # type: ignore[method-assign]
    caplog.set_level(logging.WARNING, "openroute.outbound")
    assert await calls.guard("HLR", "activateSim", message, lambda: "answer") == "answer"
    assert "was not recorded: RuntimeError: disk full" in caplog.text


async def test_a_record_handed_to_the_caller_s_writer_is_awaited_before_the_outcome_and_its_failure_logged(
    store: MessageStore, caplog: pytest.LogCaptureFixture
) -> None:
    calls = ExternalCalls(store, [HLR], clock=ManualClock(NOW))
    message = stored_message(store)
    handed: list[CallRecord] = []
    stored = asyncio.Event()

    async def record(call_record: CallRecord) -> None:
        await asyncio.sleep(0)  # the group commit's future settles later: the guard waits for it
        handed.append(call_record)
        stored.set()

    assert await calls.guard("HLR", "activateSim", message, lambda: {"pin": "1234"}, record=record) == {"pin": "1234"}
    assert stored.is_set(), "the record was stored before the call's result came back"
    assert [(r.message_id, r.call_key, r.outcome, r.response) for r in handed] == [
        (message.id, "activateSim", "OK", '{"pin": "***"}')]
    assert CallRecordStore(store).of_message(message.id) == [], "the guard wrote nothing itself"

    async def broken(_record: CallRecord) -> None:
        raise RuntimeError("writer closed")

    caplog.set_level(logging.WARNING, "openroute.outbound")
    assert await calls.guard("HLR", "activateSim", message, lambda: "answer", record=broken) == "answer"
    assert "was not recorded: RuntimeError: writer closed" in caplog.text


async def test_an_engine_writes_its_call_records_in_its_group_commit(store: MessageStore) -> None:
    from openroute.definitions.route import Route, RouteRegistry
    from openroute.engine import Engine, EngineSettings

    calls = ExternalCalls(store, [HLR], clock=ManualClock(NOW))

    def own_transaction(_record: Any, connection: Any = None) -> int:
        raise AssertionError("a node's call record has no transaction of its own")

    calls.records.add = own_transaction  # type: ignore[method-assign]

    async def activate(exchange: Any) -> None:
        await exchange.ext_call("activate", lambda: {"ok": True}, system="HLR")

    engine = Engine(store, RouteRegistry([Route("crm", "activate", [activate])]),
                    EngineSettings(repoll_interval=None, node_id="n1"), external_calls=calls)
    await engine.start()
    try:
        ids = [(await engine.accept(InboundMessage(
            service="crm", operation="activate", payload="{}", content_type="application/json",
            correlation_id=f"c-{n}", source_system="crm"))).message_id for n in range(5)]
        await engine.wait_idle(10)
    finally:
        await engine.stop()
    for message_id in ids:
        assert store.get(message_id).state is MessageState.OK  # type: ignore[union-attr]
        [record] = CallRecordStore(store).of_message(message_id)
        assert (record.call_key, record.outcome, record.response) == ("activate", "OK", '{"ok": true}')


def test_masking_covers_json_xml_and_form_fields() -> None:
    records = CallRecordSettings(enabled=True, secret_fields=("pin",))
    assert records.clean('{"a": {"PIN": 1, "x": [{"pin": "2"}]}}') == '{"a": {"PIN": "***", "x": [{"pin": "***"}]}}'
    assert records.clean("<s:Body><h:pin>1234</h:pin><pinCode>1</pinCode></s:Body>") \
        == "<s:Body><h:pin>***</h:pin><pinCode>1</pinCode></s:Body>"
    assert records.clean("GET /x?user=a&password=secret&y=1") == "GET /x?user=a&password=***&y=1"


async def test_an_open_breaker_parks_the_message_without_an_attempt_until_it_closes_and_retention_prunes(
    store: MessageStore,
) -> None:
    from openroute.definitions.route import Route, RouteRegistry
    from openroute.engine import Engine, EngineSettings

    clock = ManualClock(NOW)
    calls = ExternalCalls(store, [HLR], clock=clock)
    await calls.force("HLR", BreakerState.OPEN, "ops")
    reached: list[int] = []

    async def activate(exchange: Any) -> None:
        await exchange.ext_call("activate", lambda: reached.append(1), system="HLR")

    engine = Engine(store, RouteRegistry([Route("crm", "activate", [activate])]),
                    EngineSettings(repoll_interval=None, node_id="n1"), clock=clock, external_calls=calls)
    await engine.start()
    try:
        accepted = await engine.accept(InboundMessage(
            service="crm", operation="activate", payload="{}", content_type="application/json",
            correlation_id="c-9", source_system="crm"))
        await engine.wait_idle(10)
        row = store.get(accepted.message_id)
        assert row is not None and row.state is MessageState.POSTPONED and row.failed_count == 0
        assert row.last_error_code == "CIRCUIT_OPEN" and reached == []
        assert row.next_attempt_at is None and row.parked_on == "HLR", "parked on the system, not due by time"
        await calls.force("HLR", BreakerState.CLOSED, "ops")  # the close releases it at once: no repoll, no clock
        async with asyncio.timeout(10):
            while (row := store.get(accepted.message_id)) is not None and row.state is not MessageState.OK:
                await asyncio.sleep(0.01)
        assert row is not None and row.state is MessageState.OK and reached == [1] and row.parked_on is None
        # the call was recorded (HLR records "activate.*"); the retention job prunes it with its message
        assert [r.outcome for r in CallRecordStore(store).of_message(row.id)] == ["OK"]
        from openroute.runtime.retention import RetentionJob, RetentionPolicy

        job = RetentionJob(store, RetentionPolicy(keep={"OK": timedelta(0)}),
                           now=lambda: clock.now() + timedelta(seconds=1))
        assert job.run_once() == {MessageState.OK: 1}
        assert CallRecordStore(store).of_message(row.id) == [] and store.get(row.id) is None
    finally:
        await engine.stop()


async def test_a_closed_breaker_is_refreshed_in_the_background_once_for_concurrent_calls(store: MessageStore) -> None:
    """While calls succeed, the check of a call is a look at the cached row: when it is older than ``refresh`` one
    read starts in the background for all the calls of that moment, and none of them waits for it."""
    system = ExternalSystem("HLR", breaker=BreakerSettings(refresh=timedelta(milliseconds=1)))
    calls = ExternalCalls(store, [system], clock=ManualClock(NOW))
    message = stored_message(store)
    assert await attempt(calls, message, lambda: "ok") == "ok"  # the first call reads the row (none cached)
    reads: list[str] = []
    release = threading.Event()
    load = calls.breakers.load

    def held_load(name: str, now: datetime) -> Any:
        reads.append(name)
        release.wait(10)
        return load(name, now)

    calls.breakers.load = held_load  # type: ignore[method-assign]
    try:
        await asyncio.sleep(0.01)  # the cached row grows older than refresh (time passing: no event to await)
        answers = await asyncio.gather(*(attempt(calls, message, lambda: "ok") for _ in range(20)))
        assert answers == ["ok"] * 20  # by the cached row
        deadline = time.monotonic() + 10
        while not reads:  # the read they started in the background
            assert time.monotonic() < deadline, "no read of the breaker started"
            await asyncio.sleep(0.005)
        answers = await asyncio.gather(*(attempt(calls, message, lambda: "ok") for _ in range(20)))
        assert answers == ["ok"] * 20  # made while that read is held: they neither wait for it nor start another
        assert reads == ["HLR"]
    finally:
        release.set()
