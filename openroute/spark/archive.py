"""Archiving: move final messages older than their keep time, with their rows, from the store to Parquet.

One run copies the selected messages and their ``message_transition``, ``external_call`` and ``confirmation``
rows to ``<to>/<table>/run=<run id>/receive_date=<day>/route=<service>/<operation>/``, reads the copies back
and compares the row counts, records the run as verified in ``<to>/_runs/<run id>/manifest.json`` and only
then deletes the messages from the store in batches (their rows go with them, ON DELETE CASCADE). Killed at
any point nothing is lost, and the next run finishes the job first:

- killed before the manifest says ``verified``: the partial copy is removed and the messages, still in the
  store, are selected again;
- killed while deleting: the next run deletes the rest of the verified run's messages first.

A message is deleted only at the version that was archived (one changed since, e.g. restarted, stays in the
store), a parent only when none of its children remains, and a child only once its parent is final (a parent
waiting for its children decides its outcome from their rows)::

    from openroute.spark import archive, build_session

    result = archive(build_session(), "sqlite:///openroute.db", keep="OK=30d,FAILED=180d", to="/data/archive")
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa

from openroute.persistence import FINAL_STATES, MessageState, MessageStore
from openroute.persistence.models import Base, message_table
from openroute.spark._ages import parse_age
from openroute.spark._pause import pause_point
from openroute.spark.session import IdRange, id_ranges, read_table

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

#: the tables archived with their messages (all reference message.id)
RELATED_TABLES = ("message_transition", "external_call", "confirmation")



class ArchiveError(RuntimeError):
    """The archive copy did not match the store (counts read back differ); nothing was deleted."""


def parse_keep(keep: str | Mapping[MessageState | str, timedelta | str]) -> dict[MessageState, timedelta]:
    """``"OK=30d,FAILED=180d"`` (or a mapping) as keep times per final state.

    Raises ``ValueError`` naming the part for a state that is not final, a bad age, or an empty value.
    """
    items: list[tuple[str, Any]]
    if isinstance(keep, str):
        items = []
        for part in (p.strip() for p in keep.split(",")):
            if not part:
                continue
            name, sep, age = part.partition("=")
            if not sep:
                raise ValueError(f"keep: {part!r} is not STATE=AGE (like OK=30d)")
            items.append((name.strip(), age.strip()))
    else:
        items = list(keep.items())
    if not items:
        raise ValueError("keep: give at least one STATE=AGE, like OK=30d,FAILED=180d")
    result: dict[MessageState, timedelta] = {}
    for name, age in items:
        try:
            state = MessageState(str(name).upper())
        except ValueError:
            raise ValueError(f"keep: unknown state {name!r}") from None
        if state not in FINAL_STATES:
            finals = ", ".join(sorted(s.value for s in FINAL_STATES))
            raise ValueError(f"keep: {state.value} is not a final state; only {finals} messages are archived")
        delta = age if isinstance(age, timedelta) else parse_age(str(age))
        if delta is None:
            raise ValueError(f"keep: {state.value}={age!r} is not an age like 30d, 12h, 2w")
        result[state] = delta
    return result


@dataclass(frozen=True)
class ArchiveResult:
    """What one archive call did (the run it made and any earlier run it finished)."""

    run_id: str | None
    path: Path
    messages: int = 0
    transitions: int = 0
    external_calls: int = 0
    confirmations: int = 0
    #: messages deleted from the store (this run and the finished earlier ones)
    deleted: int = 0
    #: archived messages left in the store because they changed after the copy (or kept a child)
    kept: int = 0
    #: earlier runs this call finished (deleting) or removed (copy never verified)
    resumed: tuple[str, ...] = ()
    discarded: tuple[str, ...] = ()


def _reached(phase: str) -> None:
    """A point where the job may be killed: tests interrupt it here, in the test process or as a child process
    paused by ``$OPENROUTE_SPARK_PAUSE_AT`` (see :mod:`openroute.spark._pause`) and then killed."""
    pause_point(phase)


def _write_manifest(folder: Path, values: dict[str, Any]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    temporary = folder / "manifest.json.tmp"
    temporary.write_text(json.dumps(values, indent=2, default=str) + "\n")
    os.replace(temporary, folder / "manifest.json")  # atomic: a reader sees the old or the new manifest


def _runs(root: Path) -> Iterator[tuple[Path, dict[str, Any]]]:
    runs = root / "_runs"
    if not runs.is_dir():
        return
    for folder in sorted(runs.iterdir()):
        manifest = folder / "manifest.json"
        values = json.loads(manifest.read_text()) if manifest.is_file() else {"run_id": folder.name}
        yield folder, values


def _discard(root: Path, run_id: str) -> None:
    for table in ("message", *RELATED_TABLES):
        shutil.rmtree(root / table / f"run={run_id}", ignore_errors=True)
    shutil.rmtree(root / "_runs" / run_id, ignore_errors=True)


def _delete(
    spark: SparkSession, store: MessageStore, root: Path, run_id: str, batch_size: int
) -> tuple[int, int]:
    """Delete a verified run's messages (newest id first: children before parents); returns (deleted, kept)."""
    from pyspark.sql import functions as F

    m = message_table.c
    child = message_table.alias("child")
    statement_for: Callable[[list[tuple[int, int]]], Any] = lambda pairs: sa.delete(message_table).where(  # noqa: E731
        sa.tuple_(m.id, m.version).in_(pairs),
        ~sa.exists().where(child.c.parent_id == m.id),
    )
    ids = spark.read.parquet(str(root / "_runs" / run_id / "ids")).orderBy(F.col("id").desc())
    deleted = kept = 0
    batch: list[tuple[int, int]] = []

    def flush() -> None:
        nonlocal deleted, kept
        gone = 0
        with store.begin() as connection:
            while gone < len(batch):  # again while it progresses: a parent goes once its children went
                progress = connection.execute(statement_for(batch)).rowcount
                if not progress:
                    break
                gone += progress
        deleted += gone
        kept += len(batch) - gone
        batch.clear()
        _reached("deleted-batch")

    for row in ids.toLocalIterator():
        batch.append((int(row["id"]), int(row["version"])))
        if len(batch) >= batch_size:
            flush()
    if batch:
        flush()
    return deleted, kept


