"""The engine on each real database: accept, outcomes, retries by the policy, repoll, hooks, back-pressure."""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from datetime import timedelta
from typing import Any

import pytest
import sqlalchemy as sa
from openroute.persistence import MessageState, MessageStore, StoredMessage

from openroute import Exchange, Route, RouteRegistry
from openroute.definitions.clock import ManualClock
from openroute.definitions.errors import (
    BusinessError,
    ConfigurationError,
    DeploymentError,
    PayloadTooLargeError,
    TechnicalError,
    UnknownRouteError,
    ValidationError,
)
from openroute.definitions.message import InboundMessage
from openroute.definitions.retry import RetryPolicy
from openroute.engine import Engine, EngineSettings
from tests.lifecycle.conftest import START, EngineFactory, inbound

S = MessageState
WAIT = 20.0


def _route(*steps: Any, **extra: Any) -> Route:
    return Route("orders", "create", list(steps), **extra)


def _only(store: MessageStore) -> StoredMessage:
    rows = store.find()
    assert len(rows) == 1
    return rows[0]


async def _one_message(engine: Engine, store: MessageStore) -> StoredMessage:
    """Starts ``engine``, accepts one message, waits until the engine is idle and returns the only stored row."""
    await engine.start()
    await engine.accept(inbound())
    await engine.wait_idle(WAIT)
    return _only(store)


# -- accept ------------------------------------------------------------------------------------------
async def test_accept_stores_new_and_processes_to_ok(store: MessageStore, make_engine: EngineFactory) -> None:
    seen: list[str] = []
    engine = make_engine(_route(lambda ex: seen.append(ex.payload)))
    await engine.start()
    result = await engine.accept(inbound(headers={"x-trace": "t"}, object_id="42", entity_type="order",
                                         funnel_value="f", process_id="p"))
    assert result.duplicate is False and result.state is S.NEW and result.correlation_id == "c-1"
    await engine.wait_idle(WAIT)
    row = store.get(result.message_id)
    assert seen == ['{"order": 1}']
    assert row.state is S.OK and row.failed_count == 0 and row.node_id == "node-1"
    assert row.receive_ts == START and row.start_process_ts == START and row.headers == {"x-trace": "t"}
    assert (row.object_id, row.entity_type, row.funnel_value, row.process_id) == ("42", "order", "f", "p")
    assert row.version == 2  # NEW -> PROCESSING -> OK


async def test_duplicate_is_answered_not_stored(store: MessageStore, make_engine: EngineFactory) -> None:
    calls = Counter[int]()
    engine = make_engine(_route(lambda ex: calls.update([ex.message.id])))
    await engine.start()
    first = await engine.accept(inbound())
    await engine.wait_idle(WAIT)
    second = await engine.accept(inbound(payload="different"))
    await engine.wait_idle(WAIT)
    assert second.duplicate and second.message_id == first.message_id and second.state is S.OK
    assert _only(store).payload == '{"order": 1}'
    assert calls == {first.message_id: 1}


@pytest.mark.parametrize(
    ("overrides", "error"),
    [
        ({"service": "nope"}, UnknownRouteError),
        ({"operation": "delete"}, UnknownRouteError),
        ({"payload": "x" * 1001}, PayloadTooLargeError),
        ({"payload": "é" * 501}, PayloadTooLargeError),  # 1002 bytes in UTF-8
        ({"correlation_id": ""}, ValidationError),
        ({"source_system": "  "}, ValidationError),
        ({"correlation_id": "c" * 256}, ValidationError),
        ({"content_type": None}, ValidationError),
        ({"payload": b"bytes"}, ValidationError),
        ({"headers": {"h": 1}}, ValidationError),
        ({"message_timestamp": START.replace(tzinfo=None)}, ValidationError),
        ({"object_id": ""}, ValidationError),
        ({"payload": "refuse me"}, ValidationError),  # the route's validator
    ],
)
async def test_bad_input_is_refused_and_nothing_stored(
    store: MessageStore, make_engine: EngineFactory, overrides: dict[str, Any], error: type[Exception]
) -> None:
    def validator(message: InboundMessage) -> None:
        if message.payload == "refuse me":
            raise ValidationError("refused by the route")

    engine = make_engine(_route(lambda ex: None, validator=validator), max_payload_bytes=1000)
    await engine.start()
    with pytest.raises(error):
        await engine.accept(inbound(**overrides))
    assert store.find() == []
    ok = await engine.accept(inbound(payload="é" * 500))  # exactly at the limit
    assert not ok.duplicate


