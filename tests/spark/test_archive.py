"""Archiving on real Spark and each real database: what moves, the copy read back, interruptions, bad input."""

from __future__ import annotations

import importlib
import json
import signal
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from openroute.persistence import ExternalCallStatus, MessageState, MessageStore
from openroute.persistence.models import confirmation_table, message_transition_table

from openroute.cli import main
from openroute.spark.archive import ArchiveResult, archive, parse_keep, read_archive
from tests.services import require_database
from tests.spark.processes import SparkCli
from tests.spark.stores import NOW, many_failed, reprocess_store

S = MessageState
# the module (openroute.spark.archive is the function of the package's API)
archive_module = importlib.import_module("openroute.spark.archive")


def _transition_count(store: MessageStore) -> int:
    with store.engine.connect() as connection:
        return connection.execute(sa.select(sa.func.count()).select_from(message_transition_table)).scalar_one()


def test_archive_moves_old_final_messages_with_their_rows_per_keep_time(
    spark: Any, database_url: str, tmp_path: Path
) -> None:
    ids = reprocess_store(database_url)
    store = MessageStore(database_url)
    store.calls.record(ids["ok_newer"], "billing", ExternalCallStatus.OK, NOW, result={"invoice": 1})
    with store.begin() as connection:
        connection.execute(sa.insert(confirmation_table).values(
            message_id=ids["ok_newer"], source_system="CRM", outcome_state=S.OK, status="SENT", attempts=1,
            created_at=NOW, updated_at=NOW, sent_at=NOW))
    transitions_before = _transition_count(store)
    to = tmp_path / "archive"

    first = archive(spark, database_url, keep="OK=1h", to=to, now=NOW, partitions=2)
    assert (first.messages, first.external_calls, first.confirmations, first.deleted) == (2, 1, 1, 2)
    assert store.get(ids["ok_newer"]) is None and store.get(ids["ok_older"]) is None
    assert store.get(ids["f_plain"]) is not None, "FAILED has no keep time here: it stays"

    second = archive(spark, database_url, keep={"FAILED": "1h", "CANCEL": timedelta(hours=1)}, to=to, now=NOW,
                     batch_size=3, partitions=2)
    assert second.messages == 9 and second.deleted == 9 and second.kept == 0
    assert [m.id for m in store.find()] == [ids["waiting"]], "only the non-final message is left"
    remaining = len(store.transitions.of(ids["waiting"]))
    assert first.transitions + second.transitions + remaining == transitions_before

    archived = read_archive(spark, to)
    assert sorted(r.id for r in archived.select("id").collect()) == sorted(i for n, i in ids.items() if n != "waiting")
    row = archived.where(archived.id == ids["parent"]).first()
    assert (row.route, str(row.receive_date), row.state) == ("shop/createOrder", "2024-06-10", "FAILED")
    calls = read_archive(spark, to, "external_call").collect()
    assert [(c.message_id, c.call_key, c.route) for c in calls] == [(ids["ok_newer"], "billing", "crm/setCustomer")]
    assert read_archive(spark, to, "confirmation").count() == 1
    assert read_archive(spark, to, "message_transition").count() == first.transitions + second.transitions
    assert (to / "message" / f"run={first.run_id}" / "receive_date=2024-06-10").is_dir()
    assert archive(spark, database_url, keep="OK=1h,FAILED=1h", to=to, now=NOW) == ArchiveResult(None, to)
    store.dispose()


def test_a_final_child_stays_while_its_parent_waits_for_the_others(
    spark: Any, database_url: str, tmp_path: Path
) -> None:
    """The waiting parent decides its outcome from its children's rows: archiving a FAILED child before the parent
    ended would let it end OK."""
    from openroute.engine import states
    from tests.spark.stores import drive

    store = MessageStore(database_url)
    store.create_schema()
    received = NOW - timedelta(hours=5)
    parent = drive(store, "p", (S.PROCESSING, S.WAITING_FOR_CHILDREN), received=received, service="shop",
                   operation="createOrder", source_system="SHOP")
    failed = drive(store, "p:1", (S.PROCESSING, S.FAILED), received=received, service="shop",
                   operation="createOrderLine", source_system="SHOP", parent_id=parent.id)
    pending = drive(store, "p:2", (), received=received, service="shop", operation="createOrderLine",
                    source_system="SHOP", parent_id=parent.id)
    to = tmp_path / "archive"

    assert archive(spark, database_url, keep="FAILED=1h,OK=1h", to=to, now=NOW) == ArchiveResult(None, to)
    assert store.get(failed.id) is not None

    states.transition(store, states.claim(store, [pending], "gen", received)[0], S.OK, received)
    states.transition(store, store.get(parent.id), S.FAILED, received, {"last_error_code": "CHILD_FAILED"})
    done = archive(spark, database_url, keep="FAILED=1h,OK=1h", to=to, now=NOW)
    assert (done.messages, done.deleted) == (3, 3) and store.find() == []
    store.dispose()


