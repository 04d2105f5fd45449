"""The stored message counts (``persistence/counts.py``, ``store.counts``) equal a real GROUP BY of the message
table, and the finished minutes a real GROUP BY of ``message_transition``, after random transitions, folds,
deletions, truncations, two writers and commits out of order."""

from __future__ import annotations

import random
import threading
from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import sqlalchemy as sa
from alembic import command
from openroute.persistence import FINAL_STATES, MessageState, MessageStore, NewMessage, message_table
from openroute.persistence import counts as counts_module
from openroute.persistence.counts import FINISHED_KEPT
from openroute.persistence.database import alembic_config
from openroute.persistence.models import (
    message_finished_delta_table,
    message_finished_minute_table,
    message_transition_table,
)

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


def _minute(at: datetime) -> datetime:
    return at.astimezone(UTC).replace(second=0, microsecond=0)


def _group_by_minute(store: MessageStore, since: datetime | None = None,
                     where: sa.ColumnElement[bool] | None = None) -> dict[tuple[datetime, MessageState], int]:
    """The transitions into a final state (``where`` too) from ``since``'s minute on, per minute and state."""
    t = message_transition_table.c
    with store.engine.connect() as connection:
        rows = connection.execute(sa.select(t.at, t.to_state).where(
            t.to_state.in_(FINAL_STATES), sa.true() if where is None else where)).all()
    counted = Counter((_minute(at), MessageState(state)) for at, state in rows
                      if since is None or at >= _minute(since))
    return dict(sorted(counted.items()))


def _kept(store: MessageStore) -> dict[tuple[datetime, MessageState], int]:
    """The rows of ``message_finished_minute`` as they are."""
    f = message_finished_minute_table.c
    with store.engine.connect() as connection:
        return {(minute, MessageState(state)): n for minute, state, n in
                connection.execute(sa.select(f.minute, f.state, f.n).order_by(f.minute, f.state))}


def assert_exact(store: MessageStore) -> None:
    assert store.counts.by_state()[0] == store.count_by_state()
    assert store.counts.by_route() == _group_by_route(store)
    now = datetime.now(UTC)
    for since in (now - timedelta(minutes=110), now - timedelta(minutes=47, seconds=30), now):
        assert store.counts.finished_by_minute(None, since) == _group_by_minute(store, since)


def _recent(rng: random.Random) -> datetime:
    """A time within the last 100 minutes (the finished minutes keep two hours)."""
    return datetime.now(UTC) - timedelta(minutes=rng.randrange(100), seconds=rng.randrange(60))


def _move(store: MessageStore, message_id: int, to: MessageState, connection: sa.Connection | None = None,
          at: datetime = NOW) -> None:
    # the columns every revision has (the migration tests move messages on an older schema)
    c = message_table.c
    row = store.run(lambda conn: conn.execute(sa.select(c.version, c.state).where(c.id == message_id)).first(),
                    connection)
    assert row is not None
    assert store.transitions.apply((message_id, row.version, MessageState(row.state), to, at, {}), connection)


def _delete(store: MessageStore, ids: list[int]) -> None:
    with store.begin() as connection:
        connection.execute(sa.delete(message_table).where(message_table.c.id.in_(ids)))


def test_counts_equal_a_group_by_after_random_transitions_folds_and_deletions(store: MessageStore) -> None:
    rng = random.Random(26)
    ids = [store.insert_message(_new(i, f"s{i % 3}")).message.id for i in range(40)]
    assert_exact(store)
    for round_ in range(12):
        for message_id in rng.sample(ids, 10):
            _move(store, message_id, rng.choice(list(MessageState)), at=_recent(rng))
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
        _move(store, store.insert_message(_new(1000 + i)).message.id, S.OK, at=_recent(rng))
    assert_exact(store)
    store.counts.fold()
    store.counts.fold()
    assert_exact(store)
    assert store.counts.by_state()[1] == 0 or store.engine.dialect.name == "postgresql"
    assert _kept(store) == _group_by_minute(store)  # everything folded, the deleted messages' minutes taken out