async def test_accept_without_start_stores_and_start_picks_it_up(
    store: MessageStore, make_engine: EngineFactory
) -> None:
    engine = make_engine(_route(lambda ex: None))
    result = await engine.accept(inbound())
    assert store.get(result.message_id).state is S.NEW
    await engine.start()
    await engine.wait_idle(WAIT)
    assert store.get(result.message_id).state is S.OK


# -- outcomes ----------------------------------------------------------------------------------------
async def test_retries_follow_the_policy_exactly(
    store: MessageStore, make_engine: EngineFactory, clock: ManualClock
) -> None:
    attempts: list[Any] = []

    def flaky(exchange: Exchange) -> None:
        attempts.append(clock.now())
        exchange.custom_data["attempt"] = exchange.custom_data.get("attempt", 0) + 1
        raise TechnicalError(f"remote down #{len(attempts)}", code="REMOTE_DOWN")

    policy = RetryPolicy(max_attempts=4, interval=timedelta(seconds=10), backoff=2, max_interval=timedelta(seconds=25))
    engine = make_engine(_route(flaky, retry_policy=policy))
    await engine.start()
    message_id = (await engine.accept(inbound())).message_id
    await engine.wait_idle(WAIT)
    expected_waits = [10, 20, 25]  # 10 * 2**(n-1), capped at 25
    for failures, wait in enumerate(expected_waits, start=1):
        row = store.get(message_id)
        assert row.state is S.PARTLY_FAILED and row.failed_count == failures
        assert row.next_attempt_at == clock.now() + timedelta(seconds=wait)
        assert row.last_error_code == "REMOTE_DOWN"
        assert row.last_error_text == f"TechnicalError: remote down #{failures}"
        assert row.custom_data == {"attempt": failures}, "custom data is kept between attempts"
        clock.advance(timedelta(seconds=wait) - timedelta(milliseconds=1))
        await engine.repoll_once()
        await engine.wait_idle(WAIT)
        assert len(attempts) == failures, "not due yet: nothing may run"
        clock.advance(timedelta(milliseconds=1))
        await engine.repoll_once()
        await engine.wait_idle(WAIT)
        assert len(attempts) == failures + 1
    row = store.get(message_id)
    assert row.state is S.FAILED and row.failed_count == 4 and row.next_attempt_at is None
    assert [(a - START).total_seconds() for a in attempts] == [0, 10, 30, 55]
    clock.advance(timedelta(hours=1))
    await engine.repoll_once()
    await engine.wait_idle(WAIT)
    assert len(attempts) == 4


async def test_default_policy_applies_to_routes_without_one(
    store: MessageStore, make_engine: EngineFactory
) -> None:
    def broken(exchange: Exchange) -> None:
        raise ConnectionError("refused")

    engine = make_engine(_route(broken), default_retry_policy=RetryPolicy(max_attempts=1))
    row = await _one_message(engine, store)
    assert row.state is S.FAILED and row.failed_count == 1
    assert row.last_error_code == "ConnectionError" and row.last_error_text == "ConnectionError: refused"


