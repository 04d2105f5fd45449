"""Group commit: grouped writes, per-item failures, the one-by-one fallback, batch store operations."""

from __future__ import annotations

import asyncio
import contextvars
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
import sqlalchemy as sa
from openroute.persistence import GroupConflict, MessageState, MessageStore, NewMessage

from openroute.definitions.errors import IllegalTransitionError, StaleMessageError
from openroute.engine import states
from openroute.engine._writer import Failure, GroupCommitWriter, Grouped, _settle
from tests.lifecycle.conftest import START, EngineFactory, inbound

S = MessageState


def _new(key: str) -> NewMessage:
    return NewMessage(service="orders", operation="create", payload="p", content_type="text/plain",
                      correlation_id=key, source_system="crm", receive_ts=START)


def test_insert_messages_in_one_statement_reports_duplicates(store: MessageStore) -> None:
    store.insert_message(_new("old"))
    outcomes = store.insert_messages([_new("a"), _new("old"), _new("b"), _new("a")])
    assert [o.duplicate for o in outcomes] == [False, True, False, True]
    assert outcomes[3].message.id == outcomes[0].message.id
    assert [o.message.correlation_id for o in outcomes] == ["a", "old", "b", "a"]
    for outcome in outcomes:
        assert store.get(outcome.message.id) == outcome.message
    assert store.count_by_state() == {S.NEW: 3}


def test_grouped_transitions_and_a_lost_one(store: MessageStore) -> None:
    messages = [store.insert_message(_new(f"t-{i}")).message for i in range(3)]
    claimed = states.claim(store, messages, "n", START)
    now = START + timedelta(seconds=1)
    written = states.transition_many(store, [(m, S.OK, now, {"custom_data": {"i": m.id}}) for m in claimed[:2]])
    assert [store.get(m.id) for m in claimed[:2]] == written
    # one stale request in a group of two: the store cannot tell which, the caller retries one by one
    with pytest.raises(GroupConflict), store.begin() as connection:
        states.transition_many(store, [(claimed[0], S.FAILED, now, {}), (claimed[2], S.FAILED, now, {})], connection)
    assert store.get(claimed[2].id).state is S.PROCESSING, "the group was rolled back"
    single = states.transition_many(store, [(claimed[0], S.FAILED, now, {})])
    assert isinstance(single[0], StaleMessageError)
    illegal = states.transition_many(store, [(claimed[2], S.NEW, now, {})])
    assert isinstance(illegal[0], IllegalTransitionError)
    assert store.get(claimed[2].id).state is S.PROCESSING


async def test_writer_groups_items_and_falls_back_one_by_one(sqlite_url: str) -> None:
    engine = sa.create_engine(sqlite_url)
    with engine.begin() as connection:
        connection.execute(sa.text("CREATE TABLE t (v INTEGER UNIQUE)"))
    calls: list[list[int]] = []

    def insert(connection: sa.Connection, items: list[int]) -> list[object]:
        calls.append(list(items))
        results: list[object] = []
        for item in items:
            if item < 0:
                results.append(Failure(ValueError(f"negative {item}")))
                continue
            connection.execute(sa.text("INSERT INTO t (v) VALUES (:v)"), {"v": item})
            results.append(item * 10)
        return results

    writer = GroupCommitWriter(engine, max_batch=100)
    group = Grouped(insert, "insert")
    outcomes = await asyncio.gather(
        *(writer.submit_grouped(group, i) for i in [1, 2, -3, 2, 4]), return_exceptions=True
    )
    # 2 twice breaks the unique constraint: the grouped transaction fails, every item is retried alone
    assert outcomes[0] == 10 and outcomes[1] == 20 and outcomes[4] == 40
    assert isinstance(outcomes[2], ValueError)
    assert isinstance(outcomes[3], sa.exc.IntegrityError)
    assert any(len(c) > 1 for c in calls), "items were grouped"
    with engine.connect() as connection:
        assert sorted(connection.execute(sa.text("SELECT v FROM t")).scalars()) == [1, 2, 4]
    assert await writer.submit(lambda connection: 7) == 7
    writer.close()
    with pytest.raises(RuntimeError):
        await writer.submit(lambda connection: 7)
    engine.dispose()