def test_a_fold_never_passes_a_transaction_that_commits_later(postgres_store: MessageStore) -> None:
    store = postgres_store
    first, second = (store.insert_message(_new(i)).message.id for i in range(2))
    now = datetime.now(UTC)
    with store.engine.connect() as late:  # takes transition ids below the ones committed after it
        with late.begin():
            _move(store, first, S.PROCESSING, late)
            _move(store, second, S.FAILED, late, at=now - timedelta(minutes=3))
            others = [store.insert_message(_new(i)).message.id for i in range(2, 6)]
            _move(store, others[0], S.OK, at=now - timedelta(minutes=2))
            for _ in range(3):
                store.counts.fold()
            assert_exact(store)  # the open transaction is not seen, by the counts or by the GROUP BY
            assert store.counts.by_state()[0] == {S.NEW: 5, S.OK: 1}
            assert store.counts.finished_by_minute(None, now - timedelta(hours=1)) == {
                (_minute(now - timedelta(minutes=2)), S.OK): 1}
        assert_exact(store)  # committed now, below transitions committed before it: counted all the same
        assert store.counts.by_state()[0] == {S.NEW: 3, S.OK: 1, S.PROCESSING: 1, S.FAILED: 1}
    for _ in range(3):
        store.counts.fold()
        assert_exact(store)
    assert store.counts.by_state()[1] == 0
    assert _kept(store) == _group_by_minute(store) == {
        (_minute(now - timedelta(minutes=3)), S.FAILED): 1, (_minute(now - timedelta(minutes=2)), S.OK): 1}


@pytest.mark.parametrize("joins", ["as the planner picks", "nested loops only"])
def test_the_routes_of_a_fold_are_looked_up_once_a_message_whatever_the_plan(postgres_store: MessageStore,
                                                                            joins: str) -> None:
    """The fold's transitions by route (PostgreSQL) read each message's route once, by its primary key, and never
    again: on a fresh, never analyzed store (the range estimated at one row) the routes looked up were joined back
    to the transitions by a nested loop that re-ran every lookup for every transition (3,000 transitions: 9,000,000
    lookups, 11.7 s of database CPU in one fold of a node)."""
    store = postgres_store
    ids = [outcome.message.id for outcome in store.insert_messages([_new(i) for i in range(120)])]
    for message_id in ids[:40]:  # some messages with two transitions in the range
        _move(store, message_id, S.PROCESSING)
    statement = counts_module._transitions(0, 1_000_000, by_route=True, lateral=True)  # a fold's range: (low, high]
    with store.engine.connect() as connection, connection.begin():
        if joins == "nested loops only":
            connection.exec_driver_sql("SET LOCAL enable_hashjoin = off")
            connection.exec_driver_sql("SET LOCAL enable_mergejoin = off")
        compiled = statement.compile(dialect=connection.dialect, compile_kwargs={"literal_binds": True})
        plan = connection.exec_driver_sql(f"EXPLAIN (ANALYZE, FORMAT JSON) {compiled}").scalar_one()
        rows = connection.execute(statement).all()

    def nodes(node: dict[str, Any]) -> list[dict[str, Any]]:
        return [node, *(below for child in node.get("Plans", []) for below in nodes(child))]

    lookups = sum(node["Actual Loops"] * node["Actual Rows"] for node in nodes(plan[0]["Plan"])
                  if node.get("Relation Name") == "message")
    assert lookups == len(ids), plan
    assert sorted((service, operation, to_state, from_state, n) for service, operation, to_state, from_state, n
                  in rows) == [("s", "o0", "NEW", None, 60), ("s", "o0", "PROCESSING", "NEW", 20),
                               ("s", "o1", "NEW", None, 60), ("s", "o1", "PROCESSING", "NEW", 20)]


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
                            _move(store, message_id, rng.choice(list(MessageState)), connection, _recent(rng))
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
        _move(store, store.insert_message(_new(i)).message.id, S.OK, at=datetime.now(UTC))
    store.counts.fold()
    store.counts.fold()
    assert sum(_kept(store).values()) == 3
    with store.begin() as connection:
        connection.exec_driver_sql("TRUNCATE message RESTART IDENTITY CASCADE")
    assert store.counts.by_state()[0] == {}
    assert _kept(store) == {}  # and the finished minutes
    store.insert_message(_new(9))
    assert_exact(store)


def test_recount_repairs_writes_that_bypassed_the_store(store: MessageStore) -> None:
    ids = [store.insert_message(_new(i)).message.id for i in range(3)]
    with store.begin() as connection:  # no transition row: the counts cannot see it
        connection.execute(sa.update(message_table).where(message_table.c.id == ids[0]).values(state=S.FAILED))
    assert store.counts.by_state()[0] == {S.NEW: 3}
    store.counts.recount()
    assert_exact(store)


