"""Persisted confirmations on the real store (SQLite and PostgreSQL) with a real local SOAP receiver."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import sqlalchemy as sa
from openroute.confirmation import (
    ConfirmationCallback,
    ConfirmationPolicy,
    ConfirmationRequest,
    ConfirmationSendError,
    ConfirmationService,
    DefaultConfirmationCallback,
    DelegateConfirmationCallback,
    ExternalSystemConfirmation,
    HttpJsonConfirmation,
    InvalidConfirmationError,
    SoapConfirmation,
)
from openroute.persistence import MessageState, MessageStore, NewMessage, confirmation_table

from tests.confirmation.receiver import Receiver

START = datetime(2024, 6, 1, 12, 0, tzinfo=UTC)


class FakeClock:
    """Time the tests move by hand (no sleeping)."""

    def __init__(self, now: datetime = START) -> None:
        self.current = now

    def now(self) -> datetime:
        return self.current

    def advance(self, seconds: float) -> None:
        self.current += timedelta(seconds=seconds)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
async def soap(receiver: Receiver) -> AsyncIterator[DelegateConfirmationCallback]:
    callback = DelegateConfirmationCallback([SoapConfirmation("CRM", receiver.url + "/soap", timeout=5)])
    yield callback
    await callback.aclose()


def add_message(
    store: MessageStore,
    n: int,
    state: MessageState = MessageState.OK,
    source_system: str = "CRM",
    **changes: object,
) -> int:
    """A stored message that has reached ``state``."""
    outcome = store.insert_message(
        NewMessage(
            service="customer",
            operation="create",
            payload="{}",
            content_type="application/json",
            correlation_id=f"corr-{n}",
            source_system=source_system,
            receive_ts=START,
            process_id=f"proc-{n}",
        )
    )
    message_id = outcome.message.id
    if state is not MessageState.NEW:
        assert store.transitions.apply((message_id, 0, MessageState.NEW, state, START, changes))
    return message_id


def request_for(message_id: int, state: str = "OK", source_system: str = "CRM") -> ConfirmationRequest:
    return ConfirmationRequest(
        message_id=message_id, correlation_id=f"c-{message_id}", source_system=source_system, state=state
    )


class Durable(ConfirmationCallback):
    """A callback whose confirmations keep their rows and always arrive (the rows' own mechanics)."""

    def __init__(self) -> None:
        self.sent: list[int | str] = []

    async def confirm(self, request: ConfirmationRequest) -> None:
        self.sent.append(request.message_id)


def accepted_ids(receiver: Receiver) -> list[str]:
    return sorted(str(r["messageId"]) for r in receiver.snapshot())


async def test_enqueue_persists_pending_once(store: MessageStore, clock: FakeClock) -> None:
    service = ConfirmationService(store, Durable(), clock=clock)
    mid = add_message(store, 1, MessageState.FAILED)
    assert await service.enqueue(request_for(mid, "FAILED")) is True
    assert await service.enqueue(request_for(mid, "FAILED")) is False  # idempotent per message
    info = await service.get(mid)
    assert info is not None
    assert (info.status, info.outcome_state, info.attempts, info.source_system) == ("PENDING", "FAILED", 0, "CRM")
    assert info.next_attempt_at == START and info.sent_at is None
    assert await service.counts() == {"PENDING": 1, "SENT": 0, "FAILED": 0}


async def test_enqueue_in_joins_the_callers_transaction(store: MessageStore, clock: FakeClock) -> None:
    service = ConfirmationService(store, Durable(), clock=clock)
    mid = add_message(store, 1, MessageState.PROCESSING)
    with pytest.raises(RuntimeError), store.begin() as connection:
        assert store.transitions.apply((mid, 1, MessageState.PROCESSING, MessageState.OK, START, {}), connection)
        assert service.enqueue_in(request_for(mid), connection) is True
        raise RuntimeError("the final-state commit fails")
    assert await service.get(mid) is None  # rolled back together with the final state
    with store.begin() as connection:
        assert store.transitions.apply((mid, 1, MessageState.PROCESSING, MessageState.OK, START, {}), connection)
        assert service.enqueue_in(request_for(mid), connection) is True
    assert (await service.get(mid)).status == "PENDING"  # type: ignore[union-attr]


async def test_enqueue_rejects_bad_input(store: MessageStore, clock: FakeClock) -> None:
    service = ConfirmationService(store, Durable(), clock=clock)
    with pytest.raises(InvalidConfirmationError, match="not in the store"):
        await service.enqueue(request_for(424242))
    with pytest.raises(InvalidConfirmationError, match="positive integer"):
        await service.enqueue(request_for("abc"))  # type: ignore[arg-type]
    with pytest.raises(InvalidConfirmationError, match="ConfirmationRequest"):
        await service.enqueue({"message_id": 1})  # type: ignore[arg-type]
    assert await service.counts() == {"PENDING": 0, "SENT": 0, "FAILED": 0}


async def test_unconfirmed_source_system_gets_no_row(
    store: MessageStore, clock: FakeClock, soap: DelegateConfirmationCallback
) -> None:
    service = ConfirmationService(store, soap, clock=clock)
    mid = add_message(store, 1, source_system="BILLING")
    assert await service.enqueue(request_for(mid, source_system="BILLING")) is False
    assert await service.sweep_missing() == 0
    assert await service.get(mid) is None


async def test_confirmations_arrive_exactly_once_despite_failures(
    store: MessageStore, clock: FakeClock, soap: DelegateConfirmationCallback, receiver: Receiver
) -> None:
    receiver.reset(fail_first=3, failure="fault")
    policy = ConfirmationPolicy(max_attempts=5, interval=10, backoff=2, max_interval=60)
    service = ConfirmationService(store, soap, policy, clock=clock)
    ids = [add_message(store, n, state) for n, state in enumerate([MessageState.OK, MessageState.FAILED,
                                                                  MessageState.CANCEL, MessageState.OK])]
    for mid, state in zip(ids, ["OK", "FAILED", "CANCEL", "OK"], strict=True):
        assert await service.enqueue(request_for(mid, state))

    first = await service.process_due()
    assert (first.sent, first.retry_scheduled, first.given_up) == (1, 3, 0)
    assert await service.process_due() == type(first)()  # nothing due until the interval has passed
    clock.advance(10)
    second = await service.process_due()
    assert (second.sent, second.retry_scheduled) == (3, 0)
    for _ in range(3):  # later passes, much later: nothing is ever sent again
        clock.advance(3600)
        assert (await service.process_due()).attempted == 0

    assert accepted_ids(receiver) == sorted(str(i) for i in ids)  # each exactly once
    assert receiver.requests == len(ids) + 3
    infos = [await service.get(mid) for mid in ids]
    assert all(i is not None and i.status == "SENT" and i.sent_at is not None for i in infos)
    assert sorted(i.attempts for i in infos) == [1, 2, 2, 2]  # type: ignore[union-attr]
    retried = [i for i in infos if i.attempts == 2]  # type: ignore[union-attr]
    assert all("receiver is down" in (i.last_error or "") for i in retried)  # type: ignore[union-attr]
    states = {r["messageId"]: r["state"] for r in receiver.snapshot()}
    assert [states[m] for m in ids] == ["OK", "FAILED", "CANCEL", "OK"]


@pytest.mark.parametrize("failure", ["fault", "http500"])
async def test_backoff_cap_and_final_failure_visible(
    store: MessageStore, clock: FakeClock, soap: DelegateConfirmationCallback, receiver: Receiver, failure: str
) -> None:
    receiver.reset(fail_first=3, failure=failure)
    policy = ConfirmationPolicy(max_attempts=3, interval=10, backoff=2, max_interval=15)
    service = ConfirmationService(store, soap, policy, clock=clock)
    mid = add_message(store, 1, MessageState.FAILED)
    await service.enqueue(request_for(mid, "FAILED"))

    await service.process_due()
    info = await service.get(mid)
    assert info and (info.attempts, info.next_attempt_at) == (1, START + timedelta(seconds=10))
    clock.advance(9)
    assert (await service.process_due()).attempted == 0 and receiver.requests == 1
    clock.advance(1)
    await service.process_due()
    info = await service.get(mid)
    assert info and (info.attempts, info.next_attempt_at) == (2, clock.now() + timedelta(seconds=15))  # capped
    clock.advance(15)
    report = await service.process_due()
    assert report.given_up == 1
    info = await service.get(mid)
    assert info and info.status == "FAILED" and info.attempts == 3
    assert ("SOAP Fault" if failure == "fault" else "HTTP 500") in (info.last_error or "")
    assert [f.message_id for f in await service.failed()] == [mid]
    assert await service.counts() == {"PENDING": 0, "SENT": 0, "FAILED": 1}
    clock.advance(86400)
    assert (await service.process_due()).attempted == 0 and receiver.requests == 3  # given up: not sent

    assert await service.retry([mid]) == 1  # operator action
    assert (await service.process_due()).sent == 1
    assert await service.retry([mid]) == 0  # SENT is never reset
    assert accepted_ids(receiver) == [str(mid)]


async def test_request_is_rebuilt_from_the_message(
    store: MessageStore, clock: FakeClock, soap: DelegateConfirmationCallback, receiver: Receiver
) -> None:
    service = ConfirmationService(store, soap, clock=clock)
    mid = add_message(
        store, 1, MessageState.FAILED,
        business_errors=[{"code": "E7", "text": "credit limit"}],
        last_error_code="BUSINESS", last_error_text="rejected",
    )
    await service.enqueue(request_for(mid, "FAILED"))
    assert (await service.process_due()).sent == 1
    [got] = receiver.snapshot()
    assert (got["correlationId"], got["processId"], got["service"], got["operation"]) == (
        "corr-1", "proc-1", "customer", "create")
    assert got["businessErrors"] == [{"code": "E7", "text": "credit limit"}]
    assert (got["errorCode"], got["errorText"], got["state"]) == ("BUSINESS", "rejected", "FAILED")


class Broken(ExternalSystemConfirmation):
    async def confirm(self, request: ConfirmationRequest) -> None:
        raise RuntimeError("bug in the callback")


async def test_a_callback_that_raises_for_every_message_logs_one_traceback(
    store: MessageStore, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    """A bug in a callback fails every confirmation the same way: each is a failed attempt with its cause, and the
    log has the traceback once, then a line per confirmation."""
    from openroute.runtime.logs import RepeatedErrors

    class BrokenCallback(ConfirmationCallback):
        async def confirm(self, request: ConfirmationRequest) -> None:
            raise RuntimeError("bug in the callback")

    service = ConfirmationService(store, BrokenCallback(), ConfirmationPolicy(max_attempts=3, interval=10), clock=clock,
                                  error_log=RepeatedErrors())  # as the composition root gives it
    ids = [add_message(store, n) for n in range(3)]
    for mid in ids:
        await service.enqueue(request_for(mid))
    with caplog.at_level(logging.ERROR, logger="openroute.confirmation"):
        report = await service.process_due()
    assert report.retry_scheduled == 3
    for mid in ids:
        assert "RuntimeError: bug in the callback" in ((await service.get(mid)).last_error or "")  # type: ignore[union-attr]
    raised = [r for r in caplog.records if "confirmation callback raised" in r.getMessage()]
    assert [r.exc_info is not None for r in raised] == [True, False, False]


class Hung(ExternalSystemConfirmation):
    def __init__(self, source_system: str) -> None:
        super().__init__(source_system)
        self.entered = asyncio.Event()

    async def confirm(self, request: ConfirmationRequest) -> None:
        self.entered.set()
        await asyncio.Event().wait()  # never answers


async def test_a_failing_or_hung_system_never_blocks_the_others(
    store: MessageStore, clock: FakeClock, receiver: Receiver
) -> None:
    hung = Hung("SLOW")
    callback = DelegateConfirmationCallback(
        [Broken("BROKEN"), hung, HttpJsonConfirmation("CRM", receiver.url + "/json")]
    )
    policy = ConfirmationPolicy(max_attempts=3, interval=10, claim_timeout=0.5)
    service = ConfirmationService(store, callback, policy, clock=clock, concurrency=2, send_timeout=0.5)
    ids = {system: add_message(store, n, source_system=system)
           for n, system in enumerate(["SLOW", "BROKEN", "CRM", "CRM2"])}
    for system, mid in ids.items():
        await service.enqueue(request_for(mid, source_system=system))
    try:
        report = await asyncio.wait_for(service.process_due(), 10)
    finally:
        await callback.aclose()
    assert hung.entered.is_set()
    assert (report.sent, report.retry_scheduled) == (1, 2)
    assert accepted_ids(receiver) == [str(ids["CRM"])]
    assert "RuntimeError: bug in the callback" in ((await service.get(ids["BROKEN"])).last_error or "")  # type: ignore[union-attr]
    assert "send timeout" in ((await service.get(ids["SLOW"])).last_error or "")  # type: ignore[union-attr]
    assert await service.get(ids["CRM2"]) is None  # no confirmation registered for CRM2


async def test_two_nodes_never_send_one_confirmation_twice(
    store: MessageStore, clock: FakeClock, receiver: Receiver
) -> None:
    callbacks = [DelegateConfirmationCallback([SoapConfirmation("CRM", receiver.url + "/soap")]) for _ in range(2)]
    second_store = MessageStore(store.url)  # another node: its own engine and connections
    nodes = [
        ConfirmationService(store, callbacks[0], clock=clock, batch_size=7, concurrency=4),
        ConfirmationService(second_store, callbacks[1], clock=clock, batch_size=5, concurrency=4),
    ]
    ids = [add_message(store, n) for n in range(30)]
    for mid in ids:
        await nodes[0].enqueue(request_for(mid))
    try:
        reports = await asyncio.wait_for(asyncio.gather(*(n.process_due() for n in nodes)), 60)
    finally:
        for callback in callbacks:
            await callback.aclose()
        second_store.dispose()
    assert sum(r.sent for r in reports) == len(ids)
    assert accepted_ids(receiver) == sorted(str(i) for i in ids)
    assert receiver.requests == len(ids)
    assert await nodes[0].counts() == {"PENDING": 0, "SENT": len(ids), "FAILED": 0}


class Gate(ConfirmationCallback):
    """Blocks every send until opened; records what was sent."""

    def __init__(self) -> None:
        self.entered = asyncio.Event()
        self.open = asyncio.Event()
        self.sent: list[int | str] = []

    async def confirm(self, request: ConfirmationRequest) -> None:
        self.entered.set()
        await self.open.wait()
        self.sent.append(request.message_id)


async def test_a_claim_of_a_dead_node_expires_and_the_confirmation_is_not_lost(
    store: MessageStore, clock: FakeClock
) -> None:
    policy = ConfirmationPolicy(claim_timeout=60)
    dying = Gate()
    node_a = ConfirmationService(store, dying, policy, clock=clock)
    mid = add_message(store, 1)
    await node_a.enqueue(request_for(mid))
    task = asyncio.create_task(node_a.process_due())
    await asyncio.wait_for(dying.entered.wait(), 10)
    task.cancel()  # node A dies while sending
    with pytest.raises(asyncio.CancelledError):
        await task

    survivor = Gate()
    survivor.open.set()
    node_b = ConfirmationService(store, survivor, policy, clock=clock)
    assert (await node_b.process_due()).attempted == 0  # still claimed by A
    clock.advance(60)
    assert (await node_b.process_due()).sent == 1
    assert survivor.sent == [mid] and dying.sent == []
    info = await node_b.get(mid)
    assert info and info.status == "SENT" and info.attempts == 2


async def test_sweep_creates_only_the_missing_confirmations(store: MessageStore, clock: FakeClock) -> None:
    service = ConfirmationService(store, Durable(), clock=clock)
    final = {state: add_message(store, n, state)
             for n, state in enumerate([MessageState.OK, MessageState.FAILED, MessageState.CANCEL])}
    skipped = add_message(store, 10, MessageState.SKIPPED)
    running = add_message(store, 11, MessageState.PROCESSING)
    new = add_message(store, 12, MessageState.NEW)
    already = add_message(store, 13, MessageState.OK)
    await service.enqueue(request_for(already))

    assert await service.sweep_missing() == 3
    assert await service.sweep_missing() == 0
    for state, mid in final.items():
        info = await service.get(mid)
        assert info and info.status == "PENDING" and info.outcome_state == state.value
    for mid in (skipped, running, new):
        assert await service.get(mid) is None
    assert (await service.process_due()).sent == 4


async def test_sweep_respects_the_delegate_systems(
    store: MessageStore, clock: FakeClock, soap: DelegateConfirmationCallback
) -> None:
    service = ConfirmationService(store, soap, clock=clock)
    crm = add_message(store, 1, source_system="CRM")
    add_message(store, 2, source_system="BILLING")
    assert await service.sweep_missing() == 1
    assert [i.message_id for i in await service.find()] == [crm]
    empty = ConfirmationService(store, DelegateConfirmationCallback(), clock=clock)
    assert await empty.sweep_missing() == 0


def finished_at(store: MessageStore, n: int, at: datetime) -> int:
    """A message that became OK at ``at`` (its ``last_update_ts``) and has no confirmation."""
    message_id = add_message(store, n, MessageState.NEW)
    assert store.transitions.apply((message_id, 0, MessageState.NEW, MessageState.OK, at, {}))
    return message_id


async def test_sweep_recent_reads_every_message_until_caught_up_then_the_recently_updated(
    store: MessageStore, clock: FakeClock
) -> None:
    service = ConfirmationService(store, Durable(), clock=clock)
    for n in range(3):
        finished_at(store, n, START - timedelta(days=30))
    assert await service.sweep_recent(limit=2) == 2  # a full batch: not caught up, the next sweep is full too
    assert await service.sweep_recent(limit=2) == 1  # caught up: from now on the messages updated since START - 1 min
    clock.advance(600)
    old = finished_at(store, 10, START - timedelta(minutes=2))  # before the window: left to the full sweep of a start
    in_overlap = finished_at(store, 11, START - timedelta(seconds=30))
    recent = finished_at(store, 12, START + timedelta(minutes=5))
    assert await service.sweep_recent() == 2
    assert await service.get(in_overlap) and await service.get(recent)
    assert await service.get(old) is None
    restarted = ConfirmationService(store, Durable(), clock=clock)
    assert await restarted.sweep_recent() == 1  # a new service (a start) sweeps every message first


class Recording(ConfirmationCallback):
    def __init__(self, expected: int) -> None:
        self.sent: list[int | str] = []
        self.expected = expected
        self.done = asyncio.Event()

    async def confirm(self, request: ConfirmationRequest) -> None:
        self.sent.append(request.message_id)
        if len(self.sent) >= self.expected:
            self.done.set()


async def test_run_sweeps_and_sends_until_stopped(store: MessageStore) -> None:
    callback = Recording(expected=2)
    service = ConfirmationService(store, callback)  # the real clock
    ids = [add_message(store, n) for n in range(2)]  # final, never enqueued: found by the sweep
    stop = asyncio.Event()
    task = asyncio.create_task(service.run(0.05, stop))
    await asyncio.wait_for(callback.done.wait(), 10)
    stop.set()
    await asyncio.wait_for(task, 10)
    assert sorted(callback.sent) == sorted(ids)
    with pytest.raises(InvalidConfirmationError, match="interval"):
        await service.run(0, stop)


async def test_run_sends_nothing_while_paused_and_catches_up_after(store: MessageStore) -> None:
    callback = Recording(expected=2)
    service = ConfirmationService(store, callback)
    ids = [add_message(store, n) for n in range(2)]
    skipped, resumed = asyncio.Event(), False
    asked = 0

    def paused() -> bool:  # a STOPPED node's server: every pass asks first
        nonlocal asked
        asked += 1
        if asked >= 3:
            skipped.set()
        return not resumed

    stop = asyncio.Event()
    task = asyncio.create_task(service.run(0.05, stop, paused=paused))
    await asyncio.wait_for(skipped.wait(), 10)
    assert callback.sent == []  # three passes skipped: nothing swept, nothing sent
    with store.engine.connect() as connection:
        assert connection.execute(sa.select(sa.func.count()).select_from(confirmation_table)).scalar() == 0
    resumed = True
    await asyncio.wait_for(callback.done.wait(), 10)
    stop.set()
    await asyncio.wait_for(task, 10)
    assert sorted(callback.sent) == sorted(ids)


async def test_admin_queries(store: MessageStore, clock: FakeClock) -> None:
    service = ConfirmationService(store, Durable(), clock=clock)
    mid = add_message(store, 1)
    await service.enqueue(request_for(mid))
    assert [i.status for i in await service.find("PENDING")] == ["PENDING"]
    assert await service.find("SENT") == []
    with pytest.raises(InvalidConfirmationError, match="status"):
        await service.find("LOST")
    assert await service.get(999) is None
    assert await service.retry([]) == 0
    with pytest.raises(InvalidConfirmationError, match="integer"):
        await service.retry(["1"])  # type: ignore[list-item]
    with pytest.raises(InvalidConfirmationError, match="limit"):
        await service.find(limit=0)
    with pytest.raises(InvalidConfirmationError, match="offset"):
        await service.failed(offset=-1)


def test_service_rejects_bad_configuration(store: MessageStore) -> None:
    callback = DefaultConfirmationCallback()
    with pytest.raises(InvalidConfirmationError, match="MessageStore"):
        ConfirmationService("sqlite:///x.db", callback)
    with pytest.raises(InvalidConfirmationError, match="callback"):
        ConfirmationService(store, object())  # type: ignore[arg-type]
    with pytest.raises(InvalidConfirmationError, match="batch_size"):
        ConfirmationService(store, callback, batch_size=0)
    with pytest.raises(InvalidConfirmationError, match="concurrency"):
        ConfirmationService(store, callback, concurrency=True)
    with pytest.raises(InvalidConfirmationError, match="clock"):
        ConfirmationService(store, callback, clock=42)  # type: ignore[arg-type]
    with pytest.raises(InvalidConfirmationError, match="aware"):  # the service reads its clock when made
        ConfirmationService(store.engine, callback, clock=lambda: datetime(2024, 1, 1))


async def test_send_error_is_a_confirmation_error() -> None:
    error = ConfirmationSendError("HTTP 502: bad gateway", status_code=502)
    assert (error.reason, error.status_code, str(error)) == ("HTTP 502: bad gateway", 502, "HTTP 502: bad gateway")


async def test_send_now_sends_only_that_message(store: MessageStore, clock: FakeClock) -> None:
    callback = Recording(expected=1)
    service = ConfirmationService(store, callback, clock=clock)
    first, second = add_message(store, 1), add_message(store, 2)
    for mid in (first, second):
        await service.enqueue(request_for(mid))
    assert (await service.send_now(second)).sent == 1
    assert callback.sent == [second]
    assert (await service.send_now(second)).attempted == 0  # already SENT
    assert (await service.get(first)).status == "PENDING"  # type: ignore[union-attr]
    with pytest.raises(InvalidConfirmationError, match="integer"):
        await service.send_now("1")  # type: ignore[arg-type]


async def test_an_unwritable_outcome_is_retried_after_the_lease(
    store: MessageStore, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    callback = Recording(expected=3)
    service = ConfirmationService(store, callback, ConfirmationPolicy(claim_timeout=30), clock=clock)
    ids = [add_message(store, n) for n in range(3)]
    for mid in ids:
        await service.enqueue(request_for(mid))
    unlucky = ids[1]
    leases = service._sender.leases
    settle = leases.settle_in

    def flaky(connection: sa.Connection, now: Any, outcomes: Any) -> list[bool]:  # the unlucky one's first fails
        if any(claim.row.message_id == unlucky and claim.attempt == 1 for claim, _error, _retry_at in outcomes):
            raise sa.exc.OperationalError("UPDATE confirmation", {}, Exception("database went away"))
        return settle(connection, now, outcomes)

    monkeypatch.setattr(leases, "settle_in", flaky)
    report = await service.process_due()
    assert (report.sent, report.errors) == (2, 1)
    assert (await service.get(unlucky)).status == "PENDING"  # type: ignore[union-attr]
    clock.advance(30)
    assert (await service.process_due()).sent == 1  # at-least-once: the lease expired, it is sent again
    assert sorted(callback.sent) == sorted([*ids, unlucky])


async def test_sweep_window_and_bad_arguments(store: MessageStore, clock: FakeClock) -> None:
    service = ConfirmationService(store, Durable(), clock=clock)
    old = add_message(store, 1)  # last updated at START
    assert await service.sweep_missing(updated_since=START + timedelta(seconds=1)) == 0
    assert await service.sweep_missing(updated_since=START) == 1
    assert (await service.get(old)) is not None
    with pytest.raises(InvalidConfirmationError, match="limit"):
        await service.sweep_missing(0)
    with pytest.raises(InvalidConfirmationError, match="updated_since"):
        await service.sweep_missing(updated_since=datetime(2024, 1, 1))


async def test_engine_hooks(
    store: MessageStore, clock: FakeClock, soap: DelegateConfirmationCallback, receiver: Receiver,
    caplog: pytest.LogCaptureFixture,
) -> None:
    service = ConfirmationService(store, soap, clock=clock)
    in_tx = add_message(store, 1, MessageState.CANCEL)
    after = add_message(store, 2, MessageState.OK, last_error_code="X")
    skipped = add_message(store, 3, MessageState.SKIPPED)

    with store.begin() as connection:
        service.on_final_state_tx(store.get(in_tx, connection), connection)
        service.on_final_state_tx(store.get(skipped, connection), connection)
    assert (await service.get(in_tx)).status == "PENDING"  # type: ignore[union-attr]
    assert await service.get(skipped) is None

    await service.on_final_state(store.get(after))  # enqueues and sends at once
    assert (await service.get(after)).status == "SENT"  # type: ignore[union-attr]
    await service.on_final_state(store.get(after))  # a second call sends nothing
    await service.on_final_state(store.get(skipped))
    assert accepted_ids(receiver) == [str(after)]

    ghost = store.get(after).evolve(id=987654)  # type: ignore[union-attr]
    await service.on_final_state(ghost)  # never raises into the engine
    assert "immediate confirmation of message 987654 failed" in caplog.text


class Fragile(ConfirmationCallback):
    """A callback that keeps no rows and fails for one message."""

    def __init__(self, failing: int) -> None:
        self.failing, self.called = failing, []

    @property
    def durable(self) -> bool:
        return False

    async def confirm(self, request: ConfirmationRequest) -> None:
        self.called.append(request.message_id)
        if request.message_id == self.failing:
            raise ConfirmationSendError("the log is full")


def child_of(store: MessageStore, parent: int, n: int) -> int:
    """A child message of ``parent`` (a split's) that ended OK."""
    child = store.insert_message(NewMessage(
        service="customer", operation="create", payload="{}", content_type="application/json",
        correlation_id=f"corr-{n}", source_system="CRM", receive_ts=START, parent_id=parent)).message.id
    assert store.transitions.apply((child, 0, MessageState.NEW, MessageState.OK, START, {}))
    return child


async def test_the_log_callback_confirms_each_owed_outcome_once_without_a_row(
    store: MessageStore, clock: FakeClock, caplog: pytest.LogCaptureFixture,
) -> None:
    service = ConfirmationService(store, DefaultConfirmationCallback(level=logging.INFO), clock=clock)
    owed = [add_message(store, 1, MessageState.OK), add_message(store, 2, MessageState.CANCEL),
            add_message(store, 3, MessageState.FAILED, last_error_code="E1", last_error_text="boom")]
    skipped = add_message(store, 4, MessageState.SKIPPED)
    held = add_message(store, 5, MessageState.FAILED, last_error_code="CALL_IN_DOUBT")
    child = child_of(store, owed[0], 6)
    finals = [*owed, skipped, held, child]
    with store.begin() as connection:  # the engine's final transaction: no row is written for any of them
        service.on_final_states_tx([store.get(i, connection) for i in finals], connection)
    caplog.set_level(logging.DEBUG, logger="openroute.confirmation")

    for message_id in finals:  # the engine's hook after the commit
        await service.on_final_state(store.get(message_id))

    lines = [r.getMessage() for r in caplog.records if r.name == "openroute.confirmation"]
    assert lines == [
        f"confirmation: message {owed[0]} (correlation corr-1) from CRM ended OK",
        f"confirmation: message {owed[1]} (correlation corr-2) from CRM ended CANCEL",
        f"confirmation: message {owed[2]} (correlation corr-3) from CRM ended FAILED error E1: boom",
    ]
    assert await service.counts() == {"PENDING": 0, "SENT": 0, "FAILED": 0}
    with store.engine.connect() as connection:
        assert connection.execute(sa.select(sa.func.count()).select_from(confirmation_table)).scalar_one() == 0
    assert await service.sweep_missing() == 0  # nothing to repair: no row is owed
    assert (await service.process_due()).attempted == 0


async def test_a_callback_without_rows_that_raises_is_logged_once_and_not_retried(
    store: MessageStore, clock: FakeClock, caplog: pytest.LogCaptureFixture,
) -> None:
    first, second = add_message(store, 1), add_message(store, 2)
    callback = Fragile(failing=first)
    service = ConfirmationService(store, callback, clock=clock)
    caplog.set_level(logging.INFO, logger="openroute.confirmation")
    for message_id in (first, second):
        await service.on_final_state(store.get(message_id))  # never raises
    assert callback.called == [first, second]
    errors = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert [r.getMessage() for r in errors] == [
        f"confirmation callback raised for message {first}; not retried (its callback keeps no rows)"]
    assert await service.counts() == {"PENDING": 0, "SENT": 0, "FAILED": 0}
    clock.advance(3600)
    assert (await service.process_due()).attempted == 0 and callback.called == [first, second]