class Killed(BaseException):
    """Stands for kill -9 at a point of the job (nothing after it runs)."""


def _kill_at(monkeypatch: pytest.MonkeyPatch, phase: str, after: int = 1) -> None:
    seen = {"n": 0}

    def reached(name: str) -> None:
        if name == phase:
            seen["n"] += 1
            if seen["n"] >= after:
                raise Killed(phase)

    monkeypatch.setattr(archive_module, "_reached", reached)


def _nothing_lost(spark: Any, store: MessageStore, to: Path, all_ids: list[int]) -> list[int]:
    live = {m.id for m in store.find()}
    try:
        archived = [r.id for r in read_archive(spark, to).select("id").collect()]
    except ValueError:
        archived = []
    assert live | set(archived) == set(all_ids), "a message is neither in the store nor in a verified archive"
    return archived


def test_interrupted_at_any_point_loses_nothing_and_a_rerun_finishes(
    spark: Any, sqlite_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    all_ids = many_failed(sqlite_url, 10)
    store = MessageStore(sqlite_url)
    to = tmp_path / "archive"
    keep = "FAILED=1h"

    _kill_at(monkeypatch, "written")  # copy written, not yet verified
    with pytest.raises(Killed):
        archive(spark, sqlite_url, keep=keep, to=to, now=NOW + timedelta(hours=2), partitions=2)
    assert len(store.find()) == 10 and _nothing_lost(spark, store, to, all_ids) == []

    _kill_at(monkeypatch, "deleted-batch", after=2)  # verified, two batches of three deleted
    with pytest.raises(Killed):
        archive(spark, sqlite_url, keep=keep, to=to, now=NOW + timedelta(hours=2), batch_size=3, partitions=2)
    assert len(store.find()) == 4
    assert sorted(_nothing_lost(spark, store, to, all_ids)) == all_ids  # the unverified first copy is gone

    monkeypatch.setattr(archive_module, "_reached", lambda name: None)
    finished = archive(spark, sqlite_url, keep=keep, to=to, now=NOW + timedelta(hours=2), partitions=2)
    assert len(finished.resumed) == 1 and len(finished.discarded) == 0 and finished.run_id is None
    assert finished.deleted == 4 and store.find() == []
    assert sorted(_nothing_lost(spark, store, to, all_ids)) == all_ids, "each message archived exactly once"
    store.dispose()


def _transition_ids(url: str, message_ids: set[int]) -> list[int]:
    engine = sa.create_engine(url)
    with engine.connect() as connection:
        found = connection.execute(sa.select(message_transition_table.c.id).where(
            message_transition_table.c.message_id.in_(sorted(message_ids)))).scalars().all()
    engine.dispose()
    return sorted(found)


def _parquet_ids(spark: Any, folder: Path) -> list[int]:
    """The ids in every Parquet file under ``folder`` (all runs, finished or not): a copy left over counts too."""
    if not folder.is_dir():
        return []
    return sorted(r.id for r in spark.read.option("basePath", str(folder)).parquet(str(folder)).select("id").collect())


#: database -> (the point its job is paused and killed at, how many messages were deleted by then): each kill point
#: on one database (each case is a JVM of its own: the suite's time); both databases are killed for real, and the
#: in-process stop points of the test above cover every point on SQLite
KILLS = {"sqlite": ("verified", 0), "postgres": ("deleted-batch:2", 4)}


@dataclass
class KilledArchive:
    """One ``openroute spark archive`` child started on a store of its own, to be killed at its pause point."""

    url: str
    ids: dict[str, int]
    transitions: list[int]
    to: Path
    argv: list[str]
    child: SparkCli


@pytest.fixture(scope="module")
def killed_archives(
    spark_installed: None, module_databases: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, KilledArchive]]:
    """Per database of :data:`KILLS`, a store and an archive child started on it; the children start together (each
    is mostly the start of one JVM, and the two overlap on this machine's cores) and each pauses at its point
    until its test kills it. Whatever is left is killed at the end."""
    started: dict[str, KilledArchive] = {}
    try:
        for database, (pause_at, _deleted) in KILLS.items():
            if database not in module_databases:
                continue  # no server: its test says so
            url = module_databases[database]
            folder = tmp_path_factory.mktemp(f"killed-{database}")
            ids = reprocess_store(url)
            eligible = set(ids.values()) - _staying(ids)
            to = folder / "archive"
            argv = ["archive", "--database-url", url, "--keep", "FAILED=1d,CANCEL=1d", "--to", str(to),
                    "--batch-size", "2", "--partitions", "2"]
            # the job pauses at the named point (the copy verified, nothing deleted; or two delete batches committed)
            child = SparkCli([*argv, "--master", "local[1]"], folder, env={"OPENROUTE_SPARK_PAUSE_AT": pause_at})
            started[database] = KilledArchive(url, ids, _transition_ids(url, eligible), to, argv, child)
        yield started
    finally:
        for killed in started.values():
            killed.child.kill()