def test_finished_minutes_count_restarts_and_deletions_and_keep_two_hours(store: MessageStore) -> None:
    now = datetime.now(UTC)

    def ago(minutes: int) -> datetime:
        return now - timedelta(minutes=minutes)

    ids = [store.insert_message(_new(i)).message.id for i in range(4)]
    # a restart: FAILED, back to NEW, then OK: two transitions into a final state, each in its minute
    for state, minutes in [(S.PROCESSING, 50), (S.FAILED, 49), (S.NEW, 30), (S.PROCESSING, 30), (S.OK, 12)]:
        _move(store, ids[0], state, at=ago(minutes))
    _move(store, ids[1], S.SKIPPED, at=ago(49))
    _move(store, ids[2], S.CANCEL, at=ago(180))  # older than FINISHED_KEPT: no fold keeps its minute
    _move(store, ids[3], S.OK, at=ago(5))
    expected = {(_minute(ago(49)), S.FAILED): 1, (_minute(ago(49)), S.SKIPPED): 1, (_minute(ago(12)), S.OK): 1,
                (_minute(ago(5)), S.OK): 1}
    assert store.counts.finished_by_minute(None, ago(60)) == expected  # all after the mark
    assert store.counts.finished_by_minute(None, ago(10)) == {(_minute(ago(5)), S.OK): 1}
    store.counts.fold()
    store.counts.fold()
    assert _kept(store) == expected
    assert store.counts.finished_by_minute(None, ago(60)) == expected  # all folded
    assert_exact(store)
    # a folded message deleted: its delta takes it out at once, the next fold moves the delta into the minutes
    _delete(store, ids[3:])
    del expected[_minute(ago(5)), S.OK]
    with store.engine.connect() as connection:
        assert connection.execute(sa.select(sa.func.count()).select_from(message_finished_delta_table)).scalar() == 1
    assert store.counts.finished_by_minute(None, ago(60)) == expected
    assert_exact(store)
    store.counts.fold()
    with store.engine.connect() as connection:
        assert connection.execute(sa.select(sa.func.count()).select_from(message_finished_delta_table)).scalar() == 0
    assert _kept(store) == expected
    assert_exact(store)
    # a minute older than FINISHED_KEPT (kept while it was recent) goes at the next fold
    with store.begin() as connection:
        connection.execute(sa.insert(message_finished_minute_table).values(
            minute=_minute(now - FINISHED_KEPT - timedelta(minutes=3)), state=S.OK, n=7))
    store.counts.fold()
    assert _kept(store) == expected
    assert_exact(store)