async def test_business_error_fails_at_once_and_keeps_the_errors(
    store: MessageStore, make_engine: EngineFactory
) -> None:
    def check(exchange: Exchange) -> None:
        exchange.add_business_error("WARN", "address incomplete")
        raise BusinessError("CREDIT_LIMIT", "credit limit exceeded")

    engine = make_engine(_route(check))
    row = await _one_message(engine, store)
    assert row.state is S.FAILED and row.failed_count == 0
    assert row.business_errors == [{"code": "WARN", "text": "address incomplete"},
                                   {"code": "CREDIT_LIMIT", "text": "credit limit exceeded"}]
    assert (row.last_error_code, row.last_error_text) == ("CREDIT_LIMIT", "credit limit exceeded")


async def test_validation_error_in_a_step_fails_at_once(store: MessageStore, make_engine: EngineFactory) -> None:
    def check(exchange: Exchange) -> None:
        raise ValidationError("order number missing")

    engine = make_engine(_route(check))
    row = await _one_message(engine, store)
    assert row.state is S.FAILED and row.failed_count == 0 and row.last_error_code == "VALIDATION_ERROR"


async def test_no_effect_run_changes_no_counter(
    store: MessageStore, make_engine: EngineFactory, clock: ManualClock
) -> None:
    runs = []

    def nothing_done(exchange: Exchange) -> None:
        runs.append(1)
        exchange.no_effect = True
        raise TechnicalError("remote refused before doing anything")

    policy = RetryPolicy(max_attempts=1, interval=timedelta(seconds=5))
    engine = make_engine(_route(nothing_done, retry_policy=policy))
    await engine.start()
    await engine.accept(inbound())
    await engine.wait_idle(WAIT)
    for _ in range(3):
        row = _only(store)
        assert row.state is S.PARTLY_FAILED and row.failed_count == 0
        assert row.next_attempt_at == clock.now() + timedelta(seconds=5)
        clock.advance(timedelta(seconds=5))
        await engine.repoll_once()
        await engine.wait_idle(WAIT)
    assert len(runs) == 4


async def test_postpone_and_async_steps(store: MessageStore, make_engine: EngineFactory, clock: ManualClock) -> None:
    async def maybe_later(exchange: Exchange) -> str:
        await asyncio.sleep(0)
        if not exchange.custom_data.get("waited"):
            exchange.custom_data["waited"] = True
            exchange.postpone(timedelta(seconds=30))
        return "done"

    engine = make_engine(_route(maybe_later))
    row = await _one_message(engine, store)
    assert row.state is S.POSTPONED and row.failed_count == 0
    assert row.next_attempt_at == START + timedelta(seconds=30)
    clock.advance(timedelta(seconds=30))
    await engine.repoll_once()
    await engine.wait_idle(WAIT)
    assert _only(store).state is S.OK


async def test_final_state_hooks_run_once_per_message(store: MessageStore, make_engine: EngineFactory) -> None:
    seen: list[tuple[int, MessageState]] = []
    in_transaction: list[int] = []

    async def hook(message: StoredMessage) -> None:
        seen.append((message.id, message.state))

    def tx_hook(message: StoredMessage, connection: sa.Connection) -> None:
        # runs inside the final transaction: it sees the new state
        state = connection.execute(sa.text("select state from message where id = :i"), {"i": message.id}).scalar()
        assert state == message.state.value
        in_transaction.append(message.id)

    def step(exchange: Exchange) -> None:
        if exchange.payload == "bad":
            raise BusinessError("B", "bad")

    engine = make_engine(_route(step))
    engine.on_final_state(hook)
    engine.on_final_state_in_transaction(tx_hook)
    await engine.start()
    good = await engine.accept(inbound("good"))
    bad = await engine.accept(inbound("bad", payload="bad"))
    await engine.wait_idle(WAIT)
    assert sorted(seen) == sorted([(good.message_id, S.OK), (bad.message_id, S.FAILED)])
    assert sorted(in_transaction) == sorted([good.message_id, bad.message_id])


async def test_failing_transaction_hook_rolls_back_the_final_state(
    store: MessageStore, make_engine: EngineFactory
) -> None:
    def tx_hook(message: StoredMessage, connection: sa.Connection) -> None:
        raise RuntimeError("confirmation table unavailable")

    engine = make_engine(_route(lambda ex: None))
    engine.on_final_state_in_transaction(tx_hook)
    # never half-written: the message stays PROCESSING and the lease repair will retry it
    assert (await _one_message(engine, store)).state is S.PROCESSING


