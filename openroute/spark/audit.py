"""The audit job: statistics and consistency checks of the whole message store, computed in Spark.

It reads ``message``, ``message_transition``, ``external_call``, ``entity_call``, ``confirmation`` and ``node``
over JDBC in id-range partitions (plus, on request, the Parquet archive written by ``openroute spark archive``),
aggregates on the executors and brings back to the driver only aggregates and, per consistency check, the
offending message ids (at most ``id_cap`` of them; the full lists are written as Parquet)::

    from openroute.spark.audit import audit
    from openroute.spark.session import build_session

    result = audit(build_session(), "postgresql+psycopg://openroute@db/openroute", stuck_after="2h")
    for check in result.checks:
        print(check.name, check.count, check.ids[:10])
    result.write("audit-out")          # report.html, summary.json, Parquet detail tables
    raise SystemExit(0 if result.passed else 1)
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from openroute.persistence.secrets import masked_url
from openroute.spark._ages import parse_age
from openroute.spark.audit_checks import CONSISTENCY_CHECKS, FINAL, STATISTICS, AuditFrames, AuditSettings
from openroute.spark.outputs import OutputKind, prune_outputs, pruned_line, retention_setting

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from openroute.spark.session import IdRange

#: the columns of each table the audit reads (never the payload)
COLUMNS: dict[str, tuple[str, ...]] = {
    "message": (
        "id", "source_system", "service", "operation", "object_id", "entity_type", "funnel_value", "state",
        "failed_count", "receive_ts", "last_update_ts", "next_attempt_at", "node_id", "business_errors",
        "last_error_code", "parent_id",
    ),
    "message_transition": ("id", "message_id", "from_state", "to_state", "at", "node_id", "attempt", "error_code",
                           "cause"),
    "external_call": ("id", "message_id", "call_key", "status", "attempts", "created_at", "updated_at"),
    "entity_call": ("id", "entity_type", "object_id", "call_key", "status", "owner_message_id", "attempts",
                    "created_at", "updated_at"),
    "confirmation": ("id", "message_id", "source_system", "outcome_state", "status", "attempts", "next_attempt_at",
                     "created_at", "updated_at", "sent_at"),
    "node": ("id", "heartbeat_at", "stopped_at"),
}

#: the tables ``openroute spark archive`` moves to Parquet (entity calls and nodes stay in the store)
ARCHIVED_TABLES = ("message", "message_transition", "external_call", "confirmation")

#: what each consistency check finds (the keys are the check names of the report and summary.json)
CHECKS: dict[str, str] = {step.name: step.description for step in CONSISTENCY_CHECKS}


class AuditError(ValueError):
    """A bad audit argument (a duration, a threshold, a missing archive folder); nothing was read."""


@dataclass(frozen=True)
class CheckResult:
    """One consistency check: how many message ids break it and the first ``id_cap`` of them, ascending."""

    name: str
    description: str
    count: int
    ids: list[int]

    @property
    def passed(self) -> bool:
        """True when no message breaks the check."""
        return self.count == 0


@dataclass
class AuditResult:
    """What :func:`audit` found: the checks, the statistics (small collected tables) and the Spark detail frames.

    ``statistics`` maps a table name (``state_counts``, ``throughput_hourly``, ``latency``, ``time_in_state``,
    ``attempts``, ``top_errors``, ``business_errors``, ``confirmations``, ``funnel_postpones``) to its rows as
    dicts; ``details`` maps the same names plus ``violations`` to the Spark DataFrames they were collected from.
    """

    generated_at: datetime
    checks: list[CheckResult]
    statistics: dict[str, list[dict[str, Any]]]
    totals: dict[str, Any]
    settings: dict[str, Any]
    details: dict[str, DataFrame] = field(default_factory=dict, repr=False)
    #: the frames the audit keeps cached in Spark until :meth:`release` (or :meth:`write`) frees them
    cached: list[DataFrame] = field(default_factory=list, repr=False)
    #: older audit folders :meth:`write` deleted beside its own (the retention)
    pruned: list[Path] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        """True when every consistency check passes (the CLI's exit code 0)."""
        return all(check.passed for check in self.checks)

    def check(self, name: str) -> CheckResult:
        """The check called ``name`` (one of :data:`CHECKS`); KeyError for another name."""
        for check in self.checks:
            if check.name == name:
                return check
        raise KeyError(f"no audit check {name!r}: the checks are {', '.join(CHECKS)}")

    def summary(self) -> dict[str, Any]:
        """The JSON-ready summary (what summary.json holds)."""
        return {
            "generated_at": self.generated_at.isoformat(),
            "passed": self.passed,
            "settings": self.settings,
            "totals": self.totals,
            "checks": {
                c.name: {"passed": c.passed, "count": c.count, "ids": c.ids, "description": c.description}
                for c in self.checks
            },
            "statistics": self.statistics,
        }

    def write(self, out: str | Path, retention: str | timedelta | None = None) -> Path:
        """Write report.html, summary.json and one Parquet folder per detail table under ``out``; return it.

        The Parquet tables (``out/parquet/<name>``) hold every row, the violations table every offending id.
        Audit folders beside ``out`` older than ``retention`` (default ``$OPENROUTE_SPARK_RETENTION``; none: keep
        all) are deleted afterwards and listed in :attr:`pruned`.
        """
        from openroute.spark.report import render_report

        retention_setting(retention)  # a bad retention is refused before anything is written
        folder = Path(out)
        folder.mkdir(parents=True, exist_ok=True)
        summary = self.summary()
        (folder / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
        for name, frame in self.details.items():
            frame.write.mode("overwrite").parquet(str(folder / "parquet" / name))
        (folder / "report.html").write_text(render_report(summary))
        self.release()
        self.pruned = prune_outputs(folder, retention, OutputKind.AUDIT)
        return folder

    def release(self) -> None:
        """Free the Spark cache the audit holds (the details stay readable, recomputed from the store)."""
        for frame in self.cached:
            frame.unpersist()
        self.cached.clear()


def parse_duration(value: str | timedelta) -> timedelta:
    """``30m``, ``2h``, ``7d``, ``1w``, ``90s`` (or a timedelta) as a timedelta; AuditError otherwise."""
    if isinstance(value, timedelta):
        if value <= timedelta(0):
            raise AuditError(f"a duration must be positive, got {value}")
        return value
    age = parse_age(str(value))
    if age is None or not age:
        raise AuditError(f"not a duration: {value!r} (use a positive number and s, m, h, d or w, e.g. 30m or 7d)")
    return age


def _read(spark: SparkSession, url: str, table: str, partitions: int, jdbc_path: str | None,
          archive: Path | None, id_range: IdRange | None = None) -> DataFrame:
    """The live table (only the audited columns), with the archive's rows of it when an archive is given."""
    from pyspark.sql import functions as F

    from openroute.spark.session import read_table

    columns = COLUMNS[table]
    frame = read_table(spark, url, table, partitions, jdbc_path=jdbc_path, columns=list(columns), id_range=id_range)
    if archive is not None and table in ARCHIVED_TABLES:
        from openroute.spark.archive import read_archive

        try:
            archived = read_archive(spark, archive, table)
        except ValueError as nothing:
            if table == "message":  # a folder without any finished run is no archive
                raise AuditError(f"--include-archive {archive}: {nothing}") from None
            return frame
        for name in columns:
            if name not in archived.columns:
                archived = archived.withColumn(name, F.lit(None))
        archived = archived.select(*[F.col(name).cast(frame.schema[name].dataType) for name in columns])
        # a run killed after its copy but before its delete leaves rows in both places: count them once
        frame = frame.unionByName(archived).dropDuplicates(["id"])
    return frame


def _read_nodes(spark: SparkSession, url: str, jdbc_path: str | None) -> DataFrame:
    """The node table in one partition (its key is text, so it has no id ranges; it is small)."""
    from pyspark.sql import functions as F

    from openroute.spark.session import SparkSetupError, first_line, jdbc_source

    source = jdbc_source(url, jdbc_path)
    reader = spark.read.format("jdbc").option("url", source.url)
    for key, value in source.properties.items():
        reader = reader.option(key, value)
    reader = reader.option("query", "SELECT id, heartbeat_at, stopped_at FROM node")
    if source.backend == "sqlite":
        # SQLite keeps timestamps as UTC text: read as text, parsed by Spark (as read_table does)
        reader = reader.option("customSchema", "id STRING, heartbeat_at STRING, stopped_at STRING")
    try:
        frame = reader.load()
    except Exception as error:
        raise SparkSetupError(f"cannot read table node from {source.describe()}: {first_line(error)}") from None
    return frame.select("id", F.to_timestamp("heartbeat_at").alias("heartbeat_at"),
                        F.to_timestamp("stopped_at").alias("stopped_at"))


def audit(
    spark: SparkSession,
    url: str,
    *,
    now: datetime | None = None,
    stuck_after: str | timedelta = "1h",
    heartbeat_timeout: str | timedelta = "5m",
    grace: str | timedelta = "15m",
    confirmation_max_attempts: int = 10,
    confirmed_systems: Sequence[str] | None = None,
    include_archive: str | Path | None = None,
    partitions: int = 4,
    id_cap: int = 1000,
    top: int = 10,
    jdbc_path: str | None = None,
) -> AuditResult:
    """Audit the store at ``url`` (a SQLAlchemy URL) with ``spark``; return an :class:`AuditResult`.

    - ``now``: the audit's clock (aware; the current UTC time by default).
    - ``stuck_after``: a non-final message that has not changed and is not due for longer than this is stuck.
    - ``heartbeat_timeout``: a node whose heartbeat is older than this (or that stopped) is dead.
    - ``grace``: how long a final message may wait for its confirmation row, and a waiting parent whose
      children are all final for its own outcome, before it counts as a violation.
    - ``confirmation_max_attempts``: a PENDING confirmation with this many attempts is overdue
      (ConfirmationPolicy.max_attempts).
    - ``confirmed_systems``: the source systems that get confirmations (by default every system that has at
      least one confirmation row in the store).
    - ``include_archive``: a folder written by ``openroute spark archive`` read together with the live store.
    - ``partitions``: parallel JDBC reads per table; ``id_cap``: ids kept per check; ``top``: error codes kept
      per route.

    The audit is a sequence of named steps (:mod:`openroute.spark.audit_checks`): the tables are read once,
    each statistic of :data:`~openroute.spark.audit_checks.STATISTICS` and each check of
    :data:`~openroute.spark.audit_checks.CONSISTENCY_CHECKS` is computed from them, and the results come back
    to the driver in two Spark jobs. Raises :class:`AuditError` for a bad argument and ``SparkSetupError``
    when the store cannot be read.
    """
    settings = _settings(now, stuck_after, heartbeat_timeout, grace, confirmation_max_attempts, confirmed_systems,
                         top, partitions, id_cap)
    archive = Path(include_archive) if include_archive is not None else None
    if archive is not None and not archive.is_dir():
        raise AuditError(f"no archive folder at {archive}: give the --to folder of openroute spark archive")
    frames = _frames(spark, url, settings, partitions, jdbc_path, archive)
    found = _violations(frames)
    checks = _check_results(found, id_cap)
    stats = {step.name: step.run(frames) for step in STATISTICS}
    collected, lines = _collect(stats)
    totals = _totals(collected, frames.transitions.count())
    # the detail tables are the collected aggregates again (writing them reads nothing from the store)
    details = {name: _rows_frame(spark, lines[name], frame) for name, frame in stats.items()}
    details["violations"] = found
    described = {
        "url": masked_url(url), "now": settings.now.isoformat(), "stuck_after": str(settings.stuck_after),
        "heartbeat_timeout": str(settings.heartbeat_timeout), "grace": str(settings.grace),
        "confirmation_max_attempts": confirmation_max_attempts,
        "confirmed_systems": list(confirmed_systems) if confirmed_systems is not None else None,
        "include_archive": str(archive) if archive else None, "id_cap": id_cap,
    }
    return AuditResult(datetime.now(UTC), checks, collected, totals, described, details,
                       [frames.messages, frames.transitions, frames.confirmations, found])


def _settings(now: datetime | None, stuck_after: str | timedelta, heartbeat_timeout: str | timedelta,
              grace: str | timedelta, confirmation_max_attempts: int, confirmed_systems: Sequence[str] | None,
              top: int, partitions: int, id_cap: int) -> AuditSettings:
    """The audit's thresholds, checked: AuditError names the first bad one."""
    now = now or datetime.now(UTC)
    if now.tzinfo is None:
        raise AuditError(f"now must be timezone-aware, got {now!r}")
    stuck, heartbeat, settled = (parse_duration(value) for value in (stuck_after, heartbeat_timeout, grace))
    for name, number in (("partitions", partitions), ("id_cap", id_cap), ("top", top),
                         ("confirmation_max_attempts", confirmation_max_attempts)):
        if isinstance(number, bool) or not isinstance(number, int) or number < 1:
            raise AuditError(f"{name} must be an int >= 1, got {number!r}")
    return AuditSettings(now.astimezone(UTC), stuck, heartbeat, settled, confirmation_max_attempts, confirmed_systems,
                         top)


def _frames(spark: SparkSession, url: str, settings: AuditSettings, partitions: int, jdbc_path: str | None,
            archive: Path | None) -> AuditFrames:
    """The store's tables as the steps read them, each read once (the message and transition tables cached)."""
    from pyspark.sql import functions as F

    from openroute.spark.session import id_ranges

    # the id ranges every partitioned read splits, in one query (not one bounds query per table)
    ranges = id_ranges(spark, url, [table for table in COLUMNS if table != "node"], jdbc_path)

    def read(table: str) -> DataFrame:
        return _read(spark, url, table, partitions, jdbc_path, archive, ranges[table])

    messages = (
        read("message")
        .withColumn("day", F.to_date("receive_ts"))
        .withColumn("is_final", F.col("state").isin(FINAL))
        .persist()
    )
    return AuditFrames(spark, settings, messages, read("message_transition").persist(),
                       read("confirmation").persist(), _read_nodes(spark, url, jdbc_path), read)


def _violations(frames: AuditFrames) -> DataFrame:
    """Every check's offending ids as one cached frame of (message_id, check)."""
    from pyspark.sql import functions as F

    found = None
    for step in CONSISTENCY_CHECKS:
        ids = step.run(frames).select(F.col("message_id").cast("long").alias("message_id"),
                                      F.lit(step.name).alias("check"))
        found = ids if found is None else found.unionByName(ids)
    assert found is not None  # noqa: S101  narrows an Optional for mypy: the checks are not empty
    return found.distinct().persist()


def _check_results(found: DataFrame, id_cap: int) -> list[CheckResult]:
    """One result per check, in order: its count and its first ``id_cap`` ids (one Spark job for each)."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    counts = {r["check"]: int(r["count"]) for r in found.groupBy("check").count().collect()}
    first: dict[str, list[int]] = {name: [] for name in CHECKS}
    capped = found.withColumn("n", F.row_number().over(Window.partitionBy("check").orderBy("message_id")))
    for row in capped.where(F.col("n") <= id_cap).select("check", "message_id").collect():
        first[row["check"]].append(int(row["message_id"]))
    return [CheckResult(name, description, counts.get(name, 0), sorted(first[name]))
            for name, description in CHECKS.items()]


def _collect(stats: dict[str, DataFrame]) -> tuple[dict[str, list[dict[str, Any]]], dict[str, list[str]]]:
    """Every statistic in one Spark job (their stages run side by side): (rows as dicts, rows as JSON lines)."""
    from pyspark.sql import functions as F

    packed = None
    for name, frame in stats.items():
        part = frame.select(F.lit(name).alias("table"),
                            F.to_json(F.struct(*frame.columns), {"ignoreNullFields": "false"}).alias("row"))
        packed = part if packed is None else packed.unionByName(part)
    assert packed is not None  # noqa: S101  narrows an Optional for mypy: the statistics are not empty
    lines: dict[str, list[str]] = {name: [] for name in stats}
    for row in packed.collect():
        lines[row["table"]].append(row["row"])
    collected: dict[str, list[dict[str, Any]]] = {}
    for name, frame in stats.items():
        keys = frame.columns[:4]

        def order(r: dict[str, Any], keys: list[str] = keys) -> tuple[tuple[bool, str], ...]:
            return tuple((r[k] is None, str(r[k])) for k in keys)

        collected[name] = sorted((json.loads(line) for line in lines[name]), key=order)
    return collected, lines


def _rows_frame(spark: SparkSession, lines: list[str], like: DataFrame) -> DataFrame:
    """Collected JSON rows as a frame with ``like``'s schema (works on a Connect session: no SparkContext)."""
    from pyspark.sql import functions as F

    raw = spark.createDataFrame([(line,) for line in lines], "value string")
    return raw.select(F.from_json("value", like.schema).alias("row")).select("row.*")


def _totals(collected: dict[str, list[dict[str, Any]]], transitions: int) -> dict[str, Any]:
    state_totals: dict[str, int] = {}
    for entry in collected["state_counts"]:
        state_totals[entry["state"]] = state_totals.get(entry["state"], 0) + int(entry["count"])
    return {
        "messages": sum(state_totals.values()),
        "by_state": dict(sorted(state_totals.items())),
        "transitions": transitions,
        "confirmations": sum(int(r["count"]) for r in collected["confirmations"]),
        "routes": len({(r["service"], r["operation"]) for r in collected["state_counts"]}),
    }


# ---- command line (``openroute spark audit``) -------------------------------------------------------------


def add_audit_parser(subparsers: Any, parents: Sequence[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    """Add ``audit`` to ``subparsers`` (those of ``openroute spark``); :func:`run_audit_job` runs the parsed args.

    ``parents`` carry the options every Spark job shares (``--database-url``, ``--config``, ``--master``,
    ``--partitions``, ``--jdbc-path``, ``--retention``): the store's URL is resolved by the command line as for
    every command (:mod:`openroute.cli`).
    """
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "audit", parents=list(parents),
        help="statistics and consistency checks of the message store (exit 1 when a check fails)",
        description="Audit the message store in Spark: per-route statistics and consistency checks. Writes "
                    "report.html, summary.json and Parquet detail tables to --out. Exit status: 0 every check "
                    "passes, 1 a check fails, 2 usage or connection error.",
    )
    parser.add_argument("--out", required=True, help="folder for report.html, summary.json and Parquet tables")
    parser.add_argument("--now", default=None, type=_aware,
                        help="the audit's clock, ISO-8601 with a zone (default: the current time)")
    parser.add_argument("--stuck-after", default="1h", help="non-final and idle longer than this is stuck (1h)")
    parser.add_argument("--heartbeat-timeout", default="5m", help="a node silent this long is dead (5m)")
    parser.add_argument("--grace", default="15m", help="time allowed for confirmations and parent outcomes (15m)")
    parser.add_argument("--confirmation-max-attempts", type=int, default=10,
                        help="a PENDING confirmation with this many attempts is overdue (10)")
    parser.add_argument("--confirmed-system", action="append", dest="confirmed_systems", default=None,
                        help="a source system that gets confirmations (repeatable; default: those that have any)")
    parser.add_argument("--include-archive", default=None, metavar="PATH",
                        help="read the Parquet archive of openroute spark archive together with the live store")
    parser.add_argument("--id-cap", type=int, default=1000, help="ids listed per check in summary.json (1000)")
    return parser


def _aware(value: str) -> datetime:
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an ISO-8601 time: {value!r}") from None
    if parsed.tzinfo is None:
        raise argparse.ArgumentTypeError(f"give the zone too (e.g. {value}Z or {value}+00:00), got {value!r}")
    return parsed


def run_audit_job(spark: SparkSession, args: argparse.Namespace) -> int:
    """Audit with ``spark`` as the parsed ``args`` say, print one line per check; return 0 (all pass) or 1.

    ``args.database_url`` is the store's URL as the command line resolved it (:mod:`openroute.cli`).
    Raises :class:`AuditError` for a bad option and ``SparkSetupError`` when the store cannot be read.
    """
    result = audit(
        spark, str(args.database_url), now=args.now, stuck_after=args.stuck_after,
        heartbeat_timeout=args.heartbeat_timeout, grace=args.grace,
        confirmation_max_attempts=args.confirmation_max_attempts,
        confirmed_systems=args.confirmed_systems, include_archive=args.include_archive,
        partitions=args.partitions, id_cap=args.id_cap, jdbc_path=args.jdbc_path,
    )
    out = result.write(args.out, args.retention)
    for check in result.checks:
        status = "ok  " if check.passed else "FAIL"
        shown = ", ".join(str(i) for i in check.ids[:10]) + (" ..." if check.count > 10 else "")
        print(f"{status} {check.name}: {check.count}" + (f" ({shown})" if check.count else ""))
    print(f"report: {out / 'report.html'}")
    pruned = pruned_line(result.pruned, OutputKind.AUDIT)
    if pruned:
        print(pruned)
    return 0 if result.passed else 1