def _finish(spark: SparkSession, store: MessageStore, root: Path, batch_size: int) -> tuple[list[str], list[str],
                                                                                               int, int]:
    """Finish or discard the earlier runs found under ``root``; returns (finished, discarded, deleted, kept)."""
    finished: list[str] = []
    discarded: list[str] = []
    deleted = kept = 0
    for folder, values in list(_runs(root)):
        run_id = values["run_id"]
        if values.get("status") == "verified":
            gone, stayed = _delete(spark, store, root, run_id, batch_size)
            deleted += gone
            kept += stayed
            _write_manifest(folder, {**values, "status": "done", "deleted": gone, "kept": stayed})
            finished.append(run_id)
        elif values.get("status") != "done":
            _discard(root, run_id)
            discarded.append(run_id)
    return finished, discarded, deleted, kept


def old_condition(keep: dict[MessageState, timedelta], now: datetime, table: Any = message_table
                  ) -> sa.ColumnElement[bool]:
    """Messages of ``table`` (the message table or an alias) in a kept state, unchanged for longer than its keep
    time: a condition the database runs."""
    m = table.c
    return sa.or_(*(sa.and_(m.state == state, m.last_update_ts < now - age) for state, age in keep.items()))


def _selected(spark: SparkSession, url: str, keep: dict[MessageState, timedelta], now: datetime, partitions: int,
              jdbc_path: str | None, ranges: dict[str, IdRange]) -> DataFrame:
    """The messages to archive (every column) as a lazy frame; each read is limited by the database to the rows
    the decision needs (the old messages, their unfinished parents, their children), none read twice."""
    from pyspark.sql import functions as F

    m = message_table
    other = message_table.alias("other")
    old = read_table(spark, url, "message", partitions, jdbc_path=jdbc_path, where=old_condition(keep, now),
                     id_range=ranges["message"])
    # a child stays while its parent is not final: a waiting parent decides its outcome from its children's rows
    unfinished_parents = read_table(
        spark, url, "message", partitions, jdbc_path=jdbc_path, columns=["id"], id_range=ranges["message"],
        where=sa.and_(m.c.state.not_in(list(FINAL_STATES)),
                      m.c.id.in_(sa.select(other.c.parent_id).where(old_condition(keep, now, other)))),
    )
    eligible = old.join(unfinished_parents.select(F.col("id").alias("parent_id")), "parent_id", "left_anti")
    # a parent stays while one of its children stays (the child row references it)
    children = read_table(
        spark, url, "message", partitions, jdbc_path=jdbc_path, columns=["id", "parent_id"],
        id_range=ranges["message"],
        where=m.c.parent_id.in_(sa.select(other.c.id).where(old_condition(keep, now, other))),
    )
    staying_children = (
        children.join(eligible.select("id"), "id", "left_anti").select(F.col("parent_id").alias("id")).distinct()
    )
    return eligible.join(staying_children, "id", "left_anti")


