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
through :mod:`openroute.states` in batches: version-checked, one transaction per batch, every change recorded
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
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import sqlalchemy as sa

from openroute import states as lifecycle
from openroute.engine import outcome as outcomes
from openroute.errors import StaleMessageError
from openroute.persistence import FINAL_STATES, GroupConflict, MessageState, MessageStore, StoredMessage
from openroute.persistence.models import message_table, message_transition_table
from openroute.spark._pause import pause_point
from openroute.spark.session import read_table

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

S = MessageState

RESTART = "RESTART"
SKIP_OBSOLETE = "SKIP_OBSOLETE"
LEAVE = "LEAVE"

#: the message columns a plan needs (the payload is never read)
PLAN_COLUMNS = (
    "id", "version", "state", "service", "operation", "source_system", "correlation_id", "object_id",
    "entity_type", "parent_id", "receive_ts", "failed_count", "last_error_code", "last_error_text",
    "business_errors",
)

_RELATIVE = re.compile(r"^(\d+)\s*([smhdw])$")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}
_JOB_ID = re.compile(r"^[A-Za-z0-9._-]{1,64}$")


def parse_time(value: str | datetime | None, now: datetime | None = None) -> datetime | None:
    """An ISO-8601 time (UTC when it has no zone) or a relative age (``7d``, ``12h``, ``30m``, ``2w``, ``90s``)
    meaning that long before ``now``. Raises ``ValueError`` naming the value for anything else."""
    if value is None or isinstance(value, datetime):
        return value if value is None or value.tzinfo else value.replace(tzinfo=UTC)
    text = value.strip()
    match = _RELATIVE.match(text)
    if match:
        return (now or datetime.now(UTC)) - timedelta(**{_UNITS[match.group(2)]: int(match.group(1))})
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(f"not a time: {value!r} (give ISO-8601 like 2024-05-01T08:00 or an age like 7d)") from None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def parse_rate(value: str | float | None) -> float | None:
    """``200``, ``200/s``, ``50/m`` or ``1000/h`` as messages per second. Raises ``ValueError`` for others."""
    if value is None or isinstance(value, int | float):
        if value is not None and value <= 0:
            raise ValueError(f"rate must be > 0, got {value}")
        return None if value is None else float(value)
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(?:/\s*([smh]))?\s*", value)
    if not match or float(match.group(1)) <= 0:
        raise ValueError(f"not a rate: {value!r} (give messages per second like 200/s, or 50/m, 1000/h)")
    per = {"s": 1, "m": 60, "h": 3600}[match.group(2) or "s"]
    return float(match.group(1)) / per


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
class ApplyResult:
    """What applying a plan did: counts, and the ids left alone because they changed since the plan."""

    restarted: int = 0
    skipped: int = 0
    #: planned messages this job had already changed (an earlier or interrupted apply)
    already_applied: int = 0
    #: planned messages whose version moved since the plan (someone else changed them): left alone
    moved: list[int] = field(default_factory=list)
    #: planned messages no longer in the store (archived or deleted)
    missing: list[int] = field(default_factory=list)
    batches: int = 0


@dataclass(frozen=True)
class ReprocessResult:
    """A reprocessing job: its id, where its plan is, the summary per route x decision, what ``apply`` did."""

    job_id: str
    plan_path: Path
    #: (route "service/operation", decision, count), sorted
    summary: list[tuple[str, str, int]]
    applied: ApplyResult | None = None

    def counts(self) -> dict[str, int]:
        """Planned messages per decision."""
        totals: dict[str, int] = {}
        for _route, decision, count in self.summary:
            totals[decision] = totals.get(decision, 0) + count
        return totals


def new_job_id(now: datetime | None = None) -> str:
    """A fresh job id: ``rp-<UTC time>-<random>``."""
    return f"rp-{(now or datetime.now(UTC)):%Y%m%dT%H%M%S}-{secrets.token_hex(3)}"


