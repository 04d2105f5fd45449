"""Parking on an open breaker (openroute/engine/parking.py), on real time and a real store, with no repoll: a message
whose call meets the open breaker parks on the system (POSTPONED, no due time, no attempt counted) and is not claimed
while the breaker stays open; one parked message at a time makes the trial calls; when the breaker closes every parked
message is released at once, in receive order, and the system's bulkhead paces the drain."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from openroute.persistence import MessageState, MessageStore
from openroute.persistence.breaker import BreakerOutlook, BreakerStore, Verdict

from openroute import TechnicalError
from openroute.definitions.clock import ManualClock
from openroute.definitions.message import InboundMessage
from openroute.definitions.retry import RetryPolicy
from openroute.definitions.route import Route, RouteRegistry
from openroute.engine import Engine, EngineSettings
from openroute.engine.parking import Parking
from openroute.outbound import BreakerSettings, BreakerState, ExternalCalls, ExternalSystem
from openroute.runtime.logs import TransitionLog

S = MessageState
OPEN_WAIT = timedelta(seconds=0.4)
BREAKER = BreakerSettings(failure_rate_threshold=50, window_size=4, minimum_calls=4, open_wait=OPEN_WAIT,
                          trial_calls=2, trial_timeout=timedelta(seconds=5), refresh=timedelta(0))


class Remote:
    """A fake external system that is down until told otherwise; it counts calls and the most in flight."""

    def __init__(self) -> None:
        self.down = True
        self.calls = 0
        self.in_flight = 0
        self.most_in_flight = 0

    async def call(self) -> str:
        self.calls += 1
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            await asyncio.sleep(0.01)
            if self.down:
                raise TechnicalError("connection refused", code="CONNECTION_ERROR")
            return "done"
        finally:
            self.in_flight -= 1


def _engine(store: MessageStore, remote: Remote, system: ExternalSystem) -> Engine:
    async def call_remote(exchange: Any) -> None:
        await exchange.ext_call("call", remote.call, system=system.name)

    route = Route("crm", "activate", [call_remote], retry_policy=RetryPolicy(max_attempts=20,
                                                                          interval=timedelta(seconds=0.05)))
    calls = ExternalCalls(store, [system])
    return Engine(store, RouteRegistry([route]), EngineSettings(repoll_interval=None, node_id="n1",
                                                                postpone_interval=timedelta(hours=1)),
                  external_calls=calls)


def _inbound(key: str) -> InboundMessage:
    return InboundMessage(service="crm", operation="activate", payload="{}", content_type="application/json",
                          correlation_id=key, source_system="crm")


async def _until(check: Callable[[], bool], what: str, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout} s")
        await asyncio.sleep(0.01)


def _moves(store: MessageStore, ids: list[int]) -> dict[int, list[tuple[str | None, str, str | None]]]:
    return {i: [(None if r["from_state"] is None else str(r["from_state"]), str(r["to_state"]), r["error_code"])
                for r in store.transitions.of(i)] for i in ids}


async def test_parked_messages_wait_for_the_breaker_and_are_released_when_it_closes(
    store: MessageStore, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="openroute")
    remote = Remote()
    system = ExternalSystem("REMOTE", breaker=BREAKER, max_concurrent_calls=3)
    engine = _engine(store, remote, system)
    engine.on_transition(TransitionLog())  # as `openroute run` attaches it
    await engine.start()
    try:
        ids = [(await engine.accept(_inbound(f"m-{i:02}"))).message_id for i in range(30)]
        breakers = BreakerStore(store)
        await _until(lambda: (row := breakers.get("REMOTE")) is not None and row.state is BreakerState.OPEN,
                     "the breaker opened")
        await _until(lambda: store.count_by_state().get(S.POSTPONED, 0) >= 26, "the others parked")
        parked = [m for m in (store.get(i) for i in ids) if m is not None and m.state is S.POSTPONED]
        # parked: on the system, no due time; on a slow machine open_wait may have passed by now, and the oldest parked
        # message is then released for the trial (out of the parking, due now) before it is claimed: one per period
        released = [m for m in parked if m.parked_on is None]
        assert all(m.parked_on == "REMOTE" and m.next_attempt_at is None for m in parked if m.parked_on is not None)
        assert all(m.next_attempt_at is not None for m in released)
        opened = sum(1 for r in caplog.records if r.getMessage().startswith("circuit breaker REMOTE OPEN"))
        assert len(released) <= opened, [m.id for m in released]
        histories = _moves(store, [m.id for m in parked])
        real_failures = {i: sum(1 for move in moves if move[1] == "PARTLY_FAILED") for i, moves in histories.items()}
        assert all(m.failed_count == real_failures[m.id] for m in parked), "a park counts no attempt"
        calls_when_open = remote.calls
        # while it stays open the parked messages are not claimed: the trial after open_wait is one message's call
        await asyncio.sleep(OPEN_WAIT.total_seconds() * 3)
        assert remote.calls - calls_when_open <= 2 * 3, "only trial calls (two places per open period) reach it"

        remote.down = False
        await _until(lambda: store.count_by_state() == {S.OK: 30}, "every message OK after the breaker closed")
        assert breakers.get("REMOTE").state is BreakerState.CLOSED  # type: ignore[union-attr]
        assert remote.most_in_flight <= 3, "the bulkhead paced the drain"
    finally:
        await engine.stop()
    # a waiting message is not claimed to find out it must still wait: one run before its park and one after its
    # release; a real failure (a trial, or a call made before the breaker opened) adds its retry, which may park,
    # and a message released for a trial whose place a due retry took parks again (at most once per open period: the
    # periods are counted, a slow machine has more of them before the remote comes back)
    periods = sum(1 for r in caplog.records if r.getMessage().startswith("circuit breaker REMOTE OPEN"))
    total_runs = total_failures = 0
    for message_id, history in _moves(store, ids).items():
        runs = sum(1 for move in history if move[1] == "PROCESSING")
        failures = sum(1 for move in history if move[1] == "PARTLY_FAILED")
        parks = sum(1 for move in history if move[1] == "POSTPONED")
        shown = f"{message_id}: " + " ".join(f"{move[1]}:{move[2]}" for move in history)
        assert runs <= 2 + 2 * failures + periods and parks <= 1 + failures + periods, shown
        total_runs += runs
        total_failures += failures
    assert total_runs <= 2 * len(ids) + 2 * total_failures + 2 * periods, total_runs
    released = [r.getMessage() for r in caplog.records if "released (breaker CLOSED)" in r.getMessage()]
    assert released and all(r.levelno == logging.INFO for r in caplog.records if "released (breaker" in r.getMessage())
    park_lines = [r for r in caplog.records if "-> POSTPONED" in r.getMessage() and "CIRCUIT_OPEN" in r.getMessage()]
    assert park_lines and all(r.levelno == logging.DEBUG for r in park_lines), "each message's park is DEBUG"


async def test_a_call_refused_while_half_open_parks_and_runs_when_the_breaker_closes(store: MessageStore) -> None:
    """HALF_OPEN with its one trial place taken: a second message's call is refused; it parks (no due time, no
    postpone_interval) and runs as soon as the trial closes the breaker."""
    remote = Remote()
    remote.down = False
    entered, release = asyncio.Event(), asyncio.Event()

    async def slow_trial() -> str:
        entered.set()
        await release.wait()
        return "done"

    system = ExternalSystem("REMOTE", breaker=BreakerSettings(
        failure_rate_threshold=50, window_size=4, minimum_calls=4, open_wait=OPEN_WAIT, trial_calls=1,
        trial_timeout=timedelta(seconds=5), refresh=timedelta(0)))
    calls = ExternalCalls(store, [system])
    await calls.force("REMOTE", BreakerState.OPEN, "ops")
    await calls.force("REMOTE", BreakerState.CLOSED, "ops")
    # open it the ordinary way (not forced), so that it takes a trial after open_wait
    row = BreakerStore(store).get("REMOTE")
    assert row is not None
    from openroute.outbound import breaker as rules

    BreakerStore(store).replace(row, rules.opened(row, system.breaker, calls.clock.now(), "test"))  # type: ignore[arg-type]

    async def step(exchange: Any) -> None:
        call = slow_trial if exchange.message.correlation_id == "trial" else remote.call
        await exchange.ext_call("call", call, system="REMOTE")

    engine = Engine(store, RouteRegistry([Route("crm", "activate", [step])]),
                    EngineSettings(repoll_interval=None, node_id="n1", postpone_interval=timedelta(hours=1)),
                    external_calls=calls)
    await engine.start()
    try:
        await asyncio.sleep(OPEN_WAIT.total_seconds())
        trial = await engine.accept(_inbound("trial"))
        async with asyncio.timeout(10):
            await entered.wait()  # HALF_OPEN, its one trial place taken
        refused = await engine.accept(_inbound("refused"))
        await _until(lambda: (m := store.get(refused.message_id)) is not None and m.state is S.POSTPONED, "parked")
        parked = store.get(refused.message_id)
        assert parked is not None and parked.parked_on == "REMOTE" and parked.next_attempt_at is None
        release.set()
        await _until(lambda: store.count_by_state() == {S.OK: 2}, "both OK once the trial closed the breaker")
        assert store.get(trial.message_id).state is S.OK  # type: ignore[union-attr]
    finally:
        await engine.stop()


async def test_a_bulkhead_holds_the_calls_in_flight_and_their_rate(store: MessageStore) -> None:
    from openroute.outbound.bulkhead import Bulkhead

    bulkhead = Bulkhead("REMOTE", max_concurrent_calls=2, max_calls_per_second=50)
    running = most = 0
    starts: list[float] = []

    async def call() -> None:
        nonlocal running, most
        async with bulkhead.slot():
            starts.append(time.monotonic())
            running += 1
            most = max(most, running)
            await asyncio.sleep(0.02)
            running -= 1

    await asyncio.gather(*(call() for _ in range(10)))
    assert most == 2 and bulkhead.in_flight == 0 and bulkhead.waiting == 0
    # each start reserves the next instant the rate allows: a late wake-up only slows it, it never bursts
    assert (len(starts) - 1) / (starts[-1] - starts[0]) <= 50 * 1.02, "at most 50 starts per second"


@pytest.mark.parametrize("limits", [{"max_concurrent_calls": 0}, {"max_concurrent_calls": 1.5},
                                    {"max_calls_per_second": 0}, {"max_calls_per_second": "ten"},
                                    {"max_concurrent_calls": True}])
def test_bad_bulkhead_limits_are_configuration_errors_naming_the_system(limits: dict[str, Any]) -> None:
    from openroute.definitions.errors import ConfigurationError

    with pytest.raises(ConfigurationError, match="external system REMOTE: max_"):
        ExternalSystem("REMOTE", **limits)


def _hourly_engine(store: MessageStore, remote: Remote) -> Engine:
    """A node whose route calls REMOTE and retries a failure after an hour."""
    async def call_remote(exchange: Any) -> None:
        await exchange.ext_call("call", remote.call, system="REMOTE")

    route = Route("crm", "activate", [call_remote], retry_policy=RetryPolicy(max_attempts=5,
                                                                          interval=timedelta(hours=1)))
    return Engine(store, RouteRegistry([route]), EngineSettings(repoll_interval=None, node_id="n1"),
                  external_calls=ExternalCalls(store, [ExternalSystem("REMOTE", breaker=BREAKER)]))


async def test_messages_that_failed_on_the_system_are_retried_when_its_breaker_closes_not_at_their_retry_time(
    store: MessageStore,
) -> None:
    """The calls made before the breaker opened failed: those messages are PARTLY_FAILED, due in an hour by their
    policy, and wait for the system too; when the breaker closes they run at once with the parked ones."""
    remote = Remote()

    engine = _hourly_engine(store, remote)
    await engine.start()
    try:
        ids = [(await engine.accept(_inbound(f"m-{i}"))).message_id for i in range(12)]
        await _until(lambda: store.count_by_state().get(S.PROCESSING, 0) == 0
                     and sum(store.count_by_state().values()) == 12, "every message failed or parked")
        failed = [m for m in (store.get(i) for i in ids) if m is not None and m.state is S.PARTLY_FAILED]
        # each waits for REMOTE, due in its hour (but one already released for the trial after open_wait)
        assert sum(1 for m in failed if m.parked_on == "REMOTE" and m.next_attempt_at is not None) >= len(failed) - 1
        remote.down = False  # the next trial succeeds (the oldest parked message's call)
        await _until(lambda: store.count_by_state() == {S.OK: 12}, "all OK at once, none waits for its hour")
    finally:
        await engine.stop()


async def test_a_failure_while_the_breaker_is_closed_keeps_its_retry_time(store: MessageStore) -> None:
    """A flaky call (the breaker stays CLOSED) is retried at its policy's time: only a breaker's close releases the
    messages that failed on the system before it."""
    remote = Remote()
    remote.down = True

    engine = _hourly_engine(store, remote)
    await engine.start()
    try:
        flaky = await engine.accept(_inbound("flaky"))
        await _until(lambda: (m := store.get(flaky.message_id)) is not None and m.state is S.PARTLY_FAILED, "failed")
        await engine.repoll_once()  # the survey looks at the systems with parked messages: none is parked
        await asyncio.sleep(0.2)
        row = store.get(flaky.message_id)
        assert row is not None and row.state is S.PARTLY_FAILED and row.failed_count == 1, "not retried early"
    finally:
        await engine.stop()


class _Guard:
    """A breaker whose outlook the test sets; no store behind it."""

    def __init__(self, outlook: Any) -> None:
        self.outlook_now = outlook

    def watch(self, listener: Callable[[str], None]) -> None:
        self.listener = listener

    async def outlook(self, system: str) -> Any:
        return self.outlook_now


class _Around:
    """The parts around Parking: the node's reads run ``run_db``; the feeder and the other nodes hear nothing."""

    def __init__(self, run_db: Callable[[Callable[[], Any]], Any]) -> None:
        self.run = run_db

    def wanted(self) -> None:
        return None

    def send(self) -> None:
        return None