def _copy(spark: SparkSession, url: str, placed: DataFrame, root: Path, run_id: str, selection: sa.Select[Any],
          partitions: int, jdbc_path: str | None, ranges: dict[str, IdRange], count: int
          ) -> tuple[dict[str, int], dict[str, Any]]:
    """Write the messages (``placed``, cached, ``count`` rows) and their related rows to ``root/<table>/run=<run
    id>``, each row read once from the store; returns (rows per table, schema per table)."""
    from pyspark import StorageLevel

    counts = {"message": count}
    schemas = {"message": placed.schema}
    place = placed.select("id", "receive_date", "route")
    placed.write.mode("overwrite").partitionBy("receive_date", "route").parquet(str(root / "message" / f"run={run_id}"))
    for table in RELATED_TABLES:
        related = Base.metadata.tables[table]
        rows = (
            read_table(spark, url, table, partitions, jdbc_path=jdbc_path, where=related.c.message_id.in_(selection),
                       id_range=ranges[table])
            .join(place.withColumnRenamed("id", "message_id"), "message_id", "inner")
            .persist(StorageLevel.MEMORY_AND_DISK)
        )
        counts[table] = rows.count()
        schemas[table] = rows.schema
        rows.write.mode("overwrite").partitionBy("receive_date", "route").parquet(str(root / table / f"run={run_id}"))
        rows.unpersist()
    return counts, schemas


def _verify(spark: SparkSession, placed: DataFrame, root: Path, run_id: str, counts: dict[str, int],
            schemas: dict[str, Any]) -> None:
    """Read the run's copy back: every table's row count and every message id; ArchiveError when one differs."""
    for table, expected in counts.items():
        # with the written schema: a table with no rows for this run has no file to infer one from
        written = spark.read.schema(schemas[table]).parquet(str(root / table / f"run={run_id}")).count()
        if written != expected:
            raise ArchiveError(f"archive run {run_id}: {table} has {written} rows in {root}, the store had "
                               f"{expected}; nothing was deleted")
    back = spark.read.parquet(str(root / "message" / f"run={run_id}")).select("id")
    missing = placed.select("id").join(back, "id", "left_anti").count()
    if missing:
        raise ArchiveError(f"archive run {run_id}: {missing} messages missing from the copy; nothing deleted")


