"""Bulk reprocessing: plan, then (with ``apply``) restart the stored messages an outage left FAILED.

A job reads the candidates from the store over JDBC in parallel partitions and decides, per message, without
collecting the candidates on the driver::

    RESTART        FAILED/CANCEL -> PARTLY_FAILED, due now, failed count 0, business errors cleared: the decision
                   of ``Engine.restart`` (engine/outcome.py), which the admin API and ``openroute messages`` apply
    SKIP_OBSOLETE  a newer message of the same entity type + object id already ended OK: FAILED -> SKIPPED with
                   the columns the engine leaves when a restarted message meets its obsolete check (no
                   confirmation, as when the engine skips it: SKIPPED is never confirmed)
    LEAVE          left alone, with the reason (restarted by this job already, parent final, not restartable...)

The plan is a dataset (Parquet, CSV on request) with a summary per route x decision. ``apply`` writes it
through :mod:`openroute.engine.states` in batches: version-checked, one transaction per batch, every change recorded
in ``message_transition`` with cause ``reprocess:<job id>``. Those rows are the job's applied marker: applying
the plan again, or resuming after the job was killed, changes each planned message exactly once::

    from openroute.spark import build_session, reprocess

    result = reprocess(build_session(), "sqlite:///openroute.db", service="crm", since="7d", apply=True,
                       rate=200)
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import sqlalchemy as sa

from openroute.persistence import FINAL_STATES, MessageState
from openroute.persistence.models import message_table, message_transition_table
from openroute.spark._ages import parse_age
from openroute.spark.apply import (
    BATCH_SIZE,
    LEAVE,
    RESTART,
    SKIP_OBSOLETE,
    ApplyResult,
    apply_plan,
    job_cause,
    parse_rate,
)
from openroute.spark.outputs import OutputKind, prune_outputs, retention_setting
from openroute.spark.session import IdRange, id_ranges, read_table

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

S = MessageState

#: the message columns a plan needs (the payload is never read)
PLAN_COLUMNS = (
    "id", "version", "state", "service", "operation", "source_system", "correlation_id", "object_id",
    "entity_type", "parent_id", "receive_ts", "failed_count", "last_error_code", "last_error_text",
    "business_errors",
)

_JOB_ID = re.compile(r"^[A-Za-z0-9._-]{1,64}$")


def parse_time(value: str | datetime | None, now: datetime | None = None) -> datetime | None:
    """An ISO-8601 time (UTC when it has no zone) or a relative age (``7d``, ``12h``, ``30m``, ``2w``, ``90s``)
    meaning that long before ``now``. Raises ``ValueError`` naming the value for anything else."""
    if value is None or isinstance(value, datetime):
        return value if value is None or value.tzinfo else value.replace(tzinfo=UTC)
    text = value.strip()
    age = parse_age(text)
    if age is not None:
        return (now or datetime.now(UTC)) - age
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(f"not a time: {value!r} (give ISO-8601 like 2024-05-01T08:00 or an age like 7d)") from None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


@dataclass(frozen=True)
class ReprocessFilter:
    """Which stored messages are candidates (all given conditions hold)."""

    #: states to select (default FAILED); only FAILED and CANCEL can be restarted, others are planned LEAVE
    states: tuple[MessageState, ...] = (S.FAILED,)
    service: str | None = None
    operation: str | None = None
    source_system: str | None = None
    #: receive time window (inclusive since, exclusive until)
    since: datetime | None = None
    until: datetime | None = None
    #: the message's last error code, exactly
    error_code: str | None = None
    #: a code among the message's business errors
    business_error_code: str | None = None
    #: text contained in the last error (case-insensitive)
    error_text: str | None = None
    #: a file with one message id per line
    ids_file: str | None = None
    #: a file with one object id per line
    object_ids_file: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "states", tuple(MessageState(s) for s in self.states))
        if not self.states:
            raise ValueError("give at least one state to select")
        if self.since and self.until and self.since >= self.until:
            raise ValueError(f"since ({self.since.isoformat()}) must be before until ({self.until.isoformat()})")
        for name in ("ids_file", "object_ids_file"):
            path = getattr(self, name)
            if path is not None and not Path(path).is_file():
                raise ValueError(f"{name.replace('_', ' ')}: no such file {path!r}")

    def describe(self) -> dict[str, Any]:
        """The filter as JSON-ready values (written next to the plan)."""
        values = asdict(self)
        values["states"] = [s.value for s in self.states]
        for name in ("since", "until"):
            values[name] = None if values[name] is None else values[name].isoformat()
        return values


@dataclass(frozen=True)
class ReprocessResult:
    """A reprocessing job: its id, where its plan is, the summary per route x decision, what ``apply`` did."""

    job_id: str
    plan_path: Path
    #: (route "service/operation", decision, count), sorted
    summary: list[tuple[str, str, int]]
    applied: ApplyResult | None = None
    #: older plan folders deleted beside this one (the retention)
    pruned: list[Path] = field(default_factory=list)

    def counts(self) -> dict[str, int]:
        """Planned messages per decision."""
        totals: dict[str, int] = {}
        for _route, decision, count in self.summary:
            totals[decision] = totals.get(decision, 0) + count
        return totals


def new_job_id(now: datetime | None = None) -> str:
    """A fresh job id: ``rp-<UTC time>-<random>``."""
    return f"rp-{(now or datetime.now(UTC)):%Y%m%dT%H%M%S}-{secrets.token_hex(3)}"


def _ids_frame(spark: SparkSession, path: str, name: str, numeric: bool) -> DataFrame:
    from pyspark.sql import functions as F

    lines = spark.read.text(path).select(F.trim(F.col("value")).alias("value")).where(F.col("value") != "")
    if not numeric:
        return lines.select(F.col("value").alias(name)).distinct()
    typed = lines.select(F.col("value"), F.expr("try_cast(value AS BIGINT)").alias(name))
    bad = [r.value for r in typed.where(F.col(name).isNull()).select("value").limit(3).collect()]
    if bad:
        raise ValueError(f"ids file {path}: not message ids: {', '.join(repr(b) for b in bad)}")
    return typed.select(name).distinct()


def candidate_condition(filters: ReprocessFilter, table: sa.TableClause | sa.Table | Any = message_table
                        ) -> sa.ColumnElement[bool]:
    """The filters the database can run, as a SQLAlchemy condition on ``table`` (the message table or an alias).

    Everything but ``business_error_code`` and the id files (applied in Spark, on the rows this selects)."""
    m = table.c
    conditions: list[sa.ColumnElement[bool]] = [m.state.in_(list(filters.states))]
    for name in ("service", "operation", "source_system"):
        if getattr(filters, name) is not None:
            conditions.append(m[name] == getattr(filters, name))
    if filters.since is not None:
        conditions.append(m.receive_ts >= filters.since)
    if filters.until is not None:
        conditions.append(m.receive_ts < filters.until)
    if filters.error_code is not None:
        conditions.append(m.last_error_code == filters.error_code)
    if filters.error_text is not None:
        conditions.append(sa.func.lower(m.last_error_text).contains(filters.error_text.lower(), autoescape=True))
    return sa.and_(*conditions)


def _candidates(spark: SparkSession, url: str, filters: ReprocessFilter, partitions: int,
                jdbc_path: str | None, ranges: dict[str, IdRange]) -> DataFrame:
    """The messages the filters select: the database filters, Spark applies what SQL cannot (JSON, id files)."""
    from pyspark.sql import functions as F

    chosen = read_table(spark, url, "message", partitions, jdbc_path=jdbc_path, columns=list(PLAN_COLUMNS),
                        where=candidate_condition(filters), id_range=ranges["message"])
    if filters.business_error_code is not None:
        errors = F.from_json(F.col("business_errors"), "array<struct<code:string,text:string>>")
        chosen = chosen.where(F.exists(errors, lambda e: cast("Column", e["code"] == filters.business_error_code)))
    if filters.ids_file is not None:
        chosen = chosen.join(_ids_frame(spark, filters.ids_file, "id", numeric=True), "id", "left_semi")
    if filters.object_ids_file is not None:
        chosen = chosen.join(_ids_frame(spark, filters.object_ids_file, "object_id", numeric=False), "object_id",
                             "left_semi")
    return chosen


def _context(spark: SparkSession, url: str, job_id: str, filters: ReprocessFilter, partitions: int,
             jdbc_path: str | None, ranges: dict[str, IdRange]) -> tuple[DataFrame, DataFrame, DataFrame]:
    """(newest OK message per entity, parent states, messages this job changed already), each read with a
    condition that limits it to what the candidates need: no full-table read."""
    from pyspark.sql import functions as F

    m, t = message_table, message_transition_table
    candidate = message_table.alias("candidate")
    selected = candidate_condition(filters, candidate)
    # the OK messages of the candidates' entities received no earlier than a candidate (only those can be newer)
    same_entity = sa.exists().where(selected, candidate.c.entity_type == m.c.entity_type,
                                    candidate.c.object_id == m.c.object_id, candidate.c.receive_ts <= m.c.receive_ts)
    newest_ok = (
        read_table(spark, url, "message", partitions, jdbc_path=jdbc_path,
                   columns=["id", "entity_type", "object_id", "receive_ts"], id_range=ranges["message"],
                   where=sa.and_(m.c.state == MessageState.OK, m.c.object_id.is_not(None),
                                 m.c.entity_type.is_not(None), same_entity))
        .groupBy("entity_type", "object_id")
        .agg(F.max(F.struct("receive_ts", "id")).alias("newest_ok"))
    )
    parents = read_table(
        spark, url, "message", partitions, jdbc_path=jdbc_path, columns=["id", "state"], id_range=ranges["message"],
        where=m.c.id.in_(sa.select(candidate.c.parent_id).where(selected, candidate.c.parent_id.is_not(None))),
    ).select(F.col("id").alias("parent_id"), F.col("state").alias("parent_state"))
    done = (
        read_table(spark, url, "message_transition", partitions, jdbc_path=jdbc_path, columns=["message_id"],
                   id_range=ranges["message_transition"],
                   where=sa.and_(t.c.cause == job_cause(job_id),
                                 t.c.message_id.in_(sa.select(candidate.c.id).where(selected))))
        .select(F.col("message_id").alias("id"))
        .distinct()
        .withColumn("done_by_job", F.lit(True))
    )
    return newest_ok, parents, done


def _verdict() -> Column:
    """Each candidate's (decision, reason), decided in one expression over the joined row."""
    from pyspark.sql import functions as F

    def said(decision: str, reason: Column | None) -> Column:
        return F.struct(F.lit(decision).alias("decision"),
                        (reason if reason is not None else F.lit(None).cast("string")).alias("reason"))

    obsolete = F.col("newest_ok").isNotNull() & (F.col("newest_ok") > F.struct("receive_ts", "id"))
    restartable = F.col("state").isin(MessageState.FAILED.value, MessageState.CANCEL.value)
    newer = F.concat(F.lit("newer message #"), F.col("newest_ok.id").cast("string"), F.lit(" of the same "),
                     F.col("entity_type"), F.lit(" ended OK"))
    return (
        F.when(F.col("done_by_job"), said(LEAVE, F.lit("already restarted by this job")))
        .when(~restartable, said(LEAVE, F.concat(F.lit("state "), F.col("state"), F.lit(" cannot be restarted"))))
        .when(F.col("parent_state").isin([s.value for s in FINAL_STATES]),
              said(LEAVE, F.concat(F.lit("parent #"), F.col("parent_id").cast("string"), F.lit(" is final ("),
                                   F.col("parent_state"), F.lit("): restart the parent instead"))))
        .when(obsolete & (F.col("state") == MessageState.FAILED.value), said(SKIP_OBSOLETE, newer))
        .when(obsolete, said(LEAVE, newer))
        .otherwise(said(RESTART, None))
    )


