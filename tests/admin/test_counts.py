"""The stored message counts (``persistence/counts.py``, ``openroute/admin/counts.py``) equal a real GROUP BY of the
message table after random transitions, folds, deletions, truncations, two writers and commits out of order."""

from __future__ import annotations

import random
import threading
from collections import Counter
from datetime import UTC, datetime

import pytest
import sqlalchemy as sa
from alembic import command
from openroute.persistence import MessageState, MessageStore, NewMessage, message_table
from openroute.persistence.database import alembic_config

from openroute.admin import MessageCounts
from openroute.errors import ConfigurationError

S = MessageState
NOW = datetime(2026, 11, 27, 12, 0, tzinfo=UTC)


def _new(index: int, service: str = "s") -> NewMessage:
    return NewMessage(service=service, operation=f"o{index % 2}", payload="{}", content_type="application/json",
                      correlation_id=f"m-{index}-{random.random()}", source_system="crm", receive_ts=NOW)


def _group_by_route(store: MessageStore) -> dict[tuple[str, str], dict[MessageState, int]]:
    c = message_table.c
    counted: dict[tuple[str, str], dict[MessageState, int]] = {}
    with store.engine.connect() as connection:
        for service, operation, state, n in connection.execute(
                sa.select(c.service, c.operation, c.state, sa.func.count()).group_by(c.service, c.operation, c.state)):
            counted.setdefault((service, operation), {})[MessageState(state)] = n
    return dict(sorted(counted.items()))


def assert_exact(store: MessageStore) -> None:
    assert store.counts.by_state()[0] == store.count_by_state()
    assert store.counts.by_route() == _group_by_route(store)


def _move(store: MessageStore, message_id: int, to: MessageState, connection: sa.Connection | None = None) -> None:
    message = store.get(message_id, connection)
    assert message is not None
    assert store.transitions.apply((message.id, message.version, message.state, to, NOW, {}), connection)


def _delete(store: MessageStore, ids: list[int]) -> None:
    with store.begin() as connection:
        connection.execute(sa.delete(message_table).where(message_table.c.id.in_(ids)))


def test_counts_equal_a_group_by_after_random_transitions_folds_and_deletions(store: MessageStore) -> None:
    rng = random.Random(26)
    ids = [store.insert_message(_new(i, f"s{i % 3}")).message.id for i in range(40)]
    assert_exact(store)
    for round_ in range(12):
        for message_id in rng.sample(ids, 10):
            _move(store, message_id, rng.choice(list(MessageState)))
        if round_ % 3 == 0:
            store.counts.fold()  # PostgreSQL: sets the pending mark, folds the previous one
        assert_exact(store)
        # deleted: some changed since the mark, some not, some stored after it
        doomed = rng.sample(ids, 4)
        _delete(store, doomed)
        ids = [i for i in ids if i not in doomed]
        ids += [store.insert_message(_new(100 * round_ + i)).message.id for i in range(4)]
        assert_exact(store)
        if round_ % 2:
            store.counts.fold()
            assert_exact(store)
    _delete(store, ids)  # every message, with the newest transitions (SQLite gives their ids again)
    assert store.counts.by_state()[0] == {}
    for i in range(5):
        _move(store, store.insert_message(_new(1000 + i)).message.id, S.OK)
    assert_exact(store)
    store.counts.fold()
    store.counts.fold()
    assert_exact(store)
    assert store.counts.by_state()[1] == 0 or store.engine.dialect.name == "postgresql"


def test_a_fold_never_passes_a_transaction_that_commits_later(postgres_store: MessageStore) -> None:
    store = postgres_store
    first = store.insert_message(_new(1)).message.id
    with store.engine.connect() as late:  # takes a transition id below the ones committed after it
        with late.begin():
            _move(store, first, S.PROCESSING, late)
            others = [store.insert_message(_new(i)).message.id for i in range(2, 6)]
            _move(store, others[0], S.OK)
            for _ in range(3):
                store.counts.fold()
            assert_exact(store)  # the open transaction is not seen, by the counts or by the GROUP BY
            assert store.counts.by_state()[0] == {S.NEW: 4, S.OK: 1}
        assert_exact(store)  # committed now, below transitions committed before it: counted all the same
        assert store.counts.by_state()[0] == {S.NEW: 3, S.OK: 1, S.PROCESSING: 1}
    for _ in range(3):
        store.counts.fold()
        assert_exact(store)
    assert store.counts.by_state()[1] == 0


