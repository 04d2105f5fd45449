"""The funnel as a queue: a message behind its funnel's holder waits in the funnel's queue (POSTPONED once, no due
time, never claimed to find out it must still wait); the transaction that frees the funnel hands it to exactly one
next message, on whatever node, which runs at once. No repoll runs and ``postpone_interval`` is an hour here: every
hand-off is an event. On SQLite and PostgreSQL, and across two nodes on PostgreSQL."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from datetime import timedelta

import pytest
import sqlalchemy as sa
from openroute.persistence import MessageState, MessageStore, StoredMessage, message_table
from openroute.persistence.models import funnel_lock_table

from openroute.definitions.clock import ManualClock
from openroute.definitions.route import Route, RouteRegistry
from openroute.engine import Engine, EngineSettings, states
from tests.lifecycle.conftest import START, inbound

HOUR = timedelta(hours=1)
S = MessageState


def _settings(node_id: str, **values: object) -> EngineSettings:
    return EngineSettings(node_id=node_id, repoll_interval=None, postpone_interval=HOUR, **values)  # type: ignore[arg-type]


async def _wait_for(check: Callable[[], Awaitable[bool]], what: str, timeout: float = 15) -> None:
    deadline = time.monotonic() + timeout
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout} s")
        await asyncio.sleep(0.02)


def _states_are(store: MessageStore, ids: list[int], state: MessageState) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        found = await asyncio.to_thread(lambda: [store.get(i) for i in ids])
        return all(message is not None and message.state is state for message in found)
    return check


class Gate:
    """A step that records the order and the overlap of the messages it runs, and holds "first" until opened."""

    def __init__(self, hold: float = 0.005) -> None:
        self.hold = hold
        self.opened = asyncio.Event()
        self.ran: list[str] = []
        self.running: Counter[str] = Counter()
        self.overlaps = 0

    async def step(self, exchange: object) -> None:
        message = exchange.message  # type: ignore[attr-defined]
        funnel = message.funnel_value or ""
        self.running[funnel] += 1
        self.overlaps += self.running[funnel] > 1
        self.ran.append(message.correlation_id)
        try:
            if message.correlation_id == "first":
                await self.opened.wait()
            else:
                await asyncio.sleep(self.hold)
        finally:
            self.running[funnel] -= 1

    def route(self, **options: object) -> Route:
        return Route("orders", "create", [self.step], **options)  # type: ignore[arg-type]


def _history(store: MessageStore, message_id: int) -> list[tuple[str | None, str]]:
    return [(None if row["from_state"] is None else MessageState(row["from_state"]).value,
             MessageState(row["to_state"]).value) for row in store.transitions.of(message_id)]


async def test_messages_behind_a_holder_wait_once_and_run_in_turn_when_it_ends(store: MessageStore) -> None:
    gate = Gate()
    engine = Engine(store, RouteRegistry([gate.route()]), _settings("solo"))
    await engine.start()
    try:
        first = await engine.accept(inbound("first", funnel_value="customer-7"))
        await _wait_for(lambda: asyncio.sleep(0, result="first" in gate.ran), "first running")
        waiting = [(await engine.accept(inbound(f"w-{i}", funnel_value="customer-7"))).message_id for i in range(5)]
        await _wait_for(_states_are(store, waiting, S.POSTPONED), "the five in the funnel's queue")
        for message_id in waiting:
            row = store.get(message_id)
            assert row is not None and row.last_error_code == "FUNNEL" and row.next_attempt_at is None, \
                "in the queue: not due by time"
        assert gate.ran == ["first"], "a waiting message never runs to find out it must still wait"

        gate.opened.set()
        await _wait_for(_states_are(store, [first.message_id, *waiting], S.OK), "every message OK")
        assert gate.ran == ["first", *[f"w-{i}" for i in range(5)]], "handed on in receive order"
        assert gate.overlaps == 0
        for message_id in waiting:  # queued once, claimed once: NEW -> POSTPONED -> PROCESSING -> OK
            assert _history(store, message_id) == [(None, "NEW"), ("NEW", "POSTPONED"), ("POSTPONED", "PROCESSING"),
                                                   ("PROCESSING", "OK")]
    finally:
        await engine.stop()


@pytest.mark.parametrize("database_url", ["postgres"], indirect=True)
async def test_a_release_on_one_node_hands_the_funnel_to_a_message_another_node_queued(database_url: str) -> None:
    setup = MessageStore(database_url)
    setup.create_schema()
    gate_a, gate_b = Gate(), Gate()
    store_a, store_b = MessageStore(database_url), MessageStore(database_url)
    node_a = Engine(store_a, RouteRegistry([gate_a.route()]), _settings("node-a"))
    node_b = Engine(store_b, RouteRegistry([gate_b.route()]), _settings("node-b"))
    await node_a.start()
    await node_b.start()
    try:
        first = await node_a.accept(inbound("first", funnel_value="customer-9"))
        await _wait_for(lambda: asyncio.sleep(0, result="first" in gate_a.ran), "first running on node A")
        second = await node_b.accept(inbound("second", funnel_value="customer-9"))
        await _wait_for(_states_are(store_b, [second.message_id], S.POSTPONED), "second queued by node B")

        gate_a.opened.set()
        await _wait_for(_states_are(store_b, [first.message_id, second.message_id], S.OK), "both OK")
        assert gate_b.ran == [] and gate_a.ran == ["first", "second"], "the releasing node runs the next at once"
        assert _history(setup, second.message_id) == [(None, "NEW"), ("NEW", "POSTPONED"),
                                                      ("POSTPONED", "PROCESSING"), ("PROCESSING", "OK")]
    finally:
        await node_a.stop()
        await node_b.stop()
        for store in (store_a, store_b, setup):
            store.dispose()


@pytest.mark.parametrize("database_url", ["postgres"], indirect=True)
async def test_two_nodes_drain_many_funnels_single_file_with_one_wait_per_message(database_url: str) -> None:
    """200 messages over 10 funnel values accepted by two nodes at once: never two of a value at the same time,
    every message OK, at most one POSTPONED and one PROCESSING transition each."""
    setup = MessageStore(database_url)
    setup.create_schema()
    gate = Gate(hold=0.02)
    gate.opened.set()
    stores = [MessageStore(database_url) for _ in range(2)]
    nodes = [Engine(s, RouteRegistry([gate.route()]), _settings(f"node-{i}", concurrency=16))
             for i, s in enumerate(stores)]
    for node in nodes:
        await node.start()
    try:
        accepted = await asyncio.gather(*(nodes[i % 2].accept(inbound(f"m-{i}", funnel_value=f"f-{i % 10}"))
                                          for i in range(200)))
        ids = [a.message_id for a in accepted]
        await _wait_for(_states_are(setup, ids, S.OK), "every message OK", timeout=60)
        assert gate.overlaps == 0, "two messages of one funnel value ran at once"
        moves = Counter[tuple[str | None, str]]()
        for message_id in ids:
            history = _history(setup, message_id)
            assert history.count(("NEW", "POSTPONED")) + history.count(("POSTPONED", "POSTPONED")) <= 1, history
            assert sum(1 for _from, to in history if to == "PROCESSING") == 1, history
            moves.update(history)
        assert moves[("NEW", "POSTPONED")] > 50, "the test's load made messages wait"
        print(f"\n200 messages, 10 funnel values, 2 nodes: {moves[('NEW', 'POSTPONED')]} waited in a queue")
    finally:
        for node in nodes:
            await node.stop()
        for store in (*stores, setup):
            store.dispose()


async def test_cancelling_the_older_message_hands_an_ordered_funnel_to_the_next(store: MessageStore) -> None:
    """Guaranteed order: a newer message waits while an older one is unfinished (here PARTLY_FAILED, due in an hour);
    an operator's cancel of the older one hands the funnel to the newer at once."""
    attempts = Counter[str]()

    def step(exchange: object) -> None:
        key = exchange.message.correlation_id  # type: ignore[attr-defined]
        attempts[key] += 1
        if key == "older":
            raise RuntimeError("the remote is down")

    route = Route("orders", "create", [step], guaranteed_order=True)
    engine = Engine(store, RouteRegistry([route]), _settings("solo"))
    await engine.start()
    try:
        older = await engine.accept(inbound("older", funnel_value="acct-1"))
        await _wait_for(_states_are(store, [older.message_id], S.PARTLY_FAILED), "older failed once")
        newer = await engine.accept(inbound("newer", funnel_value="acct-1"))
        await _wait_for(_states_are(store, [newer.message_id], S.POSTPONED), "newer waits for the older")
        assert attempts["newer"] == 0
        await engine.cancel(older.message_id, "admin:ops")
        await _wait_for(_states_are(store, [newer.message_id], S.OK), "newer handed the funnel by the cancel")
    finally:
        await engine.stop()