def test_a_node_with_its_clock_hours_ahead_prunes_no_minute(store: MessageStore,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """PostgreSQL: the fold prunes and skips by the database's clock, which every node of the store shares."""
    if store.engine.dialect.name != "postgresql":
        pytest.skip("SQLite's store is one process's file: the process's clock is the store's")
    now = datetime.now(UTC)
    ids = [store.insert_message(_new(i)).message.id for i in range(2)]
    _move(store, ids[0], S.OK, at=now - timedelta(minutes=20))
    store.counts.fold()
    store.counts.fold()
    expected = {(_minute(now - timedelta(minutes=20)), S.OK): 1}
    assert _kept(store) == expected

    class AheadClock(datetime):
        @classmethod
        def now(cls, tz: Any = None) -> Any:
            return datetime.now(tz) + timedelta(hours=3)

    monkeypatch.setattr(counts_module, "datetime", AheadClock)
    _move(store, ids[1], S.FAILED, at=now - timedelta(minutes=5))  # stamped by a node whose clock is right
    store.counts.fold()
    store.counts.fold()
    assert _kept(store) == {**expected, (_minute(now - timedelta(minutes=5)), S.FAILED): 1}
    assert_exact(store)


def test_recount_rebuilds_the_finished_minutes(store: MessageStore) -> None:
    rng = random.Random(17)
    ids = [store.insert_message(_new(i)).message.id for i in range(12)]
    for message_id in ids:
        for state in rng.sample([S.PROCESSING, S.OK, S.FAILED, S.NEW, S.CANCEL], 3):
            _move(store, message_id, state, at=_recent(rng))
    _move(store, ids[0], S.SKIPPED, at=datetime.now(UTC) - timedelta(hours=3))  # too old to keep
    store.counts.fold()
    store.counts.fold()
    with store.begin() as connection:  # the table spoilt behind the store's back
        connection.execute(sa.delete(message_finished_minute_table))
        connection.execute(sa.insert(message_finished_minute_table).values(
            minute=_minute(datetime.now(UTC)), state=S.OK, n=99))
    since = datetime.now(UTC) - timedelta(minutes=110)
    assert store.counts.finished_by_minute(None, since) != _group_by_minute(store, since)
    store.counts.recount()
    assert _kept(store) == _group_by_minute(store, since) != {}
    assert_exact(store)


def test_finished_by_minute_refuses_a_naive_since(store: MessageStore) -> None:
    with pytest.raises(sa.exc.StatementError, match="naive"):
        store.counts.finished_by_minute(None, datetime(2026, 11, 27, 12, 0))


def test_retention_deletions_are_counted(store: MessageStore) -> None:
    from datetime import timedelta

    from openroute.runtime.retention import RetentionJob, RetentionPolicy

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
        _downgrade(store, "0013")
        tables = set(sa.inspect(store.engine).get_table_names())
        assert not {"message_count", "message_count_mark", "message_count_delta"} & tables
        _delete(store, ids[1:2])  # the trigger went with the tables
        assert store.count_by_state() == {S.FAILED: 1, S.PARTLY_FAILED: 1, S.NEW: 2}
    finally:
        store.dispose()


def _downgrade(store: MessageStore, revision: str) -> None:
    with store.begin() as connection:
        config = alembic_config(store.url)
        config.attributes["connection"] = connection
        command.downgrade(config, revision)


def test_migration_0017_keeps_the_folded_finished_minutes_and_goes_back(database_url: str) -> None:
    store = MessageStore(database_url)
    now = datetime.now(UTC)

    def ago(minutes: int) -> datetime:
        return now - timedelta(minutes=minutes)

    try:
        store.upgrade("0013")
        ids = [store.insert_message(_new(i)).message.id for i in range(6)]
        _move(store, ids[0], S.OK, at=ago(10))
        for state, minutes in [(S.FAILED, 30), (S.NEW, 29), (S.OK, 28)]:  # a restart
            _move(store, ids[1], state, at=ago(minutes))
        _move(store, ids[2], S.CANCEL, at=ago(200))  # older than FINISHED_KEPT: not filled in
        store.upgrade("0016")  # 0014 folds them all: the mark is the highest transition
        _move(store, ids[3], S.SKIPPED, at=ago(3))  # after the mark: read from the tail, not filled in
        with store.engine.connect() as connection:
            mark = connection.exec_driver_sql("SELECT transition_id FROM message_count_mark").scalar_one()
        store.upgrade()
        assert "message_finished_minute" in sa.inspect(store.engine).get_table_names()
        since = ago(110)
        folded = _group_by_minute(store, since, message_transition_table.c.id <= mark)
        assert _kept(store) == folded == {(_minute(ago(10)), S.OK): 1, (_minute(ago(30)), S.FAILED): 1,
                                          (_minute(ago(28)), S.OK): 1}
        assert store.counts.finished_by_minute(None, since) == {**folded, (_minute(ago(3)), S.SKIPPED): 1}
        assert_exact(store)
        _delete(store, ids[:1])
        assert_exact(store)
        _downgrade(store, "0016")
        tables = set(sa.inspect(store.engine).get_table_names())
        assert not {"message_finished_minute", "message_finished_delta"} & tables
        _delete(store, ids[1:2])  # the trigger went with the tables
        assert store.count_by_state() == {S.CANCEL: 1, S.SKIPPED: 1, S.NEW: 2}
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


def test_the_fold_reads_each_message_once_on_a_table_without_statistics(postgres_store: MessageStore) -> None:
    """A young store's tables have no statistics yet (every range estimated at one row): the fold's grouped read of
    the transitions stays a few buffers per message (its route and its transitions looked up once each), where a
    join of the transitions back to the messages' routes ran the routes' subquery once per transition."""
    messages = 400
    with postgres_store.begin() as connection:
        connection.exec_driver_sql(
            "INSERT INTO message (correlation_id, source_system, service, operation, payload, content_type, headers, "
            "state, failed_count, receive_ts, last_update_ts, version, custom_data, business_errors) "
            "SELECT 'c' || g, 'CRM', 'shop', 'order', '{}', 'application/json', '{}', 'OK', 0, now(), now(), 2, '{}', "
            f"'[]' FROM generate_series(1, {messages}) g")
        connection.exec_driver_sql(
            "INSERT INTO message_transition (message_id, from_state, to_state, at, node_id, attempt, cause) "
            "SELECT m.id, s.f, s.t, now(), 'n', 0, 'engine' FROM message m, (VALUES (NULL, 'NEW'), "
            "('NEW', 'PROCESSING'), ('PROCESSING', 'OK')) s(f, t) ORDER BY m.id")
        statement = counts_module._transitions(0, 3 * messages, by_route=True, lateral=True)
        sql = str(statement.compile(dialect=connection.dialect, compile_kwargs={"literal_binds": True}))
        plan = connection.exec_driver_sql(f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {sql}").scalar_one()
        rows = connection.execute(statement).all()
    assert sorted((row[2], row[3], row[4]) for row in rows) == [("NEW", None, 400), ("OK", "PROCESSING", 400),
                                                                ("PROCESSING", "NEW", 400)]
    buffers = plan[0]["Plan"]["Shared Hit Blocks"] + plan[0]["Plan"]["Shared Read Blocks"]
    assert buffers < 10 * messages  # ~6 per message; joined back per transition it was ~2,400 per message here
