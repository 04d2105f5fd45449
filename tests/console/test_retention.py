"""Retention of final messages without Spark: per-state keep times, batches, cascades, one node, /metrics."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import httpx
import pytest
import sqlalchemy as sa
from openroute.persistence import MessageState, MessageStore
from openroute.persistence import confirmation_table as confirmations
from openroute.persistence import external_call_table as calls
from openroute.persistence.models import message_transition_table as transitions

from openroute.definitions.errors import ConfigurationError
from openroute.engine import Engine, EngineSettings
from openroute.runtime.retention import ADVISORY_LOCK_KEY, RetentionJob, RetentionPolicy
from openroute.server import create_app
from tests.console.conftest import auth, populate, registry

LATER = datetime.now(UTC) + timedelta(days=2)


@pytest.fixture
def ids(store: MessageStore) -> dict[str, int]:
    return asyncio.run(populate(store))


def rows(store: MessageStore, table: sa.Table, message_id: int) -> int:
    with store.engine.connect() as connection:
        return int(connection.execute(
            sa.select(sa.func.count()).select_from(table).where(table.c.message_id == message_id)).scalar_one())


def test_bad_policies_name_every_problem() -> None:
    with pytest.raises(ConfigurationError) as caught:
        RetentionPolicy(keep={"NEW": timedelta(days=1), "SLEEPING": timedelta(days=1), "OK": timedelta(days=-1)},
                        batch_size=0, interval=timedelta(0))
    text = str(caught.value)
    for part in ("NEW is not final", "unknown state 'SLEEPING'", "keep.OK must be a non-negative", "batch_size",
                 "interval"):
        assert part in text
    assert RetentionPolicy(keep={"ok": timedelta(days=1)}).keep == {MessageState.OK: timedelta(days=1)}


def test_final_messages_past_their_keep_time_go_with_everything_stored_about_them(
    store: MessageStore, ids: dict[str, int]
) -> None:
    job = RetentionJob(store, RetentionPolicy(keep={"OK": timedelta(days=1), "FAILED": timedelta(days=7)}),
                       now=lambda: LATER)
    assert rows(store, transitions, ids["ok"]) == 3
    assert job.run_once() == {MessageState.OK: 1}
    assert store.get(ids["ok"]) is None and rows(store, transitions, ids["ok"]) == 0
    assert {store.get(ids[n]).state for n in ("failed1", "failed2")} == {MessageState.FAILED}  # kept 7 days
    assert store.get(ids["new"]).state is MessageState.NEW  # never deleted: not final
    assert job.run_once() == {}  # nothing left to delete


def test_a_parent_waits_for_its_children_and_goes_with_them(store: MessageStore, ids: dict[str, int]) -> None:
    job = RetentionJob(store, RetentionPolicy(keep={"FAILED": timedelta(0), "CANCEL": timedelta(0)}),
                       now=lambda: LATER)
    parent = ids["failed1"]
    assert rows(store, calls, parent) == 1 and rows(store, confirmations, parent) == 1
    assert job.run_once() == {MessageState.FAILED: 1}  # failed2; failed1 has a NEW child
    assert store.get(parent) is not None and store.get(ids["failed2"]) is None
    engine = Engine(store, registry(), EngineSettings(repoll_interval=None, node_id="ops"))

    async def cancel_child() -> None:
        await engine.cancel(ids["child"], "admin:test")
        await engine.stop()

    asyncio.run(cancel_child())
    assert job.run_once() == {MessageState.FAILED: 1}  # children are not counted on their own
    assert store.get(parent) is None and store.get(ids["child"]) is None
    assert rows(store, calls, parent) == 0 and rows(store, confirmations, parent) == 0
    assert rows(store, transitions, ids["child"]) == 0


def test_batches_and_their_limit(store: MessageStore, ids: dict[str, int]) -> None:
    policy = RetentionPolicy(keep={"FAILED": timedelta(0), "OK": timedelta(0)}, batch_size=1, max_batches=1)
    job = RetentionJob(store, policy, now=lambda: LATER)
    assert sum(job.run_once().values()) == 1  # one batch of one; the other waits for the next run
    assert sum(job.run_once().values()) == 1
    assert job.run_once() == {}
    assert job.deleted == {MessageState.OK: 1, MessageState.FAILED: 1}  # failed1 stays: its child is open


@pytest.mark.postgres
def test_one_node_at_a_time_on_postgresql(postgres_url: str) -> None:
    store = MessageStore(postgres_url)
    store.create_schema()
    try:
        ids = asyncio.run(populate(store))
        job = RetentionJob(store, RetentionPolicy(keep={"OK": timedelta(0)}), now=lambda: LATER)
        with store.engine.begin() as other_node:
            assert other_node.execute(sa.select(sa.func.pg_try_advisory_xact_lock(ADVISORY_LOCK_KEY))).scalar_one()
            assert job.delete_batch() is None and job.run_once() == {}
            assert store.get(ids["ok"]) is not None
        assert job.run_once() == {MessageState.OK: 1}
    finally:
        store.dispose()


async def test_the_server_runs_the_job_and_counts_it_in_metrics(store: MessageStore) -> None:
    ids = await populate(store)
    engine = Engine(store, registry(), EngineSettings(repoll_interval=None, node_id="served"))
    policy = RetentionPolicy(keep={"OK": timedelta(0)}, interval=timedelta(hours=1))
    app = create_app(engine, admin_auth=auth(), manage_engine=False, retention=policy)
    job = app.state.retention
    assert isinstance(job, RetentionJob)
    async with app.router.lifespan_context(app):  # the lifespan runs the job once at start
        for _ in range(200):  # bounded: the first run is a few statements
            if job.deleted:
                break
            await asyncio.sleep(0.05)
        assert job.deleted == {MessageState.OK: 1} and store.get(ids["ok"]) is None
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as http:
            text = (await http.get("/metrics")).text
        assert 'openroute_retention_deleted_total{state="OK"} 1.0' in text
    await engine.stop()
