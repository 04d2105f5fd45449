"""Upgrading a store that holds messages: every migration after 0003 keeps the rows and adds what it promises."""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime, timedelta

import pytest
import sqlalchemy as sa
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from openroute.persistence import FINAL_STATES, Base, MessageState, MessageStore, NewMessage, message_table
from openroute.persistence.counts import FINISHED_KEPT
from openroute.persistence.database import alembic_config
from openroute.persistence.messages import insert_values
from openroute.persistence.models import message_transition_table

from openroute.admin import parse_filters, search_messages
from tests.persistence.conftest import START

SEARCH_INDEXES = {
    "ix_message_receive": ["receive_ts", "id"],
    "ix_message_correlation": ["correlation_id"],
    "ix_message_object": ["object_id", "receive_ts"],
    "ix_message_process": ["process_id", "receive_ts"],
}


def _index_definitions(store: MessageStore) -> dict[str, str]:
    """Name -> SQL of the message table's indexes, from the database's catalogue (SQLAlchemy's inspector leaves
    out PostgreSQL's indexes on expressions)."""
    with store.engine.connect() as connection:
        if connection.dialect.name == "postgresql":
            rows = connection.exec_driver_sql("SELECT indexname, indexdef FROM pg_indexes WHERE tablename = 'message'")
        else:
            rows = connection.exec_driver_sql(
                "SELECT name, sql FROM sqlite_master WHERE type = 'index' AND tbl_name = 'message'")
        return {name: sql or "" for name, sql in rows}