async def test_writer_keeps_its_connection_and_replaces_it_after_a_failure(sqlite_url: str) -> None:
    engine = sa.create_engine(sqlite_url)
    checkouts: list[int] = []
    sa.event.listen(engine, "checkout", lambda dbapi, record, proxy: checkouts.append(id(dbapi)))
    writer = GroupCommitWriter(engine)
    for value in range(3):
        assert await writer.submit(lambda connection, v=value: connection.execute(sa.text(f"SELECT {v}")).scalar()) \
            == value
    assert len(checkouts) == 1, "one connection for every transaction, not a checkout per commit"

    def broken(connection: sa.Connection) -> None:
        connection.invalidate()  # as a server restart or a dropped socket leaves it
        raise sa.exc.OperationalError("SELECT 1", None, Exception("connection lost"))

    with pytest.raises(sa.exc.OperationalError):
        await writer.submit(broken)
    assert await writer.submit(lambda connection: connection.execute(sa.text("SELECT 5")).scalar()) == 5
    assert len(checkouts) == 2, "the failed transaction's connection was given back; the next one took another"
    writer.close()
    assert engine.pool.checkedout() == 0, "close() gives the connection back to the pool"
    engine.dispose()


async def test_an_idle_writer_gives_its_connection_back_to_the_pool(sqlite_url: str) -> None:
    """After ``idle_release`` seconds without work the connection goes back, so the pool's checks (PostgreSQL's
    pre-ping) see it before the next transaction; with work it is kept."""
    engine = sa.create_engine(sqlite_url)
    writer = GroupCommitWriter(engine, idle_release=0.05)
    assert await writer.submit(lambda connection: connection.execute(sa.text("SELECT 1")).scalar()) == 1
    deadline = time.monotonic() + 10
    while engine.pool.checkedout() and time.monotonic() < deadline:  # bounded: the release is the thread's own
        await asyncio.sleep(0.01)
    assert engine.pool.checkedout() == 0, "not given back within 10 s of idleness"
    assert await writer.submit(lambda connection: connection.execute(sa.text("SELECT 2")).scalar()) == 2
    writer.close()
    with pytest.raises(ValueError, match="idle_release must be positive"):
        GroupCommitWriter(engine, idle_release=0)
    engine.dispose()


Recording = tuple[GroupCommitWriter, Grouped[int, int], list[list[int]]]


@pytest.fixture
def recording(sqlite_url: str) -> Iterator[Recording]:
    """A writer, a group answering ten times each item, and the items of each call of the group."""
    engine = sa.create_engine(sqlite_url)
    calls: list[list[int]] = []

    def run(connection: sa.Connection, items: list[int]) -> list[int | Failure]:
        calls.append(list(items))
        return [item * 10 for item in items]

    writer = GroupCommitWriter(engine)
    yield writer, Grouped(run, "record"), calls
    writer.close()
    engine.dispose()


async def test_operations_of_one_loop_iteration_share_one_transaction(recording: Recording) -> None:
    writer, group, calls = recording

    async def submit(item: int) -> int:
        time.sleep(0.002)  # C code releasing the GIL between two submits, as lxml does while parsing
        return await writer.submit_grouped(group, item)

    # the tasks all submit in the same iteration; the thread is rung once, after them, not woken by the first
    assert await asyncio.gather(*(submit(i) for i in range(20))) == [i * 10 for i in range(20)]
    assert calls == [list(range(20))] and writer.transactions == 1
    assert await writer.submit_grouped(group, 7) == 70  # a later operation rings again
    assert writer.transactions == 2


async def test_interleaved_groups_share_a_transaction_and_each_caller_gets_its_result(recording: Recording) -> None:
    """Items of two groups queued in turns: each group runs once with its items in order, and each caller's result
    is its own (the runs' results taken apart again)."""
    writer, group, calls = recording
    others: list[list[int]] = []

    def negate(connection: sa.Connection, items: list[int]) -> list[int | Failure]:
        others.append(list(items))
        return [-item for item in items]

    other = Grouped(negate, "negate")
    futures = [writer.enqueue_grouped(g, item) for g, item in
               [(group, 1), (group, 2), (other, 3), (group, 4), (other, 5), (group, 6)]]
    assert await asyncio.gather(*futures, writer.submit(lambda connection: "done")) == [10, 20, -3, 40, -5, 60, "done"]
    assert calls == [[1, 2, 4, 6]] and others == [[3, 5]] and writer.transactions == 1


