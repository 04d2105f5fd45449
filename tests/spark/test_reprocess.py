"""Bulk reprocessing on real Spark and each real database: decisions, filters, apply exactly once, kill -9."""

from __future__ import annotations

import importlib
import json
import re
import signal
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from openroute.confirmation import ConfirmationCallback, ConfirmationRequest, ConfirmationService
from openroute.persistence import MessageState, MessageStore
from openroute.persistence.models import confirmation_table, message_transition_table

from openroute.cli import main
from openroute.definitions.errors import BusinessError
from openroute.dsl import Application, route
from openroute.engine import Exchange, states
from openroute.spark.apply import LEAVE, RESTART, SKIP_OBSOLETE, apply_plan, parse_rate
from openroute.spark.reprocess import ReprocessFilter, parse_time, plan_frame, reprocess
from tests.services import require_database
from tests.spark.processes import SparkCli
from tests.spark.stores import NOW, many_failed, reprocess_store

S = MessageState


def _decisions(spark: Any, url: str, job: str = "t", **filters: Any) -> dict[int, tuple[str, str | None]]:
    frame = plan_frame(spark, url, job, ReprocessFilter(**filters), partitions=2)
    return {r["id"]: (r["decision"], r["reason"]) for r in frame.select("id", "decision", "reason").collect()}


def _reprocess_rows(url: str, job_id: str) -> dict[int, int]:
    """message id -> how many transition rows the job wrote for it."""
    t = message_transition_table.c
    engine = sa.create_engine(url)
    with engine.connect() as connection:
        rows = connection.execute(
            sa.select(t.message_id, sa.func.count()).where(t.cause == f"reprocess:{job_id}").group_by(t.message_id)
        ).all()
    engine.dispose()
    return {int(m): int(n) for m, n in rows}


def test_dry_run_plans_one_decision_per_candidate_and_changes_nothing(
    spark: Any, database_url: str, tmp_path: Path
) -> None:
    ids = reprocess_store(database_url)
    store = MessageStore(database_url)
    before = {m.id: m.version for m in store.find()}
    result = reprocess(spark, database_url, out=tmp_path / "job", job_id="job-1", partitions=2, csv=True)
    assert result.job_id == "job-1" and result.applied is None
    plan = {r["id"]: r for r in spark.read.parquet(str(result.plan_path)).collect()}
    expected = {
        ids["f_obsolete"]: SKIP_OBSOLETE, ids["f_restart"]: RESTART, ids["f_plain"]: RESTART,
        ids["f_business"]: RESTART, ids["parent"]: RESTART, ids["child"]: LEAVE, ids["f_old"]: RESTART,
        ids["f_other_source"]: RESTART,
    }
    assert {i: r["decision"] for i, r in plan.items()} == expected
    assert plan[ids["f_obsolete"]]["newer_ok_id"] == ids["ok_newer"]
    assert plan[ids["f_obsolete"]]["reason"] == f"newer message #{ids['ok_newer']} of the same customer ended OK"
    assert plan[ids["child"]]["reason"] == f"parent #{ids['parent']} is final (FAILED): restart the parent instead"
    assert result.summary == [
        ("billing/charge", RESTART, 1), ("crm/setCustomer", RESTART, 4), ("crm/setCustomer", SKIP_OBSOLETE, 1),
        ("shop/createOrder", RESTART, 1), ("shop/createOrderLine", LEAVE, 1),
    ]
    assert result.counts() == {RESTART: 6, SKIP_OBSOLETE: 1, LEAVE: 1}
    csv_rows = spark.read.option("header", True).csv(str(tmp_path / "job" / "plan_csv")).count()
    assert csv_rows == 8
    meta = json.loads((tmp_path / "job" / "job.json").read_text())
    assert meta["job_id"] == "job-1" and meta["filters"]["states"] == ["FAILED"]
    assert {m.id: m.version for m in store.find()} == before, "a dry run changes nothing"
    store.dispose()