async def test_a_queue_whose_holder_died_is_handed_on_by_the_repair(store: MessageStore) -> None:
    """The holder's node died (it stays PROCESSING); the repair after its lease hands the funnel on in the same
    transaction."""
    gate = Gate()
    gate.opened.set()
    clock = ManualClock(START)
    engine = Engine(store, RouteRegistry([gate.route()]), _settings("survivor", processing_lease=timedelta(minutes=1)),
                    clock=clock)
    holder = store.insert_message(inbound("dead-holder", funnel_value="f").to_new_message(START)).message
    holder = states.claim(store, [holder], "dead-node", START)[0]
    store.funnels.acquire("f", holder.id, START)
    await engine.start()
    try:
        waiting = await engine.accept(inbound("waiting", funnel_value="f"))
        await _wait_for(_states_are(store, [waiting.message_id], S.POSTPONED), "waiting behind the dead holder")
        clock.advance(timedelta(minutes=2))
        await engine.repoll_once()  # the lease is over: the holder is repaired, the funnel handed on
        await _wait_for(_states_are(store, [waiting.message_id, holder.id], S.OK), "both ran")
        assert gate.ran == ["waiting", "dead-holder"], "the queue first; the repaired holder is due again after it"
        assert ("PROCESSING", "PARTLY_FAILED") in _history(store, holder.id)
    finally:
        await engine.stop()