def archive(
    spark: SparkSession,
    url: str,
    *,
    keep: str | Mapping[MessageState | str, timedelta | str],
    to: str | os.PathLike[str],
    batch_size: int = 1000,
    partitions: int = 4,
    jdbc_path: str | None = None,
    now: datetime | None = None,
) -> ArchiveResult:
    """Archive the final messages of the store at ``url`` older than ``keep`` (``"OK=30d,FAILED=180d"``:
    time since their last update) to the folder ``to``, verify the copy, then delete them in batches.

    Earlier runs under ``to`` left by a killed job are finished (verified copy: delete the rest) or discarded
    (unverified copy: removed, the messages are still in the store) first. Returns an :class:`ArchiveResult`.
    Raises ``ValueError`` for a bad ``keep`` or ``batch_size``, :class:`ArchiveError` when the copy read back
    does not match (nothing deleted), :class:`~openroute.spark.session.SparkSetupError` when the store cannot
    be read.
    """
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    keep_times = parse_keep(keep)
    if batch_size < 1:
        raise ValueError(f"batch size must be >= 1, got {batch_size}")
    if "://" in str(to) and not str(to).startswith("file://"):
        raise ValueError(f"archive to a local or mounted folder, got {to!r}: the run manifests are local files")
    root = Path(str(to).removeprefix("file://")).resolve()
    now = now or datetime.now(UTC)
    store = MessageStore(url, pool_size=1)
    try:
        finished, discarded, deleted, kept = _finish(spark, store, root, batch_size)
        # the id ranges every read splits, in one query (not one bounds query per read)
        ranges = id_ranges(spark, url, ["message", *RELATED_TABLES], jdbc_path)
        chosen = _selected(spark, url, keep_times, now, partitions, jdbc_path, ranges)
        placed = chosen.withColumn("receive_date", F.to_date("receive_ts")).withColumn(
            "route", F.concat_ws("/", "service", "operation")
        ).persist(StorageLevel.MEMORY_AND_DISK)
        try:
            count = placed.count()
            if count == 0:
                return ArchiveResult(None, root, deleted=deleted, kept=kept, resumed=tuple(finished),
                                     discarded=tuple(discarded))
            run_id = f"{now:%Y%m%dT%H%M%S}-{secrets.token_hex(3)}"
            run_folder = root / "_runs" / run_id
            _write_manifest(run_folder, {"run_id": run_id, "status": "writing", "keep": {
                s.value: str(a) for s, a in keep_times.items()}, "started_at": now.isoformat()})
            placed.select("id", "version").write.mode("overwrite").parquet(str(run_folder / "ids"))
            _reached("selected")
            # the related rows of the old messages (a superset of the archived ones; the join keeps those)
            selection = sa.select(message_table.c.id).where(old_condition(keep_times, now))
            counts, schemas = _copy(spark, url, placed, root, run_id, selection, partitions, jdbc_path, ranges,
                                    count)
            _reached("written")
            _verify(spark, placed, root, run_id, counts, schemas)
            _write_manifest(run_folder, {"run_id": run_id, "status": "verified", "counts": counts,
                                         "started_at": now.isoformat()})
            _reached("verified")
        finally:
            placed.unpersist()
        gone, stayed = _delete(spark, store, root, run_id, batch_size)
        _write_manifest(run_folder, {"run_id": run_id, "status": "done", "counts": counts, "deleted": gone,
                                     "kept": stayed, "started_at": now.isoformat()})
        return ArchiveResult(
            run_id, root, counts["message"], counts["message_transition"], counts["external_call"],
            counts["confirmation"], deleted + gone, kept + stayed, tuple(finished), tuple(discarded),
        )
    finally:
        store.dispose()


def read_archive(spark: SparkSession, to: str | os.PathLike[str], table: str = "message") -> DataFrame:
    """One archived table (``message``, ``message_transition``, ``external_call``, ``confirmation``) of the
    archive folder ``to``, over every finished run, with the ``run``, ``receive_date`` and ``route`` columns.

    Runs whose copy was never verified are left out. Raises ``ValueError`` for another table name.
    """
    from pyspark.sql import functions as F

    if table not in ("message", *RELATED_TABLES):
        raise ValueError(f"not an archived table: {table!r}")
    root = Path(str(to).removeprefix("file://"))
    runs = [v["run_id"] for _f, v in _runs(root) if v.get("status") in ("verified", "done")]
    if not runs or not (root / table).is_dir():
        raise ValueError(f"no finished archive run in {root}")
    frame = spark.read.option("basePath", str(root / table)).parquet(str(root / table))
    return frame.where(F.col("run").cast("string").isin(runs))
