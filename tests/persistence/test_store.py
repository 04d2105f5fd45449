"""The store on each real database: migrations, duplicates, timestamps, external calls, configuration."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from openroute.persistence import (
    Base,
    ExternalCallStatus,
    MessageState,
    MessageStore,
    NewMessage,
    create_store_engine,
    message_table,
)

from openroute import states
from tests.lifecycle.conftest import START


def _new(key: str = "c-1", source: str = "crm", **extra: object) -> NewMessage:
    return NewMessage(service="s", operation="o", payload="<p/>", content_type="text/xml", correlation_id=key,
                      source_system=source, receive_ts=START, **extra)  # type: ignore[arg-type]


# migration 0016's index is keyed on expressions, which SQLAlchemy does not reflect on PostgreSQL (it warns);
# tests/lifecycle/test_migrations.py checks that index in the catalogue
@pytest.mark.filterwarnings("ignore:Skipped unsupported reflection of expression-based index")
@pytest.mark.filterwarnings("ignore:autogenerate skipping metadata-specified expression-based index")
def test_migrations_build_exactly_the_models(store: MessageStore) -> None:
    assert store.current_revision() == MessageStore.head_revision()
    with store.engine.connect() as connection:
        differences = compare_metadata(MigrationContext.configure(connection), Base.metadata)
    # SQLite cannot tell a timezone-aware timestamp from a naive one; nothing else may differ
    # Alembic does not read Index.ddl_if: the trigram indexes exist on PostgreSQL only (migration 0009)
    dialect = store.engine.dialect.name
    elsewhere = {i.name for table in Base.metadata.tables.values() for i in table.indexes
                 if i._ddl_if is not None and i._ddl_if.dialect not in (None, dialect)}
    relevant = [d for d in differences if not (isinstance(d, list) and d and d[0][0] == "modify_type")
                and not (isinstance(d, tuple) and d[0] == "add_index" and d[1].name in elsewhere)]
    assert relevant == []
    names = set(sa.inspect(store.engine).get_table_names())
    assert {"message", "external_call", "confirmation", "node", "alembic_version"} <= names


def test_upgrade_is_idempotent(store: MessageStore) -> None:
    store.upgrade()
    assert store.current_revision() == MessageStore.head_revision()


# migration 0016's index is keyed on expressions, which SQLAlchemy does not reflect on PostgreSQL (it warns);
# tests/lifecycle/test_migrations.py checks that index in the catalogue
@pytest.mark.filterwarnings("ignore:Skipped unsupported reflection of expression-based index")
def test_message_indexes_cover_the_engine_queries(store: MessageStore) -> None:
    indexes = {tuple(i["column_names"]) for i in sa.inspect(store.engine).get_indexes("message")}
    for needed in [("state", "next_attempt_at"), ("state", "start_process_ts"), ("state", "receive_ts"),
                   ("node_id", "state"), ("entity_type", "object_id", "receive_ts"), ("funnel_value", "state"),
                   ("parent_id",)]:
        assert needed in indexes


def test_insert_stores_new_and_duplicates_are_reported(store: MessageStore) -> None:
    first = store.insert_message(_new(headers={"h": "v"}, object_id="o-1"))
    assert not first.duplicate
    row = store.get(first.message.id)
    assert row == first.message
    assert row.state is MessageState.NEW and row.version == 0 and row.headers == {"h": "v"}
    again = store.insert_message(_new())
    assert again.duplicate and again.message.id == first.message.id
    other_source = store.insert_message(_new(source="erp"))
    assert not other_source.duplicate
    assert store.count_by_state() == {MessageState.NEW: 2}


def test_unique_source_and_correlation_is_a_database_constraint(store: MessageStore) -> None:
    store.insert_message(_new())
    values = {c.name: None for c in message_table.c if c.name != "id"}
    values.update(correlation_id="c-1", source_system="crm", service="s", operation="o", payload="p",
                  content_type="t", headers={}, state=MessageState.NEW, failed_count=0, receive_ts=START,
                  last_update_ts=START, custom_data={}, business_errors=[], version=0)
    with pytest.raises(sa.exc.IntegrityError), store.begin() as connection:
        connection.execute(message_table.insert().values(values))


def test_timestamps_come_back_aware_utc(store: MessageStore) -> None:
    cest = timezone(timedelta(hours=2))
    stamp = datetime(2024, 6, 1, 14, 0, tzinfo=cest)
    message = store.insert_message(_new(msg_ts=stamp)).message
    row = store.get(message.id)
    assert row.msg_ts == stamp and row.msg_ts.tzinfo == UTC
    with pytest.raises(sa.exc.StatementError, match="naive"):
        store.insert_message(_new(key="naive", msg_ts=datetime(2024, 1, 1)))
    assert store.get(message.id + 1) is None


def test_external_call_records(store: MessageStore) -> None:
    message = store.insert_message(_new()).message
    assert store.calls.get(message.id, "k") is None
    store.calls.record(message.id, "k", ExternalCallStatus.FAILED, START, error="down")
    store.calls.record(message.id, "k", ExternalCallStatus.OK, START, result={"n": 1})
    call = store.calls.get(message.id, "k")
    assert call is not None and call.status is ExternalCallStatus.OK and call.attempts == 2 and call.result == {"n": 1}
    # an OK record is never overwritten by a later write
    store.calls.record(message.id, "k", ExternalCallStatus.FAILED, START, error="late")
    assert store.calls.get(message.id, "k") == call


def test_queries_of_the_repoll(store: MessageStore) -> None:
    message = store.insert_message(_new()).message
    assert store.received_before(MessageState.NEW, START, 10) == [message]
    assert store.received_before(MessageState.NEW, START - timedelta(seconds=1), 10) == []
    assert store.due([MessageState.PARTLY_FAILED], START, 10) == []


def test_nodes_are_registered(store: MessageStore) -> None:
    store.nodes.register("n1", START)
    store.nodes.heartbeat("n1", START + timedelta(seconds=5))
    store.nodes.stopped("n1", START + timedelta(seconds=9))
    store.nodes.register("n1", START + timedelta(seconds=10))
    with store.begin() as connection:
        row = connection.execute(sa.text("select heartbeat_at, stopped_at from node where id = 'n1'")).one()
    assert row.stopped_at is None


def test_sqlite_file_uses_wal_and_busy_timeout(sqlite_url: str) -> None:
    store = MessageStore(sqlite_url)
    with store.engine.connect() as connection:
        assert connection.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
        assert connection.exec_driver_sql("PRAGMA busy_timeout").scalar() == 30000
    store.dispose()


def _pings(engine: sa.Engine, monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """The connections ``engine``'s dialect pings from now on (recorded, then pinged)."""
    pinged: list[object] = []
    ping = engine.dialect.do_ping

    def recording(dbapi_connection: object) -> bool:
        pinged.append(dbapi_connection)
        return ping(dbapi_connection)

    monkeypatch.setattr(engine.dialect, "do_ping", recording)
    return pinged