def test_filters_select_the_candidates(spark: Any, database_url: str, tmp_path: Path) -> None:
    ids = reprocess_store(database_url)
    window = _decisions(spark, database_url, service="crm", source_system="CRM",
                        since=parse_time("2024-06-10T06:00"), until=parse_time("2024-06-10T08:00:00+00:00"))
    assert set(window) == {ids["f_obsolete"], ids["f_restart"], ids["f_plain"]}
    errors = _decisions(spark, database_url, error_code="MNO_DOWN", error_text="connection REFUSED")
    assert set(errors) == {ids["f_obsolete"], ids["f_restart"], ids["f_plain"], ids["f_old"]}
    assert set(_decisions(spark, database_url, business_error_code="BLOCKED")) == {ids["f_business"]}
    by_state = _decisions(spark, database_url, states=(S.CANCEL, S.PARTLY_FAILED), operation="setCustomer")
    assert by_state == {ids["cancelled"]: (RESTART, None),
                        ids["waiting"]: (LEAVE, "state PARTLY_FAILED cannot be restarted")}
    id_file = tmp_path / "ids.txt"
    id_file.write_text(f"{ids['f_plain']}\n\n {ids['f_old']} \n{ids['ok_newer']}\n")
    object_file = tmp_path / "objects.txt"
    object_file.write_text("C-1\nC-3\n")
    assert set(_decisions(spark, database_url, ids_file=str(id_file))) == {ids["f_plain"], ids["f_old"]}
    assert set(_decisions(spark, database_url, object_ids_file=str(object_file))) == {
        ids["f_obsolete"], ids["f_restart"]
    }