def _submit_in_later_iterations(
    writer: GroupCommitWriter, group: Grouped[int, int], count: int
) -> list[asyncio.Future[int]]:
    """Submit 0, 1, ... ``count - 1``, each from a callback of the loop iteration after the one before: what a
    burst of requests does, whose parses release the GIL in between (as lxml does)."""
    loop = asyncio.get_running_loop()
    futures: list[asyncio.Future[int]] = []

    def submit(item: int) -> None:
        time.sleep(0.002)  # C code releasing the GIL: a thread rung already takes it here
        futures.append(writer.enqueue_grouped(group, item))
        if item + 1 < count:
            loop.call_soon(submit, item + 1)

    submit(0)
    return futures


async def test_the_ring_waits_for_the_callbacks_the_loop_has_ready(recording: Recording) -> None:
    writer, group, calls = recording
    futures = _submit_in_later_iterations(writer, group, 3)
    while len(futures) < 3:
        await asyncio.sleep(0)
    assert await asyncio.gather(*futures) == [0, 10, 20]
    assert calls == [[0, 1, 2]]  # rung once the loop had nothing else ready, not at the first iteration's end


async def test_a_loop_that_stays_busy_still_rings_after_a_few_iterations(recording: Recording) -> None:
    from openroute.engine._writer import _RING_DEFERRALS

    writer, group, calls = recording
    futures = _submit_in_later_iterations(writer, group, 40)
    while len(futures) < 40:
        await asyncio.sleep(0)
    await asyncio.gather(*futures)
    assert len(calls[0]) <= _RING_DEFERRALS + 2  # the first ones did not wait for the burst to end
    assert sorted(item for call in calls for item in call) == list(range(40))


def test_on_a_loop_that_hides_its_ready_callbacks_the_ring_waits_one_iteration(recording: Recording) -> None:
    """uvloop (what ``openroute run`` serves on) does not show its ready callbacks: the ring is deferred once, then
    the thread is rung, whatever else the loop has to do (three deferrals held every commit of a busy node longer)."""
    writer = recording[0]
    scheduled: list[tuple[Any, ...]] = []

    class BlindLoop:  # the loop's part the ring uses, and no ``_ready``
        def call_soon(self, callback: Any, *args: Any) -> None:
            scheduled.append((callback, *args))

    loop = BlindLoop()
    writer._ring(loop)  # type: ignore[arg-type]  # as queued by an operation: the first call
    iterations = 0
    while scheduled:
        callback, *args = scheduled.pop(0)
        callback(*args)
        iterations += 1
    assert iterations == 1
    assert writer._bell.get(timeout=5) is None and writer._bell.empty()  # rung, once
    assert loop not in writer._ringing


async def test_close_writes_what_was_queued_before_the_thread_was_rung(recording: Recording) -> None:
    writer, group, calls = recording
    assert await writer.submit_grouped(group, 0) == 0  # the thread runs
    tasks = [asyncio.ensure_future(writer.submit_grouped(group, i)) for i in range(1, 4)]
    await asyncio.sleep(0)  # queued; the ring is still scheduled on this loop
    writer.close()  # from the loop itself: the ring never ran, close() wakes the thread
    assert await asyncio.gather(*tasks) == [10, 20, 30]
    assert calls == [[0], [1, 2, 3]]


def test_a_submit_racing_close_from_another_thread_is_written_not_left_waiting(recording: Recording) -> None:
    """close() from one thread while another thread is between the closed check and its put: the put goes in
    before the stop mark (and is written), never behind it."""
    from openroute.engine._writer import _STOP

    writer, group, calls = recording
    assert asyncio.run(writer.submit_grouped(group, 1)) == 10  # the thread runs

    class SlowAppend(list):  # type: ignore[type-arg]
        def __init__(self) -> None:
            super().__init__()
            self.entered = threading.Event()

        def append(self, item: object) -> None:
            if item is not _STOP:
                self.entered.set()
                time.sleep(0.05)  # the submitter is inside its append when close() comes
            super().append(item)

    writer._queue = SlowAppend()
    results: list[int] = []
    submitter = threading.Thread(target=lambda: results.append(asyncio.run(writer.submit_grouped(group, 2))),
                                 daemon=True)
    submitter.start()
    assert writer._queue.entered.wait(5)
    writer.close()
    submitter.join(10)
    assert not submitter.is_alive(), "the operation queued behind the stop mark waits forever"
    assert results == [20] and calls == [[1], [2]]
    with pytest.raises(RuntimeError, match="closed"):
        asyncio.run(writer.submit_grouped(group, 3))