async def test_non_json_custom_data_fails_the_message(store: MessageStore, make_engine: EngineFactory) -> None:
    def step(exchange: Exchange) -> None:
        exchange.custom_data["when"] = object()

    engine = make_engine(_route(step))
    row = await _one_message(engine, store)
    assert row.state is S.FAILED and row.custom_data == {} and "not JSON" in row.last_error_text


# -- repoll ------------------------------------------------------------------------------------------
async def test_processing_past_the_lease_is_repaired(
    store: MessageStore, make_engine: EngineFactory, clock: ManualClock
) -> None:
    from openroute.engine import states

    engine = make_engine(_route(lambda ex: None), processing_lease=timedelta(minutes=5))
    message = store.insert_message(_new_message("dead-node")).message
    [claimed] = states.claim(store, [message], "dead-node", clock.now())
    await engine.start()
    await engine.repoll_once()
    assert store.get(message.id).state is S.PROCESSING, "inside the lease nothing happens"
    clock.advance(timedelta(minutes=5))
    await engine.repoll_once()
    await engine.wait_idle(WAIT)
    row = store.get(message.id)
    # OK has no current error: the abandoned attempt stays in the history only (issue 26)
    assert row.state is S.OK and row.failed_count == 1 and row.last_error_code is None
    assert [t["error_code"] for t in store.transitions.of(message.id)].count("PROCESSING_ABANDONED") == 1
    assert row.node_id == "node-1" and claimed.node_id == "dead-node"


async def test_restarted_node_recovers_its_own_processing_messages(
    store: MessageStore, make_engine: EngineFactory
) -> None:
    from openroute.engine import states

    message = store.insert_message(_new_message("mine")).message
    states.claim(store, [message], "node-1", START)
    other = store.insert_message(_new_message("theirs")).message
    states.claim(store, [other], "node-9", START)
    engine = make_engine(_route(lambda ex: None))
    await engine.start()
    await engine.wait_idle(WAIT)
    assert store.get(message.id).state is S.OK
    assert store.get(other.id).state is S.PROCESSING, "another live node's message is left alone"


async def test_new_message_nobody_queued_is_picked_up(
    store: MessageStore, make_engine: EngineFactory, clock: ManualClock
) -> None:
    engine = make_engine(_route(lambda ex: None), new_pickup_age=timedelta(minutes=1))
    await engine.start()
    # stored by a node that crashed between commit and emit
    message = store.insert_message(_new_message("orphan")).message
    await engine.repoll_once()
    assert store.get(message.id).state is S.NEW
    clock.advance(timedelta(minutes=1))
    await engine.repoll_once()
    await engine.wait_idle(WAIT)
    assert store.get(message.id).state is S.OK


async def test_repoll_job_runs_on_its_schedule(store: MessageStore, make_engine: EngineFactory) -> None:
    done = asyncio.Event()
    engine = make_engine(_route(lambda ex: done.set()), repoll_interval=timedelta(milliseconds=50),
                         new_pickup_age=timedelta(0))
    await engine.start()
    store.insert_message(_new_message("late"))
    await asyncio.wait_for(done.wait(), WAIT)
    await engine.wait_idle(WAIT)
    assert _only(store).state is S.OK


async def test_stop_ends_a_hanging_repoll_run_quietly(
    store: MessageStore, make_engine: EngineFactory, caplog: pytest.LogCaptureFixture
) -> None:
    """A repoll run still in progress when the node stops gets ``stop_timeout``, then the stop cancels it, quietly:
    APScheduler's shutdown cancelled it at once and logged that as the job's error, with a traceback."""
    started, cancelled = asyncio.Event(), asyncio.Event()

    async def hanging_run() -> None:
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise

    engine = make_engine(_route(lambda ex: None), repoll_interval=timedelta(milliseconds=20), stop_timeout=0.05)
    engine._repoll._repoll_job = hanging_run  # type: ignore[method-assign]
    await engine.start()
    await asyncio.wait_for(started.wait(), WAIT)
    await asyncio.wait_for(engine.stop(), WAIT)
    assert not [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]
    assert cancelled.is_set(), "the run was left to the event loop's end"
    assert not engine._repoll._runs