def _cause(job_id: str) -> str:
    return f"reprocess:{job_id}"


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
    ``newer_ok_id`` (the OK message that makes it obsolete), ``job_id``. Nothing is collected on the driver.
    """
    from pyspark.sql import functions as F

    filters = filters or ReprocessFilter()
    messages = read_table(spark, url, "message", partitions, jdbc_path=jdbc_path, columns=list(PLAN_COLUMNS))
    m = messages
    c = m.where(F.col("state").isin([s.value for s in filters.states]))
    for name in ("service", "operation", "source_system"):
        if getattr(filters, name) is not None:
            c = c.where(F.col(name) == getattr(filters, name))
    if filters.since is not None:
        c = c.where(F.col("receive_ts") >= F.lit(filters.since.astimezone(UTC).replace(tzinfo=None)))
    if filters.until is not None:
        c = c.where(F.col("receive_ts") < F.lit(filters.until.astimezone(UTC).replace(tzinfo=None)))
    if filters.error_code is not None:
        c = c.where(F.col("last_error_code") == filters.error_code)
    if filters.error_text is not None:
        c = c.where(F.lower(F.col("last_error_text")).contains(filters.error_text.lower()))
    if filters.business_error_code is not None:
        errors = F.from_json(F.col("business_errors"), "array<struct<code:string,text:string>>")
        c = c.where(F.exists(errors, lambda e: cast("Column", e["code"] == filters.business_error_code)))
    if filters.ids_file is not None:
        c = c.join(_ids_frame(spark, filters.ids_file, "id", numeric=True), "id", "left_semi")
    if filters.object_ids_file is not None:
        c = c.join(_ids_frame(spark, filters.object_ids_file, "object_id", numeric=False), "object_id", "left_semi")

    # the newest OK message of each entity (receive time, then id): a candidate older than it is obsolete
    newest_ok = (
        m.where((F.col("state") == S.OK.value) & F.col("object_id").isNotNull() & F.col("entity_type").isNotNull())
        .groupBy("entity_type", "object_id")
        .agg(F.max(F.struct("receive_ts", "id")).alias("newest_ok"))
    )
    parents = m.select(F.col("id").alias("parent_id"), F.col("state").alias("parent_state"))
    done = (
        read_table(spark, url, "message_transition", partitions, jdbc_path=jdbc_path,
                   columns=["message_id", "cause"])
        .where(F.col("cause") == _cause(job_id))
        .select(F.col("message_id").alias("id"))
        .distinct()
        .withColumn("done_by_job", F.lit(True))
    )
    planned = (
        c.join(newest_ok, ["entity_type", "object_id"], "left")
        .join(parents, "parent_id", "left")
        .join(done, "id", "left")
    )
    obsolete = F.col("newest_ok").isNotNull() & (F.col("newest_ok") > F.struct("receive_ts", "id"))
    parent_final = F.col("parent_state").isin([s.value for s in FINAL_STATES])
    restartable = F.col("state").isin(S.FAILED.value, S.CANCEL.value)
    decision = (
        F.when(F.col("done_by_job"), F.lit(LEAVE))
        .when(~restartable, F.lit(LEAVE))
        .when(parent_final, F.lit(LEAVE))
        .when(obsolete & (F.col("state") == S.FAILED.value), F.lit(SKIP_OBSOLETE))
        .when(obsolete, F.lit(LEAVE))
        .otherwise(F.lit(RESTART))
    )
    reason = (
        F.when(F.col("done_by_job"), F.lit("already restarted by this job"))
        .when(~restartable, F.concat(F.lit("state "), F.col("state"), F.lit(" cannot be restarted")))
        .when(parent_final, F.concat(F.lit("parent #"), F.col("parent_id").cast("string"), F.lit(" is final ("),
                                     F.col("parent_state"), F.lit("): restart the parent instead")))
        .when(obsolete, F.concat(F.lit("newer message #"), F.col("newest_ok.id").cast("string"),
                                 F.lit(" of the same "), F.col("entity_type"), F.lit(" ended OK")))
        .otherwise(F.lit(None).cast("string"))
    )
    return planned.select(
        "id", "version", "state", "service", "operation",
        F.concat_ws("/", "service", "operation").alias("route"),
        "source_system", "correlation_id", "entity_type", "object_id", "parent_id", "receive_ts",
        "failed_count", "last_error_code",
        decision.alias("decision"), reason.alias("reason"),
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
) -> ReprocessResult:
    """Build the plan and write it under ``out``: ``plan/`` (Parquet), ``plan_csv/`` when ``csv``, and
    ``job.json`` (job id, filters, time). Returns the job with its summary; changes nothing in the store."""
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
    return ReprocessResult(job_id, plan_path, summary)


def read_job(out: str | Path) -> dict[str, Any]:
    """The ``job.json`` of a plan folder. Raises ``ValueError`` when ``out`` holds no plan."""
    path = Path(out) / "job.json"
    if not path.is_file() or not (Path(out) / "plan").is_dir():
        raise ValueError(f"no reprocessing plan in {out} (job.json and plan/ are written by a dry run)")
    meta: dict[str, Any] = json.loads(path.read_text())
    return meta


class _Pacer:
    """Keeps releases at or under ``rate`` messages per second (no limit when None).

    The clock starts at the first release, so the time Spark spends reading the plan earns no burst.
    """

    def __init__(self, rate: float | None, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.rate, self.clock, self.sleep = rate, clock, sleep
        self.started: float | None = None
        self.released = 0

    def released_now(self, count: int) -> None:
        if not self.rate or not count:
            return
        if self.started is None:
            self.started = self.clock()
        self.released += count
        ahead = self.released / self.rate - (self.clock() - self.started)
        if ahead > 0:
            self.sleep(ahead)


def _batches(rows: Iterator[Any], size: int) -> Iterator[list[Any]]:
    batch: list[Any] = []
    for row in rows:
        batch.append(row)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


def _apply_batch(
    store: MessageStore, batch: list[Any], job_id: str, now: datetime, one_by_one: bool
) -> tuple[int, int, int, list[int], list[int]]:
    """One transaction: the batch's planned changes, version-checked; returns (restarted, skipped, already,
    moved ids, missing ids)."""
    cause = _cause(job_id)
    ids = [int(r["id"]) for r in batch]
    t = message_transition_table.c
    restarted = skipped = already = 0
    moved: list[int] = []
    missing: list[int] = []
    with store.begin() as connection:
        done = set(connection.execute(
            sa.select(t.message_id).where(t.cause == cause, t.message_id.in_(ids))
        ).scalars())
        current = {m.id: m for m in store.find(message_table.c.id.in_(ids), connection=connection)}
        requests: list[lifecycle.TransitionRequest] = []
        for row in batch:
            message_id = int(row["id"])
            message: StoredMessage | None = current.get(message_id)
            if message_id in done:
                already += 1
            elif message is None:
                missing.append(message_id)
            elif message.version != int(row["version"]):
                moved.append(message_id)
            else:
                # the engine's own rules (engine/outcome.py), as the admin API, the CLI and the engine apply them:
                # RESTART is Engine.restart's decision; SKIP_OBSOLETE is where the engine takes a restarted message
                # once its obsolete check finds the newer OK one (restart's columns, then the obsolete decision)
                restart = outcomes.restarted(now)
                if row["decision"] == RESTART:
                    requests.append((message, restart.target, now, dict(restart.changes), cause))
                else:
                    skip = outcomes.obsolete(message)
                    requests.append((message, skip.target, now, {**restart.changes, **skip.changes}, cause))
        if one_by_one:
            results: list[Any] = []
            for request in requests:
                try:
                    results.append(lifecycle.transition(store, request[0], request[1], now, request[3], connection,
                                                     node_id="spark", cause=cause))
                except StaleMessageError as lost:
                    results.append(lost)
        else:
            results = lifecycle.transition_many(store, requests, connection, node_id="spark")
        for request, result in zip(requests, results, strict=True):
            if isinstance(result, Exception):
                moved.append(request[0].id)
            elif result.state is S.SKIPPED:
                skipped += 1
            else:
                restarted += 1
        # written, not committed: a test kills the job here (kill -9) to see the database roll the batch back
        pause_point("batch-written")
    return restarted, skipped, already, moved, missing


def _log_batch(job_id: str, batch: int, restarted: int, skipped: int) -> None:
    """One line per applied batch (who: the job, the OS user and host); each message's transition row has the
    cause ``reprocess:<job id>``, and a server's log shows its next state change when its repoll takes it."""
    import getpass
    import socket

    from openroute.logs import actions_log, ensure_action_log

    ensure_action_log()
    actions_log.info("reprocess job %s batch %d by %s@%s: %d message(s) restarted, %d skipped as obsolete", job_id,
                     batch, getpass.getuser(), socket.gethostname(), restarted, skipped,
                     extra={"action": "reprocess", "job_id": job_id, "restarted": restarted, "skipped": skipped})