def plan_frame(
    spark: SparkSession,
    url: str,
    job_id: str,
    filters: ReprocessFilter | None = None,
    *,
    partitions: int = 4,
    jdbc_path: str | None = None,
) -> DataFrame:
    """The plan of ``job_id`` as a lazy DataFrame: one row per candidate with ``decision`` and ``reason``.

    Columns: the message's :data:`PLAN_COLUMNS` (minus the error texts), ``route``, ``decision``, ``reason``,
    ``newer_ok_id`` (the OK message that makes it obsolete), ``job_id``. The database runs the filters (see
    :func:`candidate_condition`), Spark reads the candidates in id-range partitions and nothing is collected
    on the driver.
    """
    from pyspark.sql import functions as F

    filters = filters or ReprocessFilter()
    # the id ranges the reads split, in one query: no read runs its filter twice (once more for its own bounds)
    ranges = id_ranges(spark, url, ["message", "message_transition"], jdbc_path)
    newest_ok, parents, done = _context(spark, url, job_id, filters, partitions, jdbc_path, ranges)
    planned = (
        _candidates(spark, url, filters, partitions, jdbc_path, ranges)
        .join(newest_ok, ["entity_type", "object_id"], "left")
        .join(parents, "parent_id", "left")
        .join(done, "id", "left")
        .withColumn("verdict", _verdict())
    )
    return planned.select(
        "id", "version", "state", "service", "operation",
        F.concat_ws("/", "service", "operation").alias("route"),
        "source_system", "correlation_id", "entity_type", "object_id", "parent_id", "receive_ts",
        "failed_count", "last_error_code",
        F.col("verdict.decision").alias("decision"), F.col("verdict.reason").alias("reason"),
        F.col("newest_ok.id").alias("newer_ok_id"),
        F.lit(job_id).alias("job_id"),
    )


