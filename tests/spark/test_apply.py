"""Applying a plan set-based (staging table, one UPDATE and one INSERT per batch) leaves the store row by row as the
engine's per-message path does, on SQLite and PostgreSQL."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from openroute.persistence import MessageState, MessageStore
from openroute.persistence.models import message_table, message_transition_table

from openroute.engine import states
from openroute.spark.apply import ApplyResult, apply_plan
from openroute.spark.reprocess import reprocess
from tests.services import require_database
from tests.spark.stores import NOW, reprocess_store

S = MessageState


def _rows(url: str) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    """Every message row (all columns) and every transition row (all but its serial id), in a stable order."""
    t = message_transition_table.c
    engine = sa.create_engine(url)
    with engine.connect() as connection:
        messages = [tuple(r) for r in connection.execute(sa.select(message_table).order_by(message_table.c.id))]
        transitions = [tuple(r) for r in connection.execute(
            sa.select(*(c for c in message_transition_table.c if c.key != "id")).order_by(t.message_id, t.id))]
    engine.dispose()
    return messages, transitions


@pytest.fixture(params=["sqlite", "postgres"])
def twin_urls(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, str]]:
    """Two fresh, empty databases of one kind: one for each way of applying."""
    require_database(request.param)
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'set.db'}", f"sqlite:///{tmp_path / 'rows.db'}"
        return
    fresh = request.getfixturevalue("fresh_databases")
    urls = (fresh.take(), fresh.take())
    try:
        yield urls
    finally:
        for url in urls:
            fresh.release(url)


def _plan_move_and_apply(spark: Any, url: str, out: Path, set_based: bool) -> tuple[ApplyResult, ApplyResult]:
    """The decision store planned (FAILED and CANCEL), then one planned message changed by an operator and one
    deleted before the apply; the plan applied in batches of 3 and applied again."""
    ids = reprocess_store(url)
    reprocess(spark, url, states=("FAILED", "CANCEL"), out=out, job_id="twin", partitions=2)
    store = MessageStore(url)
    moved = store.get(ids["f_plain"])
    assert moved is not None
    states.transition(store, moved, S.PARTLY_FAILED, NOW, {"next_attempt_at": NOW}, cause="admin:ann")
    with store.begin() as connection:
        connection.execute(sa.delete(message_transition_table).where(
            message_transition_table.c.message_id == ids["f_old"]))
        connection.execute(sa.delete(message_table).where(message_table.c.id == ids["f_old"]))
    store.dispose()
    first = apply_plan(spark, url, out, batch_size=3, now=lambda: NOW, set_based=set_based)
    again = apply_plan(spark, url, out, batch_size=3, now=lambda: NOW, set_based=set_based)
    return first, again


def test_set_based_apply_leaves_every_row_as_the_per_message_path(
    spark: Any, twin_urls: tuple[str, str], tmp_path: Path
) -> None:
    set_url, rows_url = twin_urls
    by_set = _plan_move_and_apply(spark, set_url, tmp_path / "set", set_based=True)
    by_rows = _plan_move_and_apply(spark, rows_url, tmp_path / "rows", set_based=False)
    assert by_set == by_rows
    first, again = by_set
    assert (first.restarted, first.skipped, len(first.moved), len(first.missing)) == (5, 1, 1, 1)
    assert (again.restarted, again.skipped, again.already_applied) == (0, 0, 6)
    set_messages, set_transitions = _rows(set_url)
    rows_messages, rows_transitions = _rows(rows_url)
    assert len(set_messages) == len(rows_messages)
    for by_set_row, by_rows_row in zip(set_messages, rows_messages, strict=True):
        assert by_set_row == by_rows_row
    assert set_transitions == rows_transitions
    assert sum("reprocess:twin" in row for row in set_transitions) == 6  # one transition row per written message


def test_each_batch_is_one_update_and_one_insert_however_many_rows(
    spark: Any, sqlite_url: str, tmp_path: Path
) -> None:
    """SQLite's own trace of the statements the apply ran: per batch of 4 messages one UPDATE of ``message`` and
    one INSERT of ``message_transition`` (the staging rows go to the connection's temporary table)."""
    from tests.spark.stores import many_failed

    many_failed(sqlite_url, 8)
    reprocess(spark, sqlite_url, out=tmp_path / "job", job_id="count", partitions=2)
    statements: list[str] = []

    def trace(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.set_trace_callback(statements.append)

    sa.event.listen(sa.pool.Pool, "connect", trace)
    try:
        applied = apply_plan(spark, sqlite_url, tmp_path / "job", batch_size=4)
    finally:
        sa.event.remove(sa.pool.Pool, "connect", trace)
    assert (applied.restarted, applied.batches) == (8, 2)
    updates = [s for s in statements if s.lstrip().upper().startswith("UPDATE MESSAGE ")]
    inserts = [s for s in statements if s.lstrip().upper().startswith("INSERT INTO MESSAGE_TRANSITION")]
    assert len(updates) == 2 and len(inserts) == 2, statements
    assert all("FROM transition_staging" in s for s in updates + inserts)