def _set(store: MessageStore, message_id: int, **values: object) -> None:
    with store.engine.begin() as connection:
        connection.execute(sa.update(message_table).where(message_table.c.id == message_id).values(**values))


def test_a_queue_behind_a_message_about_to_run_is_not_stalled(store: MessageStore) -> None:
    """The safety net hands on only queues nothing is about to take: a breaker's close makes the oldest message of
    each funnel value due and queues the others behind it; handing those funnels to their queues' heads would run
    them before the due message, which would then wait behind them (a second wait each)."""
    ids = {name: store.insert_message(inbound(name, funnel_value=name[0]).to_new_message(START)).message.id
           for name in ("a-head", "a-queued", "b-head", "b-queued", "c-new", "c-queued", "d-queued")}
    queued = {"state": S.POSTPONED, "last_error_code": "FUNNEL", "next_attempt_at": None}
    for name in ("a-queued", "b-queued", "c-queued", "d-queued"):
        _set(store, ids[name], **queued)
    _set(store, ids["a-head"], state=S.POSTPONED, last_error_code="CIRCUIT_OPEN", next_attempt_at=START)  # due now
    _set(store, ids["b-head"], state=S.PARTLY_FAILED, next_attempt_at=START + HOUR)  # due in an hour
    # c-new stays NEW; d has nothing but its queue
    assert sorted(store.funnels.stalled(10, START)) == ["b", "d"]
    assert sorted(store.funnels.stalled(10, START + HOUR)) == ["d"], "b's message is due by then"


def _holders(store: MessageStore) -> dict[str, int]:
    with store.engine.connect() as connection:
        return {row.funnel_value: row.message_id for row in connection.execute(sa.select(funnel_lock_table))}