class _Parked:
    """The store's parking as far as Parking uses it: counts the releases (each releases one message)."""

    def __init__(self) -> None:
        self.releases = 0

    def release(self, system: str, now: Any, limit: int | None, failed_before: Any = None) -> int:
        self.releases += 1
        return 1


async def test_a_breaker_reopened_while_a_trial_is_being_released_does_not_hold_the_next_trial_back() -> None:
    """Another message's trial fails while this node releases a parked one for a trial: the breaker opens again, the
    released message meets it and parks again. At the next open_until the node releases the next trial at once, not
    after TRIAL_PATIENCE (the released trial never reached a trial place)."""
    clock = ManualClock()
    trial = BreakerOutlook("REMOTE", Verdict.TRIAL, BreakerState.OPEN, since=clock.now())
    guard = _Guard(trial)
    parked = _Parked()
    releasing, go_on = asyncio.Event(), asyncio.Event()

    async def run_db(work: Callable[[], Any]) -> Any:
        releasing.set()
        await go_on.wait()  # the release's transaction is in flight
        return work()

    store: Any = type("Store", (), {"parking": parked})()
    around: Any = _Around(run_db)
    parking = Parking(store, clock, guard, around, feeder=around, signal=around)
    parking.start()
    try:
        parking.check_soon("REMOTE")
        async with asyncio.timeout(5):
            await releasing.wait()
        # meanwhile another message's trial fails: the breaker opens again (this node's change)
        reopened_until = clock.now() + OPEN_WAIT
        guard.outlook_now = BreakerOutlook("REMOTE", Verdict.REFUSE, BreakerState.OPEN, since=clock.now(),
                                           retry_at=reopened_until)
        guard.listener("REMOTE")
        go_on.set()
        async with asyncio.timeout(5):
            while parking.in_progress():
                await asyncio.gather(*parking.in_progress())
        assert parked.releases == 1
        # the released message meets the open breaker and parks again; at open_until the next trial is released
        parking.parked("REMOTE", reopened_until)
        clock.advance(OPEN_WAIT)
        guard.outlook_now = trial
        async with asyncio.timeout(5):
            while parked.releases < 2:
                await asyncio.sleep(0.01)
    finally:
        await parking.stop()


async def test_a_trial_released_lately_holds_back_the_next_one_until_it_reaches_the_breaker() -> None:
    """TRIAL_PATIENCE: while the released trial message has not reached the breaker (no change heard, no park), a
    timer that finds the breaker still taking trials releases no second message."""
    clock = ManualClock()
    guard = _Guard(BreakerOutlook("REMOTE", Verdict.TRIAL, BreakerState.OPEN, since=clock.now()))
    parked = _Parked()

    async def run_db(work: Callable[[], Any]) -> Any:
        return work()

    store: Any = type("Store", (), {"parking": parked})()
    around: Any = _Around(run_db)
    parking = Parking(store, clock, guard, around, feeder=around, signal=around)
    parking.start()
    try:
        for _ in range(3):
            parking.check_soon("REMOTE")
            async with asyncio.timeout(5):
                while parking.in_progress():
                    await asyncio.gather(*parking.in_progress())
        assert parked.releases == 1, "one trial at a time"
        parking.parked("REMOTE", clock.now())  # it met the breaker and parked again: the next look may release
        async with asyncio.timeout(5):
            while parked.releases < 2:
                await asyncio.sleep(0.01)
    finally:
        await parking.stop()