def _summary(plan: DataFrame) -> list[tuple[str, str, int]]:
    rows = plan.groupBy("route", "decision").count().collect()  # one row per route x decision
    return sorted((r["route"], r["decision"], int(r["count"])) for r in rows)


def write_plan(
    spark: SparkSession,
    url: str,
    out: str | Path,
    job_id: str | None = None,
    filters: ReprocessFilter | None = None,
    *,
    partitions: int = 4,
    csv: bool = False,
    jdbc_path: str | None = None,
    retention: str | timedelta | None = None,
) -> ReprocessResult:
    """Build the plan and write it under ``out``: ``plan/`` (Parquet), ``plan_csv/`` when ``csv``, and
    ``job.json`` (job id, filters, time). Plan folders beside ``out`` older than ``retention`` (default
    ``$OPENROUTE_SPARK_RETENTION``; none: keep all) are deleted (:func:`~openroute.spark.outputs.prune_outputs`).
    Returns the job with its summary; changes nothing in the store."""
    job_id = job_id or new_job_id()
    if not _JOB_ID.match(job_id):
        raise ValueError(f"job id must be 1-64 letters, digits, '.', '_' or '-', got {job_id!r}")
    filters = filters or ReprocessFilter()
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    plan_path = folder / "plan"
    plan_frame(spark, url, job_id, filters, partitions=partitions, jdbc_path=jdbc_path).write.mode(
        "overwrite"
    ).parquet(str(plan_path))
    plan = spark.read.parquet(str(plan_path))
    if csv:
        plan.write.mode("overwrite").option("header", True).csv(str(folder / "plan_csv"))
    summary = _summary(plan)
    meta = {"job_id": job_id, "filters": filters.describe(), "planned_at": datetime.now(UTC).isoformat(),
            "summary": summary}
    (folder / "job.json").write_text(json.dumps(meta, indent=2) + "\n")
    pruned = prune_outputs(folder, retention, OutputKind.PLAN)
    return ReprocessResult(job_id, plan_path, summary, pruned=pruned)