def test_a_filtered_plan_reads_only_what_the_database_selected(
    spark: Any, database_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    ids = reprocess_store(database_url)
    frame = plan_frame(spark, database_url, "t", ReprocessFilter(service="crm", error_code="MNO_DOWN"), partitions=2)
    capsys.readouterr()
    frame.explain(mode="formatted")
    plan = capsys.readouterr().out
    # each scan of the formatted plan: "(n) Scan JDBCRelation(<what Spark reads, over lines>) [numPartitions=k]"
    relations = re.findall(r"^\(\d+\) Scan JDBCRelation\((.*?)\) \[numPartitions=(\d+)\]", plan, re.S | re.M)
    # every JDBC read is a subquery filtered by the database: the candidates, their entities' OK messages, their
    # parents, the job's own transitions; none reads a whole table
    assert len(relations) == 4, plan
    assert all(what.startswith("(SELECT") and "WHERE" in what for what, _partitions in relations), plan
    assert any("service = 'crm'" in what and "last_error_code = 'MNO_DOWN'" in what for what, _n in relations), plan
    assert any(partitions == "2" for _what, partitions in relations), plan
    decided = {r["id"]: r["decision"] for r in frame.select("id", "decision").collect()}
    assert decided == {ids["f_obsolete"]: SKIP_OBSOLETE, ids["f_restart"]: RESTART, ids["f_plain"]: RESTART,
                       ids["f_old"]: RESTART}


def test_bad_filters_and_options_are_refused_before_anything_runs(spark: Any, sqlite_url: str,
                                                                    tmp_path: Path) -> None:
    reprocess_store(sqlite_url)
    with pytest.raises(ValueError, match="not a time: 'yesterday'"):
        reprocess(spark, sqlite_url, since="yesterday", out=tmp_path / "a")
    with pytest.raises(ValueError, match=r"since .* must be before until"):
        reprocess(spark, sqlite_url, since="2024-06-02", until="2024-06-01", out=tmp_path / "a")
    with pytest.raises(ValueError, match="not a rate: 'fast'"):
        reprocess(spark, sqlite_url, rate="fast", out=tmp_path / "a")
    with pytest.raises(ValueError, match="'NOPE' is not a valid MessageState"):
        reprocess(spark, sqlite_url, states=["NOPE"], out=tmp_path / "a")
    with pytest.raises(ValueError, match="ids file: no such file"):
        reprocess(spark, sqlite_url, ids_file=str(tmp_path / "missing.txt"), out=tmp_path / "a")
    with pytest.raises(ValueError, match="job id must be"):
        reprocess(spark, sqlite_url, job_id="a b", out=tmp_path / "a")
    bad_ids = tmp_path / "bad.txt"
    bad_ids.write_text("12\nC-1\n")
    with pytest.raises(ValueError, match="not message ids: 'C-1'"):
        reprocess(spark, sqlite_url, ids_file=str(bad_ids), out=tmp_path / "a")
    with pytest.raises(ValueError, match="no reprocessing plan in"):
        apply_plan(spark, sqlite_url, tmp_path / "nothing")
    assert not (tmp_path / "a" / "job.json").exists()
    assert parse_rate("50/m") == pytest.approx(50 / 60) and parse_rate("3") == 3.0 and parse_rate(None) is None
    assert parse_time("7d", now=NOW) == NOW.replace(day=3)


def test_apply_restarts_each_planned_message_once_and_leaves_moved_ones(
    spark: Any, database_url: str, tmp_path: Path
) -> None:
    ids = reprocess_store(database_url)
    out = tmp_path / "job"
    reprocess(spark, database_url, out=out, job_id="job-2", partitions=2)
    store = MessageStore(database_url)
    # an operator restarts one planned message between the plan and its application: its version moves
    moved = store.get(ids["f_plain"])
    states.transition(store, moved, S.PARTLY_FAILED, NOW, {"next_attempt_at": NOW}, cause="admin:ann")
    applied = apply_plan(spark, database_url, out, batch_size=2)
    assert (applied.restarted, applied.skipped, applied.already_applied) == (5, 1, 0)
    assert applied.moved == [ids["f_plain"]] and applied.missing == [] and applied.batches == 4
    for name in ("f_restart", "f_business", "parent", "f_old", "f_other_source"):
        row = store.get(ids[name])
        assert row.state is S.PARTLY_FAILED and row.failed_count == 0 and row.next_attempt_at is not None
    skipped = store.get(ids["f_obsolete"])
    assert skipped.state is S.SKIPPED and skipped.last_error_code == "OBSOLETE"
    assert store.get(ids["child"]).state is S.FAILED
    last = store.transitions.of(ids["f_obsolete"])[-1]
    assert (last["from_state"], last["to_state"], last["cause"]) == (S.FAILED, S.SKIPPED, "reprocess:job-2")
    again = apply_plan(spark, database_url, out)
    assert (again.restarted, again.skipped, again.already_applied) == (0, 0, 6)
    assert again.moved == [ids["f_plain"]]
    assert _reprocess_rows(database_url, "job-2") == {
        ids[n]: 1 for n in ("f_restart", "f_business", "parent", "f_old", "f_other_source", "f_obsolete")
    }
    # re-planning the same job: what it restarted is LEAVE even when it failed again
    for name in ("f_restart", "f_old"):
        message = store.get(ids[name])
        message = states.claim(store, [message], "n1", NOW)[0]
        states.transition(store, message, S.FAILED, NOW, {"last_error_code": "DOWN"})
    replanned = _decisions(spark, database_url, job="job-2")
    assert replanned[ids["f_restart"]] == (LEAVE, "already restarted by this job")
    assert replanned[ids["f_old"]] == (LEAVE, "already restarted by this job")
    store.dispose()


def test_rate_limits_how_fast_messages_are_released(spark: Any, sqlite_url: str, tmp_path: Path) -> None:
    many_failed(sqlite_url, 12)
    out = tmp_path / "job"
    reprocess(spark, sqlite_url, out=out, job_id="slow", partitions=2)
    sleeps: list[float] = []
    module = importlib.import_module("openroute.spark.apply")
    real = module._Pacer

    class Recording(real):  # type: ignore[misc, valid-type]
        def __init__(self, rate: float | None) -> None:
            super().__init__(rate, clock=lambda: 0.0, sleep=sleeps.append)

    module._Pacer = Recording  # type: ignore[misc]
    try:
        applied = apply_plan(spark, sqlite_url, out, rate="4/s", batch_size=100)
    finally:
        module._Pacer = real  # type: ignore[misc]
    assert applied.restarted == 12 and applied.batches == 3  # batches of at most one second's releases
    assert sleeps == [1.0, 2.0, 3.0]  # with a frozen clock: the time 4, 8, 12 releases need at 4/s


@dataclass
class KilledApply:
    """One ``openroute spark reprocess --apply`` child applying a plan of 30 restarts, to be killed at its pause."""

    url: str
    planned: list[int]
    out: Path
    child: SparkCli


@pytest.fixture(scope="module")
def killed_applies(spark: Any, module_databases: dict[str, str],
                   tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, KilledApply]]:
    """Per database, 30 FAILED messages, a plan to restart them, and a child applying it in batches of two that
    pauses with its third batch written in its transaction, not committed (``OPENROUTE_SPARK_PAUSE_AT``). The
    children start together (each is mostly the start of one JVM, and the two overlap on this machine's cores) and
    wait there until their test kills them; whatever is left is killed at the end."""
    started: dict[str, KilledApply] = {}
    try:
        for database, url in module_databases.items():
            folder = tmp_path_factory.mktemp(f"killed-{database}")
            planned = many_failed(url, 30)
            out = folder / "job"
            reprocess(spark, url, out=out, job_id="killed", partitions=2)
            child = SparkCli(["reprocess", "--database-url", url, "--master", "local[1]", "--plan", str(out),
                              "--apply", "--batch-size", "2", "--rate", "100/s"], folder,
                             env={"OPENROUTE_SPARK_PAUSE_AT": "batch-written:3"})
            started[database] = KilledApply(url, planned, out, child)
        yield started
    finally:
        for killed in started.values():
            killed.child.kill()