async def test_stop_lets_a_repoll_run_in_progress_finish(store: MessageStore, make_engine: EngineFactory) -> None:
    started, release, finished = asyncio.Event(), asyncio.Event(), asyncio.Event()

    async def slow_run() -> None:
        started.set()
        await release.wait()
        finished.set()

    engine = make_engine(_route(lambda ex: None), repoll_interval=timedelta(milliseconds=20), stop_timeout=WAIT)
    engine._repoll._repoll_job = slow_run  # type: ignore[method-assign]
    await engine.start()
    await asyncio.wait_for(started.wait(), WAIT)
    stopping = asyncio.create_task(engine.stop())
    await asyncio.sleep(0)  # one loop turn: the stop has shut the scheduler down and waits for the run
    assert not stopping.done()
    release.set()
    await asyncio.wait_for(stopping, WAIT)
    assert finished.is_set()


# -- back-pressure -----------------------------------------------------------------------------------
async def test_messages_in_flight_are_bounded_and_accepting_never_waits_for_room(
    store: MessageStore, make_engine: EngineFactory
) -> None:
    """The bound (queue_size + concurrency) holds what is queued and in flight; an accept that finds no room does not
    wait: its message stays NEW in the store and the feeder queues it once room frees (no repoll runs here)."""
    release = asyncio.Event()
    running = 0
    peak = 0

    async def slow(exchange: Exchange) -> None:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await release.wait()
        running -= 1

    engine = make_engine(_route(slow), concurrency=3, queue_size=4)
    await engine.start()
    accepted = await asyncio.wait_for(asyncio.gather(*(engine.accept(inbound(f"m-{i}")) for i in range(12))), WAIT)
    assert len({a.message_id for a in accepted}) == 12, "every accept returned while the queue was full"
    await _until(lambda: running == 3)  # the three in flight reach the step once their claims commit
    assert (engine.in_flight, engine.queued) == (3, 4)
    # the 4 queued were claimed at their accept (room in the bound); the 5 beyond the bound wait in the store
    assert store.count_by_state() == {S.PROCESSING: 7, S.NEW: 5}, "the 5 beyond the bound wait in the store"
    release.set()
    await _until(lambda: store.count_by_state() == {S.OK: 12})
    await engine.wait_idle(WAIT)
    assert peak == 3


async def test_stop_leaves_queued_messages_to_the_store(store: MessageStore, make_engine: EngineFactory) -> None:
    gate = asyncio.Event()

    async def slow(exchange: Exchange) -> None:
        await gate.wait()

    engine = make_engine(_route(slow), concurrency=1, queue_size=10, stop_timeout=0.5)
    await engine.start()
    for i in range(3):
        await engine.accept(inbound(f"s-{i}"))
    await engine.stop()
    counts = store.count_by_state()
    # the one in flight was cancelled (PROCESSING, repaired by the next start); the queued ones, claimed at their
    # accept, were given back: POSTPONED, due at once for any node
    assert counts == {S.PROCESSING: 1, S.POSTPONED: 2}
    again = make_engine(_route(lambda ex: None), concurrency=1, node_id=engine.node_id)
    await again.start()
    await again.wait_idle(WAIT)
    assert store.count_by_state() == {S.OK: 3}