def test_a_group_of_turns_takes_free_and_stale_funnels_and_names_the_running_holders(store: MessageStore) -> None:
    """``acquire_many``: a funnel with no row yet is taken, one whose holder left PROCESSING is taken over, one whose
    holder runs is not (its holder is named), one the message holds already stays its own."""
    ids = {name: store.insert_message(inbound(name, funnel_value=name[0]).to_new_message(START)).message.id
           for name in ("a-new", "b-holder", "b-new", "c-holder", "c-new", "d-own")}
    running = states.claim(store, [store.get(ids["b-holder"])], "n1", START)  # type: ignore[list-item]
    assert running
    for value, holder in (("b", "b-holder"), ("c", "c-holder"), ("d", "d-own")):
        assert store.funnels.acquire(value, ids[holder], START) is None
    _set(store, ids["c-holder"], state=S.OK)  # c's holder ended without handing on (a repair, say)
    taken = store.funnels.acquire_many([("d", ids["d-own"]), ("c", ids["c-new"]), ("b", ids["b-new"]),
                                        ("a", ids["a-new"])], START)
    assert taken == {"a": None, "b": ids["b-holder"], "c": None, "d": None}
    assert _holders(store) == {"a": ids["a-new"], "b": ids["b-holder"], "c": ids["c-new"], "d": ids["d-own"]}
    assert store.funnels.acquire_many([], START) == {}


def test_a_group_of_releases_finds_the_free_funnels_their_queue_heads_and_hands_them_on(store: MessageStore) -> None:
    """``free_of``, ``queue_heads`` and ``hand_to_many``: the funnels no PROCESSING message holds (a value with no row
    is free), the oldest waiting message of each queue in receive order (ties by id), and the hand-off of each to
    its head in one statement (creating the row of a queue its holder never took)."""
    later = START + timedelta(seconds=1)
    ids = {}
    for name, received in (("a-holder", START), ("a-second", later), ("a-first", START), ("b-holder", START),
                           ("b-queued", START), ("c-queued", START), ("e-done", START)):
        ids[name] = store.insert_message(inbound(name, funnel_value=name[0]).to_new_message(received)).message.id
    queued = {"state": S.POSTPONED, "last_error_code": "FUNNEL", "next_attempt_at": None}
    for name in ("a-second", "a-first", "b-queued", "c-queued"):
        _set(store, ids[name], **queued)
    _set(store, ids["a-holder"], state=S.OK)
    states.claim(store, [store.get(ids["b-holder"])], "n1", START)  # type: ignore[list-item]
    store.funnels.acquire("a", ids["a-holder"], START)
    store.funnels.acquire("b", ids["b-holder"], START)
    assert store.funnels.free_of(["c", "b", "a", "a", "e"]) == ["a", "c", "e"]
    heads = store.funnels.queue_heads(["a", "c", "e"])
    assert {value: head.correlation_id for value, head in heads.items()} == {"a": "a-first", "c": "c-queued"}
    store.funnels.hand_to_many([(value, head.id) for value, head in heads.items()], later)
    assert _holders(store) == {"a": ids["a-first"], "b": ids["b-holder"], "c": ids["c-queued"]}
    assert store.funnels.free_of([]) == [] and store.funnels.queue_heads([]) == {}


def test_a_claim_group_runs_the_oldest_of_each_value_and_queues_the_rest_behind_it(store: MessageStore) -> None:
    """One group commit's claim of several messages of the same funnel values: the oldest of each value runs, the
    others of that value wait in its queue behind it, and a value whose oldest another writer changed first takes
    its turns one message at a time (the next one runs rather than waiting behind a message that does not)."""
    gate = Gate()
    engine = Engine(store, RouteRegistry([gate.route()]), _settings("n1"))
    batch = [store.insert_message(inbound(name, funnel_value=name[0]).to_new_message(START)).message
             for name in ("x-1", "x-2", "x-3", "y-1", "y-2", "z-1")]
    stale = batch[3]
    _set(store, stale.id, state=S.POSTPONED, next_attempt_at=START + HOUR,  # changed by another writer
         version=message_table.c.version + 1)
    with store.engine.begin() as connection:
        results = engine._pipeline.writes.claim_many(connection, batch)
    got = {message.correlation_id: result.state if isinstance(result, StoredMessage) else result
           for message, result in zip(batch, results, strict=True)}
    assert got == {"x-1": S.PROCESSING, "x-2": S.POSTPONED, "x-3": S.POSTPONED, "y-1": None, "y-2": S.PROCESSING,
                   "z-1": S.PROCESSING}
    waiting = store.get(batch[1].id)
    assert waiting is not None and waiting.last_error_code == "FUNNEL" and waiting.next_attempt_at is None
    assert f"held by message {batch[0].id}" in (waiting.last_error_text or "")
    assert _holders(store) == {"x": batch[0].id, "y": batch[4].id, "z": batch[5].id}