def test_operations_from_several_loops_are_all_written(recording: Recording) -> None:
    writer, group, calls = recording

    async def submit(first: int) -> list[int]:
        return list(await asyncio.gather(*(writer.submit_grouped(group, first + i) for i in range(5))))

    results: dict[int, list[int]] = {}
    threads = [threading.Thread(target=lambda f=first: results.__setitem__(f, asyncio.run(submit(f))))
               for first in (0, 100, 200)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert results == {f: [(f + i) * 10 for i in range(5)] for f in (0, 100, 200)}
    assert sorted(item for call in calls for item in call) == sorted(f + i for f in (0, 100, 200) for i in range(5))


async def test_concurrent_accepts_of_one_correlation_id_store_one_message(
    store: MessageStore, make_engine: EngineFactory
) -> None:
    from openroute.definitions.route import Route

    engine = make_engine(Route("orders", "create", [lambda ex: None]))
    await engine.start()
    results = await asyncio.gather(*(engine.accept(inbound("same")) for _ in range(10)))
    assert sum(not r.duplicate for r in results) == 1
    assert len({r.message_id for r in results}) == 1
    await engine.wait_idle(20)
    assert store.count_by_state() == {S.OK: 1}


async def test_the_futures_one_commit_settles_wake_their_callbacks_in_order_each_in_its_context() -> None:
    """``_settle`` runs the futures' wake-ups in one loop callback of the commit's (no callback each): still in the
    next iteration, in their order and contexts, a failing one reported to the loop's exception handler."""
    loop = asyncio.get_running_loop()
    who: contextvars.ContextVar[str] = contextvars.ContextVar("who")
    heard: list[object] = []
    futures = [loop.create_future() for _ in range(4)]

    async def waiter(index: int) -> None:
        who.set(f"task {index}")
        heard.append((await futures[index], who.get()))

    tasks = [asyncio.create_task(waiter(i)) for i in (0, 1)]
    await asyncio.sleep(0)
    futures[2].add_done_callback(lambda f: heard.append(("callback", f.result())))  # not a task: the same
    futures[3].add_done_callback(lambda f: 1 / 0)
    futures[3].add_done_callback(lambda f: heard.append(("second callback", f.result())))  # two: as set_result has it
    errors: list[dict[str, object]] = []
    loop.set_exception_handler(lambda _loop, context: errors.append(context))
    _settle([(None, None, future, loop) for future in futures], ["a", "b", "c", "d"])
    assert heard == [] and all(future.done() for future in futures)
    await asyncio.gather(*tasks)
    assert heard == [("a", "task 0"), ("b", "task 1"), ("callback", "c"), ("second callback", "d")]
    assert [type(context["exception"]) for context in errors] == [ZeroDivisionError]


async def test_a_future_without_its_private_callbacks_list_is_settled_the_public_way(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """``_settle`` reads a future's private ``_callbacks`` to run its wake-up itself; a Python whose futures lack it
    gets its futures settled by ``set_result`` all the same (the awaiting task wakes, nothing is logged)."""
    from openroute.engine import _writer

    class FutureWithoutCallbacks(asyncio.Future[object]):
        def __getattribute__(self, name: str) -> object:
            if name == "_callbacks":
                raise AttributeError(name)
            return super().__getattribute__(name)

    monkeypatch.setattr(_writer, "_Future", FutureWithoutCallbacks)
    loop = asyncio.get_running_loop()
    future = FutureWithoutCallbacks(loop=loop)
    waiter = asyncio.create_task(asyncio.wait_for(future, 5))
    await asyncio.sleep(0)
    _settle([(None, None, future, loop)], ["result"])
    assert await waiter == "result"
