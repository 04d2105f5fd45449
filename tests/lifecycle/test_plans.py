"""The plans PostgreSQL picks for the hot-path statements on an aged, analyzed table.

Once a table has statistics (autovacuum's ANALYZE on any live table), a state predicate in the claim or the
outcome UPDATE tempts the planner onto ``ix_message_state_*``: the statistics say no row is PROCESSING, so an
index scan on state looks free, while at run time it walks the whole backlog for every statement. The store
keys these statements by primary key and version only; these tests EXPLAIN the statements it really emits,
with their real parameters, under custom and generic plans.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
import sqlalchemy as sa
from openroute.persistence import MessageState, MessageStore, message_table
from openroute.persistence._statements import statement_sizes

from benchmarks.store_fill import age
from openroute.engine import states
from tests.services import scratch_postgres_store

FINAL_ROWS = 100_000
BACKLOG = 10_000
NOW = datetime(2024, 6, 1, tzinfo=UTC)


@pytest.fixture(scope="module")
def aged_sqlite(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MessageStore]:
    """The same aged table in a SQLite file, analyzed (sqlite_stat1)."""
    store = MessageStore(f"sqlite:///{tmp_path_factory.mktemp('aged') / 'aged.db'}")
    store.create_schema()
    age(store.engine, final=FINAL_ROWS, backlog=BACKLOG)
    yield store
    store.dispose()


@pytest.fixture(scope="module")
def aged_store() -> Iterator[MessageStore]:
    """100,000 OK rows and a backlog of 10,000 NEW rows, analyzed (one database for the module)."""
    with scratch_postgres_store("openroute_plans") as store:
        age(store.engine, final=FINAL_ROWS, backlog=BACKLOG)
        yield store


def _capture_updates(store: MessageStore, work: Any) -> list[tuple[str, Any]]:
    """The UPDATE statements (text, first parameter set) ``work(connection)`` emits, rolled back afterwards."""
    captured: list[tuple[str, Any]] = []

    def listener(_conn: Any, _cursor: Any, statement: str, parameters: Any, _context: Any, many: bool) -> None:
        if statement.lstrip().upper().startswith("UPDATE MESSAGE"):
            captured.append((statement, parameters[0] if many else parameters))

    sa.event.listen(store.engine, "before_cursor_execute", listener)
    try:
        with store.engine.connect() as connection:
            transaction = connection.begin()
            work(connection)
            transaction.rollback()
    finally:
        sa.event.remove(store.engine, "before_cursor_execute", listener)
    return captured


def _plan(store: MessageStore, statement: str, parameters: Any, mode: str) -> dict[str, Any]:
    with store.engine.connect() as connection:
        connection.exec_driver_sql(f"SET plan_cache_mode = {mode}")
        cursor = connection.connection.dbapi_connection.cursor()  # type: ignore[union-attr]
        cursor.execute("EXPLAIN (FORMAT JSON) " + statement, parameters)
        document = cursor.fetchone()[0]
        cursor.close()
    return (json.loads(document) if isinstance(document, str) else document)[0]["Plan"]


def _scans(plan: dict[str, Any]) -> list[tuple[str, str | None]]:
    """(node type, index name) of every node of the plan tree."""
    found = [(plan["Node Type"], plan.get("Index Name"))]
    for child in plan.get("Plans", []):
        found.extend(_scans(child))
    return found


def _backlog(store: MessageStore, count: int, offset: int = 0) -> list[Any]:
    c = message_table.c
    first = FINAL_ROWS + 1 + offset
    return store.find(c.id >= first, c.id < first + count)


def _assert_primary_key_plans(store: MessageStore, captured: list[tuple[str, Any]]) -> None:
    assert captured, "the store emitted no UPDATE"
    for statement, parameters in captured:
        for mode in ("force_custom_plan", "force_generic_plan"):
            scans = _scans(_plan(store, statement, parameters, mode))
            indexes = {index for _node, index in scans if index}
            assert not {i for i in indexes if i.startswith("ix_message_state")}, (mode, statement, scans)
            assert ("Seq Scan", None) not in scans, (mode, statement, scans)
            assert indexes == {"message_pkey"}, (mode, statement, scans)


@pytest.mark.postgres
def test_the_aged_table_tempts_the_planner_onto_a_state_index(aged_store: MessageStore) -> None:
    """The fixture reproduces the trap: the same UPDATE with a state predicate is planned on a state index."""
    [message] = _backlog(aged_store, 1)
    statement = "UPDATE message SET version = version + 1 WHERE id = %(id)s AND version = %(v)s AND state = %(s)s"
    scans = _scans(_plan(aged_store, statement, {"id": message.id, "v": 1, "s": "PROCESSING"}, "force_custom_plan"))
    assert any(index and index.startswith("ix_message_state") for _node, index in scans), scans


@pytest.mark.postgres
def test_claims_are_planned_on_the_primary_key(aged_store: MessageStore) -> None:
    one, group = _backlog(aged_store, 1), _backlog(aged_store, 39, offset=1)

    def work(connection: sa.Connection) -> None:
        assert len(states.claim(aged_store, one, "node-1", NOW, connection)) == 1
        assert len(states.claim(aged_store, group, "node-1", NOW, connection)) == 39

    captured = _capture_updates(aged_store, work)
    assert len(captured) == 2
    _assert_primary_key_plans(aged_store, captured)


@pytest.mark.postgres
def test_outcome_updates_are_planned_on_the_primary_key(aged_store: MessageStore) -> None:
    messages = _backlog(aged_store, 40, offset=100)

    def work(connection: sa.Connection) -> None:
        claimed = states.claim(aged_store, messages, "node-1", NOW, connection)
        # the engine's writer: the OK outcomes of a commit in one executemany, a retry alone with its changes
        results = states.transition_many(
            aged_store, [(m, MessageState.OK, NOW, {}) for m in claimed[1:]], connection
        )
        assert all(not isinstance(r, Exception) for r in results)
        retry = {"failed_count": 1, "next_attempt_at": NOW, "last_error_code": "E", "last_error_text": "boom"}
        states.transition(aged_store, claimed[0], MessageState.PARTLY_FAILED, NOW, retry, connection)

    captured = [c for c in _capture_updates(aged_store, work) if "IN (SELECT" not in c[0]]
    assert len(captured) == 2
    _assert_primary_key_plans(aged_store, captured)


def test_on_sqlite_every_hot_path_update_searches_the_primary_key(aged_sqlite: MessageStore) -> None:
    """SQLite cannot use an index for a row-value IN alone: the grouped claim lists the ids as well."""
    messages = _backlog(aged_sqlite, 40)

    def work(connection: sa.Connection) -> None:
        claimed = states.claim(aged_sqlite, messages[:1], "node-1", NOW, connection)
        claimed += states.claim(aged_sqlite, messages[1:], "node-1", NOW, connection)
        assert len(claimed) == 40
        states.transition_many(aged_sqlite, [(m, MessageState.OK, NOW, {}) for m in claimed[1:]], connection)
        states.transition(aged_sqlite, claimed[0], MessageState.PARTLY_FAILED, NOW, {"failed_count": 1}, connection)

    captured = _capture_updates(aged_sqlite, work)
    # the claim of 39 runs as statements of 32, 4, 2 and 1 rows (texts the driver has compiled already)
    assert len(captured) == 1 + len(statement_sizes(39)) + 2 == 7
    for statement, parameters in captured:
        with aged_sqlite.engine.connect() as connection:
            cursor = connection.connection.dbapi_connection.cursor()  # type: ignore[union-attr]
            plan = [row[3] for row in cursor.execute("EXPLAIN QUERY PLAN " + statement, parameters).fetchall()]
            cursor.close()
        assert "SEARCH message USING INTEGER PRIMARY KEY (rowid=?)" in plan, (statement, plan)
        assert not [step for step in plan if step.startswith("SCAN message")], (statement, plan)


@pytest.mark.postgres
def test_the_feed_the_release_and_the_funnel_queue_read_their_partial_indexes(aged_store: MessageStore) -> None:
    """Waiting on events reads only what waits: the feeder's due messages from ``ix_message_due`` (in due order, no
    sort over the backlog), a release from ``ix_message_parked``, a funnel's next message (one funnel's, or a group
    commit's funnels' at once) and the repoll's stalled queues from ``ix_message_funnel_queue``; never a scan of the
    table, under custom and generic plans. A parked backlog of 5,000, 2,000 due and a funnel queue are made in a
    transaction (analyzed there) and rolled back."""
    c = message_table.c
    first = FINAL_ROWS + 1
    captured: list[tuple[str, Any]] = []

    def listener(_conn: Any, _cursor: Any, statement: str, parameters: Any, _context: Any, _many: bool) -> None:
        read = ("SELECT MESSAGE", "UPDATE MESSAGE", "SELECT DISTINCT", "SELECT HEAD")
        if statement.lstrip().upper().startswith(read):
            captured.append((statement, parameters))

    with aged_store.engine.connect() as connection:
        transaction = connection.begin()
        connection.execute(sa.update(message_table).where(c.id >= first, c.id < first + 5000).values(
            state=MessageState.POSTPONED, parked_on="REMOTE", last_error_code="CIRCUIT_OPEN"))
        connection.execute(sa.update(message_table).where(c.id >= first + 5000, c.id < first + 7000).values(
            state=MessageState.PARTLY_FAILED, next_attempt_at=NOW))
        connection.execute(sa.update(message_table).where(c.id >= first + 7000, c.id < first + 7100).values(
            state=MessageState.POSTPONED, funnel_value="f-1", last_error_code="FUNNEL"))
        connection.exec_driver_sql("ANALYZE message")
        sa.event.listen(aged_store.engine, "before_cursor_execute", listener)
        try:
            assert len(aged_store.ready(NOW, None, 64, connection)) == 64
            assert aged_store.funnels.queue_head("f-1", connection) is not None
            assert list(aged_store.funnels.queue_heads(["f-1", "f-2"], connection)) == ["f-1"]
            assert aged_store.funnels.stalled(100, NOW, connection) == ["f-1"]
            assert aged_store.parking.release("REMOTE", NOW, 1, failed_before=NOW, connection=connection) == 1
            assert aged_store.parking.release("REMOTE", NOW, connection=connection) == 4999
        finally:
            sa.event.remove(aged_store.engine, "before_cursor_execute", listener)
        cursor = connection.connection.dbapi_connection.cursor()  # type: ignore[union-attr]
        expected = {"ix_message_due", "ix_message_funnel_queue", "ix_message_parked"}
        used: set[str] = set()
        for statement, parameters in captured:
            for mode in ("force_custom_plan", "force_generic_plan"):
                cursor.execute(f"SET LOCAL plan_cache_mode = {mode}")
                cursor.execute("EXPLAIN (FORMAT JSON) " + statement, parameters)
                document = cursor.fetchone()[0]
                scans = _scans((json.loads(document) if isinstance(document, str) else document)[0]["Plan"])
                assert ("Seq Scan", None) not in scans, (mode, statement, scans)
                assert not [node for node, _index in scans if node == "Sort"] or "row_number" in statement, \
                    (mode, statement, scans)
                used |= {index for _node, index in scans if index in expected}
        cursor.close()
        transaction.rollback()
    assert used == expected, used


@pytest.mark.postgres
@pytest.mark.parametrize("database_url", ["postgres"], indirect=True)
def test_a_node_refreshes_the_statistics_once_a_tenth_of_the_table_changed(database_url: str) -> None:
    """With autovacuum off (as on the test server) nothing else would: the repoll asks the store every run."""
    store = MessageStore(database_url)
    try:
        store.create_schema()
        with store.engine.begin() as connection:
            connection.exec_driver_sql(
                "INSERT INTO message (correlation_id, source_system, service, operation, payload, content_type, "
                "headers, state, failed_count, receive_ts, last_update_ts, custom_data, business_errors, version) "
                "SELECT 's-' || n, 'S', 'orders', 'create', '{}', 'application/json', '{}', 'NEW', 0, now(), now(), "
                "'{}', '[]', 0 FROM generate_series(1, 3000) AS n")
        with store.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
            connection.exec_driver_sql("ANALYZE message")
        _until_counted(store, lambda changed: changed == 0)
        assert not store.refresh_stale_statistics(), "nothing changed since the analysis"
        with store.engine.begin() as connection:
            connection.exec_driver_sql("UPDATE message SET state = 'POSTPONED' WHERE mod(id, 2) = 0")
        _until_counted(store, lambda changed: changed >= 1500)  # the server counts behind the commit
        assert store.refresh_stale_statistics(), "half of the table changed"
        assert not store.refresh_stale_statistics(), "analyzed just now"
    finally:
        store.dispose()


def _until_counted(store: MessageStore, done: Any, timeout: float = 10) -> None:
    """Bounded wait for PostgreSQL's statistics of the message table (flushed by each backend within a second)."""
    import time

    deadline = time.monotonic() + timeout
    while True:
        with store.engine.connect() as connection:
            connection.exec_driver_sql("SELECT pg_stat_clear_snapshot()")
            changed = connection.exec_driver_sql(
                "SELECT n_mod_since_analyze FROM pg_stat_user_tables WHERE relname = 'message'").scalar()
        if done(changed or 0):
            return
        assert time.monotonic() < deadline, f"the table's statistics did not count the change within {timeout} s"
        time.sleep(0.1)