def test_the_releases_of_one_group_commit_hand_each_freed_funnel_to_its_queue_head(store: MessageStore) -> None:
    """``hand_off_many``: three holders end in one group commit (two of them of the same value, as an operator's
    cancel and the holder's end can be); each funnel no PROCESSING message holds goes to the oldest of its queue,
    claimed for this node in that transaction and run once the commit is known; a funnel still held is left alone."""
    from openroute.engine.funnel import FunnelQueue

    funnel = FunnelQueue(store, RouteRegistry([Gate().route()]), ManualClock(START), "n1")
    names = ("a-holder", "a-cancelled", "a-next", "b-holder", "b-next", "b-later", "c-holder", "c-next")
    ids = {name: store.insert_message(inbound(name, funnel_value=name[0]).to_new_message(START)).message.id
           for name in names}
    for name in ("a-next", "b-next", "b-later", "c-next"):
        _set(store, ids[name], state=S.POSTPONED, last_error_code="FUNNEL", next_attempt_at=None)
    holders = {value: states.claim(store, [store.get(ids[f"{value}-holder"])], "n1", START)[0]  # type: ignore[list-item]
               for value in "abc"}
    for value, holder in holders.items():
        assert store.funnels.acquire(value, holder.id, START) is None
    ended = [states.transition(store, holders["a"], S.OK, START),
             states.transition(store, store.get(ids["a-cancelled"]), S.CANCEL, START),  # type: ignore[arg-type]
             states.transition(store, holders["b"], S.OK, START)]
    with store.engine.begin() as connection:  # c's holder still runs
        funnel.hand_off_many(ended, connection)
    handed = [funnel.handed_on(message.id) for message in ended]  # once the commit is known
    ran = [claimed.correlation_id for claimed in handed if claimed is not None]
    assert sorted(ran) == ["a-next", "b-next"] and funnel.handed == 2
    assert {n: store.get(ids[n]).state for n in ("a-next", "b-next", "b-later", "c-next")} == {  # type: ignore[union-attr]
        "a-next": S.PROCESSING, "b-next": S.PROCESSING, "b-later": S.POSTPONED, "c-next": S.POSTPONED}
    assert _holders(store) == {"a": ids["a-next"], "b": ids["b-next"], "c": ids["c-holder"]}


@pytest.mark.parametrize("database_url", ["postgres"], indirect=True)
async def test_funnel_drain_rate_behind_a_slow_remote(store: MessageStore) -> None:
    """Prints the drain rate of 20 messages of one funnel value behind a 50 ms remote (benchmarks/funnel_bench.py
    drains 50); no timing is asserted."""
    async def remote(exchange: object) -> None:
        await asyncio.sleep(0.05)

    count = 20
    engine = Engine(store, RouteRegistry([Route("orders", "create", [remote])]), _settings("drain"))
    await engine.start()
    try:
        started = time.perf_counter()
        accepted = [await engine.accept(inbound(f"m-{i}", funnel_value="one-object")) for i in range(count)]

        async def all_ok() -> bool:
            counts = await asyncio.to_thread(store.count_by_state)
            return counts.get(MessageState.OK, 0) == count
        await _wait_for(all_ok, f"{count} funnel messages OK", timeout=60)
        elapsed = time.perf_counter() - started
    finally:
        await engine.stop()
    assert len({a.message_id for a in accepted}) == count
    print(f"\nfunnel drain: {count} messages of one funnel value behind a 50 ms remote in {elapsed:.2f} s "
          f"= {count / elapsed:.1f} messages/s")