def test_two_nodes_writing_and_folding_at_once_keep_the_counts_exact(postgres_url: str) -> None:
    nodes = [MessageStore(postgres_url) for _ in range(2)]
    nodes[0].create_schema()
    try:
        errors: list[BaseException] = []

        def node(store: MessageStore, seed: int) -> None:
            rng = random.Random(seed)
            try:
                mine = [store.insert_message(_new(seed * 1000 + i)).message.id for i in range(30)]
                for step in range(150):
                    with store.begin() as connection:  # several changes in one transaction, like a group commit
                        for message_id in rng.sample(mine, 3):
                            _move(store, message_id, rng.choice(list(MessageState)), connection)
                    if step % 10 == 0:
                        store.counts.fold()
                    if step % 50 == 25:
                        doomed = rng.sample(mine, 3)
                        _delete(store, doomed)
                        mine = [i for i in mine if i not in doomed]
            except BaseException as error:  # reported by the test thread
                errors.append(error)

        threads = [threading.Thread(target=node, args=(store, seed)) for seed, store in enumerate(nodes, 1)]
        for thread in threads:
            thread.start()
        while any(thread.is_alive() for thread in threads):
            counts, _tail = nodes[0].counts.by_state()
            assert sum(counts.values()) <= 60 and min(counts.values(), default=0) >= 0
            threads[0].join(0.05)
        for thread in threads:
            thread.join()
        assert not errors
        for store in nodes:
            assert_exact(store)
            store.counts.fold()
            store.counts.fold()
            assert_exact(store)
    finally:
        for store in nodes:
            store.dispose()


def test_truncate_resets_the_counts(postgres_store: MessageStore) -> None:
    store = postgres_store
    for i in range(3):
        _move(store, store.insert_message(_new(i)).message.id, S.OK)
    store.counts.fold()
    store.counts.fold()
    with store.begin() as connection:
        connection.exec_driver_sql("TRUNCATE message RESTART IDENTITY CASCADE")
    assert store.counts.by_state()[0] == {}
    store.insert_message(_new(9))
    assert_exact(store)


def test_recount_repairs_writes_that_bypassed_the_store(store: MessageStore) -> None:
    ids = [store.insert_message(_new(i)).message.id for i in range(3)]
    with store.begin() as connection:  # no transition row: the counts cannot see it
        connection.execute(sa.update(message_table).where(message_table.c.id == ids[0]).values(state=S.FAILED))
    assert store.counts.by_state()[0] == {S.NEW: 3}
    store.counts.recount()
    assert_exact(store)


def test_message_counts_are_exact_on_every_call_and_fold_a_long_tail(store: MessageStore) -> None:
    ticks = [0.0]
    counts = MessageCounts(store, route_ttl=5, max_tail=3, monotonic=lambda: ticks[0])
    first = store.insert_message(_new(1)).message.id
    assert counts.by_state().counts == {S.NEW: 1}
    assert counts.open_by_route() == [("s", "o1", S.NEW, 1)]
    _move(store, first, S.PROCESSING)
    _move(store, first, S.OK)
    assert counts.by_state().counts == {S.OK: 1}  # at once, no cache
    assert counts.open_by_route() == [("s", "o1", S.NEW, 1)]  # the backlog per route is cached for route_ttl
    ticks[0] = 6.0
    assert counts.open_by_route() == []
    for i in range(5):
        store.insert_message(_new(10 + i))
    assert counts.by_state().counts == {S.OK: 1, S.NEW: 5}  # 8 transitions after the mark: a fold starts
    assert counts.wait_for_fold(timeout=30)
    assert store.counts.by_state()[1] <= 8
    assert counts.by_state().counts == {S.OK: 1, S.NEW: 5}
    with pytest.raises(ConfigurationError, match="fold_interval=0"):
        MessageCounts(store, fold_interval=0)


def test_retention_deletions_are_counted(store: MessageStore) -> None:
    from datetime import timedelta

    from openroute.retention import RetentionJob, RetentionPolicy

    ids = [store.insert_message(_new(i)).message.id for i in range(6)]
    for message_id in ids[:4]:
        _move(store, message_id, S.OK)
    store.counts.fold()
    _move(store, ids[4], S.OK)  # after the mark, then deleted
    deleted = RetentionJob(store, RetentionPolicy(keep={"OK": timedelta(0)}), now=lambda: NOW.replace(year=2027)
                           ).run_once()
    assert deleted == {S.OK: 5}
    assert_exact(store)
    assert store.counts.by_state()[0] == {S.NEW: 1}