async def test_a_worker_takes_its_next_message_while_the_outcome_is_written(
    store: MessageStore, make_engine: EngineFactory
) -> None:
    """The outcome's commit and final hooks finish in the background: slow final-state hooks do not hold the only
    worker, but each message keeps its room in the bound (queue_size + concurrency = 2) until its hook is done."""
    steps: list[str] = []
    gate = asyncio.Event()
    hooked: list[str] = []

    async def hook(message: StoredMessage) -> None:
        hooked.append(message.correlation_id)
        await gate.wait()

    engine = make_engine(_route(lambda ex: steps.append(ex.message.correlation_id)), concurrency=1, queue_size=1)
    engine.on_final_state(hook)
    await engine.start()
    await engine.accept(inbound("b-0"))
    await engine.accept(inbound("b-1"))
    await _until(lambda: hooked == ["b-0", "b-1"])  # b-1 ran on the one worker while b-0's hook waits
    assert steps == ["b-0", "b-1"] and engine.in_flight == 0
    assert store.count_by_state() == {S.OK: 2}
    third = await engine.accept(inbound("b-2"))  # no room: it waits in the store, the accept does not
    for _ in range(20):
        await asyncio.sleep(0)
    assert store.get(third.message_id).state is S.NEW, "both rooms are held until the hooks return"  # type: ignore[union-attr]
    with pytest.raises(TimeoutError):
        await engine.wait_idle(0.05)
    gate.set()
    await _until(lambda: store.count_by_state() == {S.OK: 3})  # the feeder queued it once a room was free
    await engine.wait_idle(WAIT)
    assert hooked == ["b-0", "b-1", "b-2"]


async def test_stop_waits_for_outcomes_written_in_the_background(
    store: MessageStore, make_engine: EngineFactory
) -> None:
    gate = asyncio.Event()
    done: list[str] = []

    async def hook(message: StoredMessage) -> None:
        await gate.wait()
        done.append(message.correlation_id)

    engine = make_engine(_route(lambda ex: None), concurrency=2)
    engine.on_final_state(hook)
    await engine.start()
    await engine.accept(inbound("w-0"))
    await _until(lambda: store.count_by_state() == {S.OK: 1})
    stopping = asyncio.create_task(engine.stop())
    for _ in range(20):
        await asyncio.sleep(0)
    assert not stopping.done(), "stop waits for the hook of an outcome written in the background"
    gate.set()
    await asyncio.wait_for(stopping, WAIT)
    assert done == ["w-0"]


def test_bad_settings_and_routes_are_refused() -> None:
    with pytest.raises(ConfigurationError):
        EngineSettings(concurrency=0)
    with pytest.raises(ConfigurationError):
        EngineSettings(processing_lease=timedelta(seconds=-1))
    with pytest.raises(ConfigurationError):
        EngineSettings(repoll_interval=timedelta(0))
    with pytest.raises(ConfigurationError):
        Route("s", "o", [])
    with pytest.raises(ConfigurationError):
        Route("s", "o", ["not callable"])
    with pytest.raises(ConfigurationError):
        Route("", "o", [print])
    registry = RouteRegistry([Route("s", "o", [print])])
    with pytest.raises(DeploymentError, match="s/o is already registered"):
        registry.register(Route("s", "o", [print]))
    with pytest.raises(DeploymentError, match="splits into s/missing, which has no route"):
        Engine("sqlite:///unused.db", RouteRegistry([Route("s", "p", [print], child_routes=(("s", "missing"),))]))
    with pytest.raises(UnknownRouteError):
        registry.get("s", "x")
    with pytest.raises(ConfigurationError):
        Engine("sqlite:///unused.db", routes={})  # type: ignore[arg-type]


async def _until(condition: Any, timeout: float = WAIT) -> None:
    """Bounded poll for a condition that has no event (rows written by the engine's writer thread)."""
    async with asyncio.timeout(timeout):
        while not condition():
            await asyncio.sleep(0.01)


def _new_message(key: str) -> Any:
    from openroute.persistence import NewMessage

    return NewMessage(service="orders", operation="create", payload="p", content_type="text/plain",
                      correlation_id=key, source_system="crm", receive_ts=START)