def test_a_postgresql_connection_is_pinged_only_after_it_sat_idle(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    busy = create_store_engine(postgres_url, pool_size=1)
    pinged = _pings(busy, monkeypatch)
    for _ in range(3):  # a fresh connection, then one back from the pool within the idle time
        with busy.connect() as connection:
            connection.exec_driver_sql("SELECT 1")
    assert pinged == []
    busy.dispose()

    idle = create_store_engine(postgres_url, pool_size=1, ping_after_idle=0.0)  # every connection counts as idle
    pinged = _pings(idle, monkeypatch)
    with idle.connect() as connection:
        backend = connection.exec_driver_sql("SELECT pg_backend_pid()").scalar_one()
    with idle.connect() as connection:  # pinged, and the same connection (alive)
        assert connection.exec_driver_sql("SELECT pg_backend_pid()").scalar_one() == backend
    assert len(pinged) == 2
    killer = sa.create_engine(postgres_url)
    with killer.connect() as connection:  # the database drops the pooled connection while it is idle
        connection.exec_driver_sql(f"SELECT pg_terminate_backend({backend})")
    killer.dispose()
    with idle.connect() as connection:  # the ping finds it dead: the pool hands out a new one, no error
        assert connection.exec_driver_sql("SELECT pg_backend_pid()").scalar_one() != backend
    idle.dispose()


@pytest.mark.parametrize("url", ["sqlite://", "sqlite:///:memory:", "mysql://u@h/db"])
def test_unusable_urls_are_refused(url: str) -> None:
    with pytest.raises(ValueError):
        MessageStore(url)


def test_every_write_of_a_message_bumps_its_version_so_a_version_pins_the_state(store: MessageStore) -> None:
    """The claim and the outcome UPDATE match (id, version) only: this is what makes that as safe as a state check."""
    message = store.insert_message(_new("pin")).message
    seen = [(message.version, message.state)]
    single = states.claim(store, [message], "node-1", START)[0]
    seen.append((single.version, single.state))
    retry = states.transition(store, single, MessageState.PARTLY_FAILED, START, {"failed_count": 1})
    seen.append((retry.version, retry.state))
    other = store.insert_message(_new("pin-2")).message
    grouped = {m.id: m for m in states.claim(store, [retry, other], "node-1", START)}
    seen.append((grouped[message.id].version, grouped[message.id].state))
    [done] = states.transition_many(store, [(grouped[message.id], MessageState.OK, START, {})])
    assert not isinstance(done, Exception)
    seen.append((done.version, done.state))
    assert [v for v, _s in seen] == [0, 1, 2, 3, 4]
    assert store.get(message.id) == done
    # every older snapshot is refused, whatever transition it asks for
    for stale in (message, retry):
        assert states.claim(store, [stale], "node-2", START) == []
    assert not store.transitions.apply((single.id, single.version, single.state, MessageState.OK, START, {}))
    assert store.get(message.id) == done


def test_a_transition_writes_only_the_columns_that_changed(store: MessageStore) -> None:
    statements: list[str] = []

    def listener(_conn: object, _cursor: object, statement: str, *_rest: object) -> None:
        if statement.startswith("UPDATE message"):
            statements.append(statement.split(" WHERE ")[0])

    first, second = (store.insert_message(_new(key)).message for key in ("w-1", "w-2"))
    claimed = states.claim(store, [first, second], "node-1", START)
    sa.event.listen(store.engine, "before_cursor_execute", listener)
    try:
        unchanged = {"custom_data": {}, "business_errors": [], "next_attempt_at": None, "failed_count": 0}
        [done] = states.transition_many(store, [(claimed[0], MessageState.OK, START, unchanged)])
        retry = states.transition(store, claimed[1], MessageState.PARTLY_FAILED, START,
                                  {**unchanged, "custom_data": {"step": 2}, "failed_count": 1})
    finally:
        sa.event.remove(store.engine, "before_cursor_execute", listener)
    assert len(statements) == 2
    assert "custom_data" not in statements[0] and "business_errors" not in statements[0]
    assert "next_attempt_at" not in statements[0] and "failed_count" not in statements[0]
    assert "custom_data" in statements[1] and "failed_count" in statements[1] and "business_errors" not in statements[1]
    assert store.get(done.id) == done and store.get(retry.id) == retry
    assert retry.custom_data == {"step": 2} and retry.failed_count == 1 and done.custom_data == {}