def _staying(ids: dict[str, int]) -> set[int]:
    return {ids["ok_newer"], ids["ok_older"], ids["waiting"]}  # OK has no keep time, PARTLY_FAILED is not final


@pytest.mark.parametrize(("database", "pause_at", "deleted_when_killed"), [(d, *k) for d, k in KILLS.items()],
                         ids=["sqlite-copy-verified-nothing-deleted", "postgres-between-delete-batches"])
def test_killed_by_sigkill_then_rerun_archives_every_message_exactly_once(
    spark: Any, killed_archives: dict[str, KilledArchive], database: str, pause_at: str, deleted_when_killed: int,
    capsys: pytest.CaptureFixture[str],
) -> None:
    require_database(database)
    killed = killed_archives[database]
    database_url, ids, to, argv, child = killed.url, killed.ids, killed.to, killed.argv, killed.child
    staying = _staying(ids)
    eligible = set(ids.values()) - staying
    try:
        child.wait_for_line(rf"paused at {pause_at.split(':')[0]} #", timeout=300)
    finally:
        child.kill()
    assert child.process.returncode == -signal.SIGKILL

    store = MessageStore(database_url)
    live = {m.id for m in store.find()}
    archived = [r.id for r in read_archive(spark, to).select("id").collect()]
    assert sorted(archived) == sorted(eligible), "the verified copy holds every eligible message once"
    assert len(eligible - live) == deleted_when_killed
    assert eligible - live <= set(archived), "a message deleted from the store is in the verified archive"

    assert main(["spark", *argv]) == 0  # the re-run finishes the killed run first
    assert f"deleted {len(eligible) - deleted_when_killed} from the store" in capsys.readouterr().out
    assert {m.id for m in store.find()} == staying, "the store no longer has the archived messages"
    assert _parquet_ids(spark, to / "message") == sorted(eligible), "every eligible message archived exactly once"
    transition_copy = [r.id for r in read_archive(spark, to, "message_transition").select("id").collect()]
    assert sorted(transition_copy) == killed.transitions, "and each of their transitions exactly once"
    [manifest] = [json.loads((f / "manifest.json").read_text()) for f in (to / "_runs").iterdir()]
    assert manifest["status"] == "done" and manifest["deleted"] == len(eligible) - deleted_when_killed
    store.dispose()


def test_a_message_changed_after_the_copy_stays_in_the_store(
    spark: Any, sqlite_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from openroute.engine import states

    [first, *_rest] = many_failed(sqlite_url, 3)
    store = MessageStore(sqlite_url)

    def restart_first(name: str) -> None:
        if name == "verified":  # an operator restarts it between the verified copy and the delete
            states.transition(store, store.get(first), S.PARTLY_FAILED, NOW, {"failed_count": 0})

    monkeypatch.setattr(archive_module, "_reached", restart_first)
    result = archive(spark, sqlite_url, keep="FAILED=1h", to=tmp_path / "a", now=NOW + timedelta(hours=2),
                     partitions=2)
    assert (result.messages, result.deleted, result.kept) == (3, 2, 1)
    assert [m.state for m in store.find()] == [S.PARTLY_FAILED]
    store.dispose()


@pytest.mark.parametrize(
    ("keep", "says"),
    [
        ("OK", "'OK' is not STATE=AGE"),
        ("NEW=1d", "NEW is not a final state"),
        ("OK=soon", "OK='soon' is not an age"),
        ("DONE=1d", "unknown state 'DONE'"),
        (" , ", "give at least one STATE=AGE"),
    ],
)
def test_bad_keep_times_are_refused(keep: str, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        parse_keep(keep)


def test_parse_keep_reads_every_unit() -> None:
    assert parse_keep("ok=90s,FAILED=2w,SKIPPED=12h,CANCEL=30m") == {
        S.OK: timedelta(seconds=90), S.FAILED: timedelta(weeks=2), S.SKIPPED: timedelta(hours=12),
        S.CANCEL: timedelta(minutes=30),
    }


def test_cli_archive_and_its_one_line_errors(
    spark: Any, sqlite_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    many_failed(sqlite_url, 2)
    assert main(["spark", "archive", "--database-url", sqlite_url, "--keep", "FAILED=1s", "--to",
                 str(tmp_path / "a"), "--partitions", "2"]) == 0
    assert "archived 2 messages" in capsys.readouterr().out
    for argv, says in [
        (["--keep", "NEW=1d"], "NEW is not a final state"),
        (["--batch-size", "0"], "batch size must be >= 1, got 0"),
        (["--to", "s3://bucket/archive"], "archive to a local or mounted folder"),
    ]:
        full = ["spark", "archive", "--database-url", sqlite_url, "--keep", "FAILED=1d", "--to", str(tmp_path), *argv]
        assert main(full) == 2, argv
        err = capsys.readouterr().err
        assert says in err and err.count("\n") == 1, err