def reprocess(
    spark: SparkSession,
    url: str,
    *,
    states: Sequence[MessageState | str] = (S.FAILED,),
    service: str | None = None,
    operation: str | None = None,
    source_system: str | None = None,
    since: str | datetime | None = None,
    until: str | datetime | None = None,
    error_code: str | None = None,
    business_error_code: str | None = None,
    error_text: str | None = None,
    ids_file: str | None = None,
    object_ids_file: str | None = None,
    out: str | Path | None = None,
    job_id: str | None = None,
    apply: bool = False,
    rate: float | str | None = None,
    batch_size: int = BATCH_SIZE,
    partitions: int = 4,
    csv: bool = False,
    jdbc_path: str | None = None,
    progress: Callable[[ApplyResult], None] | None = None,
    retention: str | timedelta | None = None,
) -> ReprocessResult:
    """Plan a reprocessing job on the store at ``url`` and, with ``apply``, apply it.

    The filters select candidates (see :class:`ReprocessFilter`; ``since``/``until`` take ISO-8601 or ages
    like ``7d``). The plan goes to ``out`` (default ``reprocess-<job id>``) as Parquet (+ CSV with ``csv``).
    Without ``apply`` nothing in the store changes (a dry run). ``retention`` prunes older plan folders beside
    ``out`` (see :func:`write_plan`). Giving the ``job_id`` of an earlier job
    re-plans it: messages it restarted already are planned LEAVE, so a resumed job restarts none twice.
    Raises ``ValueError`` for bad filters and :class:`~openroute.spark.session.SparkSetupError` when the store
    cannot be read.
    """
    filters = ReprocessFilter(
        states=tuple(MessageState(s) for s in states), service=service, operation=operation,
        source_system=source_system, since=parse_time(since), until=parse_time(until), error_code=error_code,
        business_error_code=business_error_code, error_text=error_text, ids_file=ids_file,
        object_ids_file=object_ids_file,
    )
    parse_rate(rate)  # a bad rate or retention is refused before anything runs
    retention_setting(retention)
    job_id = job_id or new_job_id()
    result = write_plan(spark, url, out or f"reprocess-{job_id}", job_id, filters, partitions=partitions, csv=csv,
                        jdbc_path=jdbc_path, retention=retention)
    if not apply:
        return result
    applied = apply_plan(spark, url, result.plan_path.parent, rate=rate, batch_size=batch_size, progress=progress)
    return ReprocessResult(result.job_id, result.plan_path, result.summary, applied, result.pruned)