@pytest.mark.parametrize("database", ["sqlite", "postgres"])
def test_killed_mid_apply_then_resumed_restarts_every_message_exactly_once(
    spark: Any, killed_applies: dict[str, KilledApply], database: str
) -> None:
    # kill -9 on each database with the third batch written in its transaction, not committed: the database itself
    # rolls that batch back; the job pauses there, so the kill lands at a known point
    require_database(database)
    killed = killed_applies[database]
    url, planned, out, child = killed.url, killed.planned, killed.out, killed.child
    try:
        child.wait_for_line(r"paused at batch-written #3 ", timeout=240)
    finally:
        child.kill()  # kill -9 the CLI and its JVM
    assert child.process.returncode == -signal.SIGKILL
    done = _reprocess_rows(url, "killed")
    assert set(done) == set(planned[:4]) and set(done.values()) == {1}, "two batches of two committed, the third not"
    resumed = apply_plan(spark, url, out)
    assert resumed.already_applied == len(done) and resumed.restarted == 30 - len(done) and resumed.moved == []
    assert _reprocess_rows(url, "killed") == {i: 1 for i in planned}
    store = MessageStore(url)
    assert {m.state for m in store.find()} == {S.PARTLY_FAILED}
    store.dispose()


def test_cli_dry_run_then_apply_and_one_line_errors(
    spark: Any, sqlite_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ids = reprocess_store(sqlite_url)
    out = tmp_path / "cli"
    assert main(["spark", "reprocess", "--database-url", sqlite_url, "--service", "billing", "--out", str(out),
                 "--job-id", "cli-1", "--partitions", "2"]) == 0
    shown = capsys.readouterr().out
    assert "job cli-1: plan in" in shown and "billing/charge  RESTART" in shown and "dry run: nothing changed" in shown
    assert "spark session ready in " in shown
    assert "1 message(s): below ~1,000,000 plain SQL is quicker than Spark's start-up" in shown
    assert main(["spark", "reprocess", "--database-url", sqlite_url, "--plan", str(out), "--apply"]) == 0
    assert "applied: restarted 1, skipped as obsolete 0" in capsys.readouterr().out
    assert MessageStore(sqlite_url).get(ids["f_business"]).state is S.PARTLY_FAILED
    for argv, says in [
        (["--plan", str(out)], "applies a plan: add --apply"),
        (["--since", "soon"], "not a time: 'soon'"),
        (["--partitions", "0"], "--partitions must be >= 1, got 0"),
        (["--database-url", "postgresql+psycopg://nobody@127.0.0.1:1/none"],
         "cannot read tables message, message_transition from jdbc:postgresql://127.0.0.1:1/none"),
        (["--database-url", f"sqlite:///{tmp_path}/none.db"], "no SQLite store at"),
    ]:
        full = ["spark", "reprocess", "--database-url", sqlite_url, "--out", str(tmp_path / "x"), *argv]
        assert main(full) == 2, argv
        err = capsys.readouterr().err
        assert says in err and err.count("\n") == 1 and "at org." not in err, err


class Recorder(ConfirmationCallback):
    """Confirms every source system by remembering (message id, state)."""

    def __init__(self) -> None:
        self.received: list[tuple[int, str]] = []

    async def confirm(self, request: ConfirmationRequest) -> None:
        self.received.append((int(request.message_id), request.state))


def _confirmations(store: MessageStore) -> dict[int, tuple[str, str, int]]:
    c = confirmation_table.c
    with store.engine.connect() as connection:
        rows = connection.execute(sa.select(c.message_id, c.outcome_state, c.status, c.attempts)).all()
    return {int(r.message_id): (str(r.outcome_state), str(r.status), int(r.attempts)) for r in rows}


async def test_skip_obsolete_confirms_like_the_engine_ending_a_restarted_message_skipped(
    spark: Any, database_url: str, route_test_kit: Any, tmp_path: Path
) -> None:
    def customer(exchange: Exchange) -> None:
        if json.loads(exchange.payload).get("blocked"):
            raise BusinessError("BLOCKED", "customer blocked")

    kit = await route_test_kit(Application(
        route("crm", "setCustomer").json().object_id(json="$.customer").entity_type("customer").obsolete_check()
        .process(customer)), database_url=database_url)
    recorder = Recorder()
    service = ConfirmationService(kit.store, recorder, clock=kit.clock)
    kit.engine.on_final_state_in_transaction(service.on_final_state_tx)  # as create_app wires confirmations
    kit.engine.on_final_state(service.on_final_state)
    failed: dict[str, int] = {}
    for path, customer_id in (("engine", "C-1"), ("job", "C-2")):  # per path: FAILED, then a newer one OK
        older = await kit.send_json("crm", "setCustomer", {"customer": customer_id, "blocked": True},
                                    source_system="CRM")
        await kit.settle()
        kit.clock.advance(timedelta(seconds=1))
        newer = await kit.send_json("crm", "setCustomer", {"customer": customer_id}, source_system="CRM")
        await kit.settle()
        kit.clock.advance(timedelta(seconds=1))
        kit.assert_state(older.message_id, S.FAILED)
        kit.assert_state(newer.message_id, S.OK)
        failed[path] = older.message_id
    before, sent_before = _confirmations(kit.store), list(recorder.received)
    assert before[failed["engine"]] == before[failed["job"]] == ("FAILED", "SENT", 1)

    # the engine's way to SKIPPED: restart it, the obsolete check ends it (final-state hooks in that transaction)
    await kit.engine.restart(failed["engine"])
    await kit.settle()
    kit.assert_state(failed["engine"], S.SKIPPED)
    # the job's way: SKIP_OBSOLETE applied in a batch
    ids_file = tmp_path / "ids.txt"
    ids_file.write_text(f"{failed['job']}\n")
    planned = reprocess(spark, database_url, ids_file=str(ids_file), out=tmp_path / "job", job_id="skip",
                        partitions=2)
    assert planned.counts() == {SKIP_OBSOLETE: 1}
    assert apply_plan(spark, database_url, tmp_path / "job", now=kit.clock.now).skipped == 1
    kit.assert_state(failed["job"], S.SKIPPED)

    rows = {path: kit.store.get(i) for path, i in failed.items()}
    columns = ("state", "failed_count", "business_errors", "last_error_code", "last_error_text", "next_attempt_at")
    seen = {path: {c: str(getattr(row, c)).replace(row.object_id or "", "<id>") for c in columns}
            for path, row in rows.items()}
    assert seen["job"] == seen["engine"], "the job's SKIPPED row is the engine's (engine/outcome.py)"
    after = _confirmations(kit.store)
    change = {path: (before[i], after.get(i)) for path, i in failed.items()}
    assert change["job"] == change["engine"], "the job leaves the confirmations as the engine does"
    # SKIPPED is never confirmed: the source system keeps the FAILED it was told, nothing new is owed or sent
    assert change["engine"] == (("FAILED", "SENT", 1), ("FAILED", "SENT", 1)) and after == before
    assert await service.sweep_missing() == 0
    await service.process_due()
    assert recorder.received == sent_before


_RULE_COLUMNS = ("state", "failed_count", "business_errors", "last_error_code", "last_error_text")


def _rule_view(store: MessageStore, message_id: int) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    """What the outcome rules decide for a message: its rule columns and its last transition (cause aside)."""
    message = store.get(message_id)
    assert message is not None and message.next_attempt_at is not None
    last = store.transitions.of(message_id)[-1]
    return (tuple(getattr(message, c) for c in _RULE_COLUMNS),
            (last["from_state"], last["to_state"], last["error_code"]))


def test_restart_by_the_job_the_admin_engine_and_the_cli_leaves_the_same_rows(
    spark: Any, database_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """One set of rules (engine/outcome.py): the same FAILED message restarted through Engine.restart (what the
    admin API calls), ``openroute messages restart`` and the Spark job ends with the same columns and transition."""
    import asyncio

    from openroute.definitions.route import RouteRegistry
    from openroute.engine import Engine
    from tests.spark.stores import FAIL, drive

    store = MessageStore(database_url)
    store.create_schema()
    errors = [{"code": "BLOCKED", "text": "customer blocked"}]
    ids = {path: drive(store, f"r-{path}", FAIL, received=NOW, error=("MNO_DOWN", "MNO down"),
                       business_errors=errors).id for path in ("engine", "cli", "job")}

    engine = Engine(store, RouteRegistry())  # not started, as the admin API's and the CLI's
    asyncio.run(engine.restart(ids["engine"], "admin:ann"))
    assert main(["messages", "restart", str(ids["cli"]), "--database-url", database_url, "--yes"]) == 0
    ids_file = tmp_path / "ids.txt"
    ids_file.write_text(f"{ids['job']}\n")
    reprocess(spark, database_url, ids_file=str(ids_file), out=tmp_path / "job", job_id="rules", partitions=2,
              apply=True)

    views = {path: _rule_view(store, message_id) for path, message_id in ids.items()}
    assert views["job"] == views["engine"] == views["cli"], views
    assert views["job"][0][:3] == (S.PARTLY_FAILED, 0, [])  # business errors cleared as by Engine.restart
    store.dispose()
    capsys.readouterr()