# -- external calls ----------------------------------------------------------------------------------
async def test_call_once_is_skipped_on_later_attempts(
    store: MessageStore, make_engine: EngineFactory, clock: ManualClock
) -> None:
    remote: list[str] = []

    async def charge() -> dict[str, str]:
        remote.append("charge")
        return {"receipt": "r-1"}

    def flaky_notify() -> None:
        remote.append("notify")
        if remote.count("notify") == 1:
            raise TechnicalError("mail server down")

    async def step(exchange: Exchange) -> None:
        receipt = await exchange.call_once("charge", charge)
        exchange.custom_data["receipt"] = receipt["receipt"]
        await exchange.call_once("notify", flaky_notify)

    policy = RetryPolicy(interval=timedelta(seconds=1))
    engine = make_engine(_route(step, retry_policy=policy))
    await engine.start()
    message_id = (await engine.accept(inbound())).message_id
    await engine.wait_idle(WAIT)
    assert store.get(message_id).state is S.PARTLY_FAILED
    notify = store.calls.get(message_id, "notify")
    assert notify is not None and notify.status.value == "FAILED" and "mail server down" in notify.last_error
    clock.advance(timedelta(seconds=1))
    await engine.repoll_once()
    await engine.wait_idle(WAIT)
    row = store.get(message_id)
    assert row.state is S.OK and row.custom_data == {"receipt": "r-1"}
    assert remote == ["charge", "notify", "notify"], "the successful charge was not repeated"
    assert store.calls.get(message_id, "notify").attempts == 2


async def test_call_once_needs_a_usable_key(store: MessageStore, make_engine: EngineFactory) -> None:
    async def step(exchange: Exchange) -> None:
        await exchange.call_once("", lambda: None)

    engine = make_engine(_route(step), default_retry_policy=RetryPolicy(max_attempts=1))
    row = await _one_message(engine, store)
    assert row.state is S.FAILED and row.last_error_code == "ValueError" and "call key" in row.last_error_text


# -- operator actions --------------------------------------------------------------------------------
async def test_cancel_and_restart(store: MessageStore, make_engine: EngineFactory) -> None:
    from openroute.definitions.errors import IllegalTransitionError

    finals: list[MessageState] = []

    async def hook(message: StoredMessage) -> None:
        finals.append(message.state)

    def step(exchange: Exchange) -> None:
        if exchange.payload == "fail" and not exchange.custom_data.get("restarted"):
            exchange.custom_data["restarted"] = True
            raise ValidationError("bad")

    engine = make_engine(_route(step))
    engine.on_final_state(hook)
    waiting = (await engine.accept(inbound("waiting"))).message_id  # not started: stays NEW
    cancelled = await engine.cancel(waiting)
    assert cancelled.state is S.CANCEL and store.get(waiting) == cancelled
    with pytest.raises(IllegalTransitionError):
        await engine.cancel(waiting)
    with pytest.raises(LookupError):
        await engine.cancel(999_999)
    await engine.start()
    failing = (await engine.accept(inbound("f", payload="fail"))).message_id
    await engine.wait_idle(WAIT)
    assert store.get(failing).state is S.FAILED
    restarted = await engine.restart(failing)
    assert restarted.state is S.PARTLY_FAILED and restarted.failed_count == 0
    await engine.wait_idle(WAIT)
    assert store.get(failing).state is S.OK
    with pytest.raises(IllegalTransitionError):
        await engine.restart(failing)
    revived = await engine.restart(waiting)  # a cancelled message can be restarted too
    assert revived.state is S.PARTLY_FAILED and revived.failed_count == 0
    await engine.wait_idle(WAIT)
    assert store.get(waiting).state is S.OK
    assert finals == [S.CANCEL, S.FAILED, S.OK, S.OK]


async def test_a_stopped_engine_does_not_start_again(make_engine: EngineFactory) -> None:
    engine = make_engine(_route(lambda ex: None))
    await engine.start()
    await engine.stop()
    with pytest.raises(RuntimeError, match="starts once"):
        await engine.start()