def test_migration_0014_counts_the_stored_messages_and_goes_back(database_url: str) -> None:
    store = MessageStore(database_url)
    try:
        store.upgrade("0013")  # before the counts, with messages of every state
        ids = [store.insert_message(_new(i)).message.id for i in range(7)]
        for message_id, state in zip(ids, [S.OK, S.OK, S.FAILED, S.PARTLY_FAILED], strict=False):
            _move(store, message_id, state)
        _delete(store, ids[-1:])
        store.upgrade()
        assert store.counts.by_state()[0] == {S.OK: 2, S.FAILED: 1, S.PARTLY_FAILED: 1, S.NEW: 2}
        assert_exact(store)
        _delete(store, ids[:1])
        assert_exact(store)
        with store.begin() as connection:
            config = alembic_config(store.url)
            config.attributes["connection"] = connection
            command.downgrade(config, "0013")
        tables = set(sa.inspect(store.engine).get_table_names())
        assert not {"message_count", "message_count_mark", "message_count_delta"} & tables
        _delete(store, ids[1:2])  # the trigger went with the tables
        assert store.count_by_state() == {S.FAILED: 1, S.PARTLY_FAILED: 1, S.NEW: 2}
    finally:
        store.dispose()


def test_counts_of_a_state_are_never_negative_while_messages_move(store: MessageStore) -> None:
    ids = [store.insert_message(_new(i)).message.id for i in range(10)]
    path = [S.PROCESSING, S.PARTLY_FAILED, S.PROCESSING, S.OK]
    seen: Counter[MessageState] = Counter()
    for step, state in enumerate(path):
        for message_id in ids:
            _move(store, message_id, state)
        if step == 1:
            store.counts.fold()
        counts = store.counts.by_state()[0]
        seen.update(counts)
        assert counts == {state: 10}
    assert seen == Counter({S.PROCESSING: 20, S.PARTLY_FAILED: 10, S.OK: 10})


def _batch(store: MessageStore, routes: list[tuple[str, str]], tag: str) -> dict[tuple[str, str], list[int]]:
    """Two new messages of each route: route -> their ids."""
    ids: dict[tuple[str, str], list[int]] = {}
    for service, operation in routes:
        for j in range(2):
            message = NewMessage(service=service, operation=operation, payload="{}", content_type="application/json",
                                 correlation_id=f"{tag}-{service}-{j}", source_system="crm", receive_ts=NOW)
            ids.setdefault((service, operation), []).append(store.insert_message(message).message.id)
    return ids


def test_concurrent_deleters_of_the_same_routes_never_deadlock(postgres_store: MessageStore) -> None:
    """Retention on one node and an archive or an operator's delete on another delete messages of the same routes
    in opposite orders: the deleting transactions take no row lock on the counts (they append deltas)."""
    store = postgres_store
    routes = [(f"s{i}", f"o{i % 2}") for i in range(5)]
    barrier = threading.Barrier(2, timeout=30)
    errors: list[BaseException] = []

    def deleter(seed: int, mine: dict[tuple[str, str], list[int]]) -> None:
        order = routes if seed == 0 else routes[::-1]
        try:
            with store.begin() as connection:
                for step, route in enumerate(order):
                    connection.execute(sa.delete(message_table).where(message_table.c.id.in_(mine[route])))
                    if step == 0:  # both hold their first route's deletions before going on to the other's
                        barrier.wait()
        except BaseException as error:  # reported by the test thread
            errors.append(error)
            barrier.abort()

    for round_ in range(20):
        batches = [_batch(store, routes, f"d-{round_}-{seed}") for seed in range(2)]
        if round_ % 3 == 1:  # some deleted messages changed state after the mark
            _move(store, batches[0][routes[0]][0], S.OK)
        store.counts.fold()  # pending mark, then folded: the messages are in message_count
        store.counts.fold()
        threads = [threading.Thread(target=deleter, args=(seed, batch)) for seed, batch in enumerate(batches)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert not errors, errors
        assert_exact(store)
        if round_ % 4 == 3:
            store.counts.fold()
            assert_exact(store)
    store.counts.fold()
    assert_exact(store)