def apply_plan(
    spark: SparkSession,
    url: str,
    out: str | Path,
    *,
    rate: float | str | None = None,
    batch_size: int = 500,
    progress: Callable[[ApplyResult], None] | None = None,
    now: Callable[[], datetime] = lambda: datetime.now(UTC),
) -> ApplyResult:
    """Apply the plan written under ``out`` (RESTART and SKIP_OBSOLETE rows) to the store at ``url``.

    Rows stream from the Parquet plan partition by partition (never the whole plan on the driver), in batches
    of ``batch_size``, one transaction each; ``rate`` (messages per second, or ``"50/m"``) paces the releases.
    A message this job changed already is counted, not changed again; one whose version moved since the
    plan is left alone and listed. Raises ``ValueError`` for a folder without a plan or a bad rate.
    """
    from pyspark.sql import functions as F

    if batch_size < 1:
        raise ValueError(f"batch size must be >= 1, got {batch_size}")
    per_second = parse_rate(rate)
    job_id = read_job(out)["job_id"]
    if per_second is not None:
        batch_size = max(1, min(batch_size, int(per_second)))  # smooth releases: at most one second per batch
    plan = (
        spark.read.parquet(str(Path(out) / "plan"))
        .where(F.col("decision").isin(RESTART, SKIP_OBSOLETE))
        .select("id", "version", "decision", "newer_ok_id")
        .orderBy("id")
    )
    store = MessageStore(url, pool_size=1)
    pacer = _Pacer(per_second)
    restarted = skipped = already = batches = 0
    moved: list[int] = []
    missing: list[int] = []
    try:
        for batch in _batches(plan.toLocalIterator(), batch_size):
            try:
                outcome = _apply_batch(store, batch, job_id, now(), one_by_one=False)
            except GroupConflict:  # some item lost inside a grouped statement: redo the batch item by item
                outcome = _apply_batch(store, batch, job_id, now(), one_by_one=True)
            restarted += outcome[0]
            skipped += outcome[1]
            already += outcome[2]
            moved.extend(outcome[3])
            missing.extend(outcome[4])
            batches += 1
            if outcome[0] or outcome[1]:
                _log_batch(job_id, batches, outcome[0], outcome[1])
            pacer.released_now(outcome[0] + outcome[1])
            if progress is not None:
                progress(ApplyResult(restarted, skipped, already, list(moved), list(missing), batches))
    finally:
        store.dispose()
    return ApplyResult(restarted, skipped, already, moved, missing, batches)


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
    batch_size: int = 500,
    partitions: int = 4,
    csv: bool = False,
    jdbc_path: str | None = None,
    progress: Callable[[ApplyResult], None] | None = None,
) -> ReprocessResult:
    """Plan a reprocessing job on the store at ``url`` and, with ``apply``, apply it.

    The filters select candidates (see :class:`ReprocessFilter`; ``since``/``until`` take ISO-8601 or ages
    like ``7d``). The plan goes to ``out`` (default ``reprocess-<job id>``) as Parquet (+ CSV with ``csv``).
    Without ``apply`` nothing in the store changes (a dry run). Giving the ``job_id`` of an earlier job
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
    parse_rate(rate)  # a bad rate is refused before anything runs
    job_id = job_id or new_job_id()
    result = write_plan(spark, url, out or f"reprocess-{job_id}", job_id, filters, partitions=partitions, csv=csv,
                        jdbc_path=jdbc_path)
    if not apply:
        return result
    applied = apply_plan(spark, url, result.plan_path.parent, rate=rate, batch_size=batch_size, progress=progress)
    return ReprocessResult(result.job_id, result.plan_path, result.summary, applied)