# migration 0016's index is keyed on expressions, which the inspector does not reflect on PostgreSQL
@pytest.mark.filterwarnings("ignore:Skipped unsupported reflection of expression-based index")
def test_upgrade_from_0003_with_messages_in_the_store(database_url: str) -> None:
    store = MessageStore(database_url)
    try:
        store.upgrade("0003")
        assert store.current_revision() == "0003"
        ids = []
        with store.engine.begin() as connection:  # the rows as 0003 knew them (no column of a later migration)
            known = {column["name"] for column in sa.inspect(connection).get_columns("message")}
            for i in range(5):
                new = NewMessage(service="s", operation="o", payload="{}", content_type="application/json",
                                 correlation_id=f"m-{i}", source_system="crm", receive_ts=START,
                                 object_id=f"obj-{i % 2}", process_id="p-1")
                values = {name: value for name, value in insert_values(new).items() if name in known}
                if i == 0:  # ended OK after a failed attempt, its error left on the row before 0009
                    values.update(state=MessageState.OK, failed_count=1, last_error_code="HLR_DOWN",
                                  last_error_text="hlr is down")
                if i == 1:  # FAILED keeps its error
                    values.update(state=MessageState.FAILED, last_error_code="HLR_DOWN", last_error_text="down")
                ids.append(connection.execute(sa.insert(message_table).values(values)).inserted_primary_key[0])
            # transitions as 0003 wrote them, spread over minutes: finished ones recent, one too old to keep
            now = datetime.now(UTC)
            for message_id, state, minutes in [(ids[0], "FAILED", 40), (ids[0], "NEW", 39), (ids[0], "OK", 7),
                                               (ids[1], "FAILED", 7), (ids[2], "OK", 150), (ids[3], "PROCESSING", 2)]:
                connection.execute(sa.insert(message_transition_table).values(  # 0003's columns (and defaults)
                    message_id=message_id, to_state=state, at=now - timedelta(minutes=minutes)))

        store.upgrade()

        assert store.current_revision() == MessageStore.head_revision()
        after = [store.get(i) for i in ids]
        assert [m.correlation_id for m in after] == [f"m-{i}" for i in range(5)]  # type: ignore[union-attr]
        # migration 0009: an OK message has no current error any more; a FAILED one keeps its own
        assert (after[0].state, after[0].last_error_code, after[0].last_error_text) == (  # type: ignore[union-attr]
            MessageState.OK, None, None)
        assert after[1].last_error_code == "HLR_DOWN"  # type: ignore[union-attr]
        assert {m.traceparent for m in after} == {None}  # type: ignore[union-attr]  # migration 0012: untraced rows
        # migration 0017: the finished minutes filled from the transitions the counts folded (all of them, at 0014)
        assert "message_finished_minute" in sa.inspect(store.engine).get_table_names()
        with store.engine.connect() as connection:
            transitions = connection.execute(sa.text("SELECT at, to_state FROM message_transition")).all()
            kept = connection.execute(sa.text("SELECT minute, state, n FROM message_finished_minute")).all()

        def minute(at: datetime | str) -> datetime:  # SQLite hands the stored text back
            at = datetime.fromisoformat(at) if isinstance(at, str) else at
            return (at.replace(tzinfo=UTC) if at.tzinfo is None else at.astimezone(UTC)).replace(second=0,
                                                                                                  microsecond=0)

        cutoff = now - FINISHED_KEPT
        group_by = Counter((minute(at), state) for at, state in transitions
                           if state in FINAL_STATES and minute(at) >= cutoff)
        assert {(minute(at), state): n for at, state, n in kept} == group_by
        assert sorted(group_by.values()) == [1, 1, 1]  # FAILED and OK of the restart, the other FAILED (same minute)
        before = after
        indexes = {i["name"]: i["column_names"] for i in sa.inspect(store.engine).get_indexes("message")}
        for name, columns in SEARCH_INDEXES.items():
            assert indexes.get(name) == columns
        # migration 0013: the operation alone, an error code with a service; short trigram pending lists
        assert indexes.get("ix_message_operation") == ["operation", "receive_ts"]
        assert indexes.get("ix_message_error_service") == ["last_error_code", "service", "receive_ts"]
        # migration 0016 (0015's index replaced): the failing messages by route and last change
        definitions = _index_definitions(store)
        route_key = definitions["ix_message_failing_route"].replace("(", "").replace(")", "").replace("::text", "")
        assert "service || ''" in route_key and "operation || ''" in route_key and "last_update_ts, id" in route_key
        assert "ix_message_failing_update" not in definitions
        if store.engine.dialect.name == "postgresql":
            with store.engine.connect() as connection:
                options = dict(connection.execute(sa.text(
                    "SELECT relname, reloptions FROM pg_class WHERE relname LIKE 'ix_message_%_trgm'")).all())
                error_text = connection.execute(sa.text(
                    "SELECT indexdef FROM pg_indexes WHERE indexname = 'ix_message_error_text_trgm'")).scalar_one()
            # migration 0018: the payload's index on a copy of every payload, filled behind the commit
            assert options == {"ix_message_payload_text_trgm": ["gin_pending_list_limit=128"],
                               "ix_message_error_text_trgm": ["gin_pending_list_limit=128"]}
            assert "WHERE (last_error_text IS NOT NULL)" in error_text
        with store.engine.connect() as connection:
            copies = dict(connection.execute(sa.text("SELECT message_id, payload FROM message_payload_text")).all())
            pending = connection.execute(sa.text("SELECT count(*) FROM message_payload_pending")).scalar_one()
        # every stored payload copied by the upgrade on PostgreSQL, none waiting; SQLite keeps both tables empty
        assert copies == ({i: "{}" for i in ids} if store.engine.dialect.name == "postgresql" else {})
        assert pending == 0
        with store.engine.connect() as connection:
            page = search_messages(connection, parse_filters({"object_id": "obj-0", "process_id": "p-1"}))
        assert [m.id for m in page.items] == [ids[4], ids[2], ids[0]] and page.total == 3
        with store.engine.begin() as connection:  # and back down: the indexes go, the rows stay
            config = alembic_config(store.url)
            config.attributes["connection"] = connection
            command.downgrade(config, "0003")
        names = set(_index_definitions(store))
        assert not names & {*SEARCH_INDEXES, "ix_message_operation", "ix_message_error_service",
                            "ix_message_failing_update", "ix_message_failing_route"}
        assert not {"message_finished_minute", "message_payload_text", "message_payload_pending"} & set(
            sa.inspect(store.engine).get_table_names())
        with store.engine.connect() as connection:  # the rows stay (read with 0003's columns)
            kept = connection.execute(sa.text("SELECT id, correlation_id, state FROM message ORDER BY id")).all()
        assert [tuple(r) for r in kept] == [(m.id, m.correlation_id, m.state.value) for m in before]
    finally:
        store.dispose()


# migration 0016's index is keyed on expressions, which SQLAlchemy does not reflect on PostgreSQL (it warns);
# test_upgrade_from_0003_with_messages_in_the_store checks that index in the catalogue
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
# test_upgrade_from_0003_with_messages_in_the_store checks that index in the catalogue
@pytest.mark.filterwarnings("ignore:Skipped unsupported reflection of expression-based index")
def test_message_indexes_cover_the_engine_queries(store: MessageStore) -> None:
    indexes = {tuple(i["column_names"]) for i in sa.inspect(store.engine).get_indexes("message")}
    for needed in [("state", "next_attempt_at"), ("state", "start_process_ts"), ("state", "receive_ts"),
                   ("node_id", "state"), ("entity_type", "object_id", "receive_ts"), ("funnel_value", "state"),
                   ("parent_id",)]:
        assert needed in indexes
