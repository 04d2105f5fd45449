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
import os
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from openroute.persistence.models import FINAL_STATES, MessageState
from openroute.persistence.secrets import mask_secrets, masked_url

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

FINAL = sorted(state.value for state in FINAL_STATES)
#: final states for which the source system is owed a confirmation (confirmation.model.CONFIRMED_STATES)
CONFIRMED = ("CANCEL", "FAILED", "OK")

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
CHECKS: dict[str, str] = {
    "stuck": "non-final messages that have not moved and are not scheduled for longer than stuck_after",
    "dead_node_processing": "PROCESSING messages owned by a node whose heartbeat stopped (or that is unknown)",
    "confirmation_missing": "final top-level messages of a confirmed source system without any confirmation row",
    "confirmation_overdue": "confirmations still PENDING after their retries or long past their due time",
    "parent_final_child_open": "final parent messages with a child that is not final (id: the child)",
    "children_final_parent_waiting": "parents WAITING_FOR_CHILDREN whose children are all final (id: the parent)",
    "duplicate_ok_call": "an external call recorded OK more than once for one (entity, key) or (message, key)",
    "history_mismatch": "messages whose transition history does not lead to their state (or is missing, broken)",
}


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

    def write(self, out: str | Path) -> Path:
        """Write report.html, summary.json and one Parquet folder per detail table under ``out``; return it.

        The Parquet tables (``out/parquet/<name>``) hold every row, the violations table every offending id.
        """
        from openroute.spark.report import render_report

        folder = Path(out)
        folder.mkdir(parents=True, exist_ok=True)
        summary = self.summary()
        (folder / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
        for name, frame in self.details.items():
            frame.write.mode("overwrite").parquet(str(folder / "parquet" / name))
        (folder / "report.html").write_text(render_report(summary))
        self.release()
        return folder

    def release(self) -> None:
        """Free the Spark cache the audit holds (the details stay readable, recomputed from the store)."""
        for frame in self.cached:
            frame.unpersist()
        self.cached.clear()


_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}


def parse_duration(value: str | timedelta) -> timedelta:
    """``30m``, ``2h``, ``7d``, ``1w``, ``90s`` (or a timedelta) as a timedelta; AuditError otherwise."""
    if isinstance(value, timedelta):
        if value <= timedelta(0):
            raise AuditError(f"a duration must be positive, got {value}")
        return value
    match = re.fullmatch(r"\s*(\d+)\s*([smhdw])\s*", str(value))
    if not match or int(match.group(1)) == 0:
        raise AuditError(f"not a duration: {value!r} (use a positive number and s, m, h, d or w, e.g. 30m or 7d)")
    return timedelta(**{_UNITS[match.group(2)]: int(match.group(1))})


def _secs(column: Column) -> Column:
    from pyspark.sql import functions as F

    return F.unix_micros(column) / F.lit(1_000_000.0)


def _read(spark: SparkSession, url: str, table: str, partitions: int, jdbc_path: str | None,
          archive: Path | None) -> DataFrame:
    """The live table (only the audited columns), with the archive's rows of it when an archive is given."""
    from pyspark.sql import functions as F

    from openroute.spark.session import read_table

    columns = COLUMNS[table]
    frame = read_table(spark, url, table, partitions, jdbc_path=jdbc_path, columns=list(columns))
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


# C901 over 12: to become a sequence of named checks (issue 29, item 4)
def audit(  # noqa: C901
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

    Raises :class:`AuditError` for a bad argument and ``SparkSetupError`` when the store cannot be read.
    """
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    now = now or datetime.now(UTC)
    if now.tzinfo is None:
        raise AuditError(f"now must be timezone-aware, got {now!r}")
    stuck = parse_duration(stuck_after)
    heartbeat = parse_duration(heartbeat_timeout)
    grace_td = parse_duration(grace)
    for name, number in (("partitions", partitions), ("id_cap", id_cap), ("top", top),
                         ("confirmation_max_attempts", confirmation_max_attempts)):
        if isinstance(number, bool) or not isinstance(number, int) or number < 1:
            raise AuditError(f"{name} must be an int >= 1, got {number!r}")
    archive = Path(include_archive) if include_archive is not None else None
    if archive is not None and not archive.is_dir():
        raise AuditError(f"no archive folder at {archive}: give the --to folder of openroute spark archive")

    def read(table: str) -> DataFrame:
        return _read(spark, url, table, partitions, jdbc_path, archive)

    now_col = F.lit(now.astimezone(UTC))
    messages = (
        read("message")
        .withColumn("day", F.to_date("receive_ts"))
        .withColumn("is_final", F.col("state").isin(FINAL))
        .persist()
    )
    transitions = read("message_transition").persist()
    route = messages.select(F.col("id").alias("message_id"), "service", "operation", "day")

    # ---- statistics --------------------------------------------------------------------------------------
    stats: dict[str, DataFrame] = {}
    stats["state_counts"] = messages.groupBy("service", "operation", "day", "state").agg(F.count("*").alias("count"))
    final_at = (
        transitions.where(F.col("to_state").isin(FINAL))
        .groupBy("message_id").agg(F.max("at").alias("final_at"))
    )
    finished = (
        messages.where("is_final").join(final_at, messages.id == final_at.message_id, "left")
        .withColumn("final_at", F.coalesce("final_at", "last_update_ts"))
        .withColumn("seconds", _secs(F.col("final_at")) - _secs(F.col("receive_ts")))
    )
    stats["throughput_hourly"] = (
        finished.groupBy("service", "operation", F.date_format("final_at", "yyyy-MM-dd HH:00").alias("hour"))
        .agg(F.count("*").alias("finished"))
    )
    stats["latency"] = finished.groupBy("service", "operation", "day").agg(
        F.count("*").alias("finished"),
        F.percentile_approx("seconds", 0.5).alias("p50_s"),
        F.percentile_approx("seconds", 0.95).alias("p95_s"),
        F.percentile_approx("seconds", 0.99).alias("p99_s"),
        F.max("seconds").alias("max_s"),
    )
    by_message = Window.partitionBy("message_id").orderBy("id")
    steps = (
        transitions.withColumn("next_at", F.lead("at").over(by_message))
        .withColumn("prev_to", F.lag("to_state").over(by_message))
        .withColumn("rank_desc", F.row_number().over(Window.partitionBy("message_id").orderBy(F.desc("id"))))
    )
    spent = steps.where(F.col("next_at").isNotNull()).withColumn(
        "seconds", _secs(F.col("next_at")) - _secs(F.col("at"))
    )
    stats["time_in_state"] = (
        spent.join(route, "message_id")
        .groupBy("service", "operation", F.col("to_state").alias("state"))
        .agg(F.count("*").alias("visits"), F.sum("seconds").alias("total_s"), F.avg("seconds").alias("avg_s"),
             F.percentile_approx("seconds", 0.95).alias("p95_s"))
    )
    stats["attempts"] = (
        messages.where("is_final")
        .groupBy("service", "operation", (F.col("failed_count") + 1).alias("attempts"))
        .agg(F.count("*").alias("count"))
    )
    per_route = Window.partitionBy("service", "operation").orderBy(F.desc("count"), "code")
    stats["top_errors"] = (
        messages.where(F.col("last_error_code").isNotNull() & (F.col("state") != "OK"))  # the current error only
        .groupBy("service", "operation", F.col("last_error_code").alias("code")).agg(F.count("*").alias("count"))
        .withColumn("rank", F.row_number().over(per_route)).where(F.col("rank") <= top).drop("rank")
    )
    business = messages.select(
        "service", "operation",
        F.explode(F.from_json("business_errors", "array<struct<code:string,text:string>>")).alias("error"),
    )
    stats["business_errors"] = (
        business.groupBy("service", "operation", F.col("error.code").alias("code")).agg(F.count("*").alias("count"))
        .withColumn("rank", F.row_number().over(per_route)).where(F.col("rank") <= top).drop("rank")
    )
    confirmations = read("confirmation").persist()
    stats["confirmations"] = (
        confirmations.withColumn("day", F.to_date("created_at"))
        .withColumn("lag_s", _secs(F.col("sent_at")) - _secs(F.col("created_at")))
        .groupBy("source_system", "day")
        .agg(F.count("*").alias("count"),
             F.sum(F.when(F.col("status") == "SENT", 1).otherwise(0)).alias("sent"),
             F.sum(F.when(F.col("status") == "PENDING", 1).otherwise(0)).alias("pending"),
             F.sum(F.when(F.col("status") == "FAILED", 1).otherwise(0)).alias("failed"),
             F.avg("attempts").alias("avg_attempts"),
             F.percentile_approx("lag_s", 0.5).alias("lag_p50_s"),
             F.percentile_approx("lag_s", 0.95).alias("lag_p95_s"),
             F.max("lag_s").alias("lag_max_s"))
    )
    stats["funnel_postpones"] = (
        transitions.where(F.col("to_state") == MessageState.POSTPONED.value).join(route, "message_id")
        .groupBy("service", "operation", "day")
        .agg(F.count("*").alias("postpones"), F.countDistinct("message_id").alias("messages"))
    )

    # ---- consistency checks (each a frame of message_id) -------------------------------------------------
    violations: dict[str, DataFrame] = {}
    horizon = now_col - F.expr(f"INTERVAL {int(stuck.total_seconds())} SECONDS")
    violations["stuck"] = messages.where(
        ~F.col("is_final") & (F.col("last_update_ts") < horizon)
        & (F.col("next_attempt_at").isNull() | (F.col("next_attempt_at") < horizon))
    ).select(F.col("id").alias("message_id"))

    nodes = _read_nodes(spark, url, jdbc_path)
    alive = nodes.where(
        F.col("stopped_at").isNull()
        & (F.col("heartbeat_at") >= now_col - F.expr(f"INTERVAL {int(heartbeat.total_seconds())} SECONDS"))
    ).select(F.col("id").alias("node_id"))
    violations["dead_node_processing"] = (
        messages.where(F.col("state") == MessageState.PROCESSING.value)
        .join(alive, "node_id", "left_anti").select(F.col("id").alias("message_id"))
    )

    settled = now_col - F.expr(f"INTERVAL {int(grace_td.total_seconds())} SECONDS")
    if confirmed_systems is None:
        systems = confirmations.select("source_system").distinct()
    else:
        systems = spark.createDataFrame([(s,) for s in confirmed_systems], "source_system string")
    owed = (
        messages.where(F.col("state").isin(list(CONFIRMED)) & F.col("parent_id").isNull()
                       & (F.col("last_update_ts") < settled))
        .join(F.broadcast(systems), "source_system", "left_semi")
    )
    violations["confirmation_missing"] = (
        owed.join(confirmations.select(F.col("message_id").alias("id")), "id", "left_anti")
        .select(F.col("id").alias("message_id"))
    )
    violations["confirmation_overdue"] = confirmations.where(
        (F.col("status") == "PENDING")
        & ((F.col("attempts") >= confirmation_max_attempts) | (F.col("next_attempt_at") < horizon))
    ).select("message_id")

    parents = messages.select(F.col("id").alias("parent_id"), F.col("is_final").alias("parent_final"),
                              F.col("state").alias("parent_state"), F.col("last_update_ts").alias("parent_ts"))
    children = messages.where(F.col("parent_id").isNotNull()).join(parents, "parent_id")
    violations["parent_final_child_open"] = children.where(
        F.col("parent_final") & ~F.col("is_final")
    ).select(F.col("id").alias("message_id"))
    violations["children_final_parent_waiting"] = (
        children.where(F.col("parent_state") == MessageState.WAITING_FOR_CHILDREN.value)
        .groupBy("parent_id")
        .agg(F.min(F.col("is_final").cast("int")).alias("all_final"), F.max("last_update_ts").alias("last_child"))
        .where((F.col("all_final") == 1) & (F.col("last_child") < settled))
        .select(F.col("parent_id").alias("message_id"))
    )

    entity_dups = (
        read("entity_call").where(F.col("status") == "OK")
        .withColumn("n", F.count("*").over(Window.partitionBy("entity_type", "object_id", "call_key")))
        .where(F.col("n") > 1).select(F.col("owner_message_id").alias("message_id"))
    )
    message_dups = (
        read("external_call").where(F.col("status") == "OK")
        .withColumn("n", F.count("*").over(Window.partitionBy("message_id", "call_key")))
        .where(F.col("n") > 1).select("message_id")
    )
    violations["duplicate_ok_call"] = entity_dups.unionByName(message_dups).where(F.col("message_id").isNotNull())

    history_start = transitions.agg(F.min("at").alias("start"), F.count("*").alias("rows")).first()
    broken = steps.where(
        F.col("prev_to").isNotNull() & ~F.col("from_state").eqNullSafe(F.col("prev_to"))
    ).select("message_id")
    last = steps.where(F.col("rank_desc") == 1).select("message_id", F.col("to_state").alias("last_to"))
    wrong_end = (
        messages.join(last, messages.id == last.message_id, "left")
        .where(F.col("last_to").isNull() | (F.col("last_to") != F.col("state")))
    )
    if history_start is None or history_start["start"] is None:
        wrong_end = wrong_end.where(F.col("last_to").isNotNull())
    else:
        # messages received before the store kept transitions have no history to check
        started = F.lit(history_start["start"])
        wrong_end = wrong_end.where(F.col("last_to").isNotNull() | (F.col("receive_ts") >= started))
    violations["history_mismatch"] = broken.unionByName(wrong_end.select(F.col("id").alias("message_id")))

    found = None
    for name in CHECKS:
        ids = violations[name].select(F.col("message_id").cast("long").alias("message_id"), F.lit(name).alias("check"))
        found = ids if found is None else found.unionByName(ids)
    assert found is not None  # noqa: S101  narrows an Optional for mypy: set before this point
    found = found.distinct().persist()
    counts = {r["check"]: int(r["count"]) for r in found.groupBy("check").count().collect()}
    first: dict[str, list[int]] = {name: [] for name in CHECKS}
    capped = found.withColumn("n", F.row_number().over(Window.partitionBy("check").orderBy("message_id")))
    for row in capped.where(F.col("n") <= id_cap).select("check", "message_id").collect():
        first[row["check"]].append(int(row["message_id"]))
    checks = [CheckResult(name, description, counts.get(name, 0), sorted(first[name]))
              for name, description in CHECKS.items()]

    # every statistic in one Spark job (their stages run side by side), as JSON rows
    packed = None
    for name, frame in stats.items():
        part = frame.select(F.lit(name).alias("table"),
                            F.to_json(F.struct(*frame.columns), {"ignoreNullFields": "false"}).alias("row"))
        packed = part if packed is None else packed.unionByName(part)
    assert packed is not None  # noqa: S101  narrows an Optional for mypy: set before this point
    lines: dict[str, list[str]] = {name: [] for name in stats}
    for row in packed.collect():
        lines[row["table"]].append(row["row"])
    collected: dict[str, list[dict[str, Any]]] = {}
    for name, frame in stats.items():
        keys = frame.columns[:4]

        def order(r: dict[str, Any], keys: list[str] = keys) -> tuple[tuple[bool, str], ...]:
            return tuple((r[k] is None, str(r[k])) for k in keys)

        collected[name] = sorted((json.loads(line) for line in lines[name]), key=order)
    state_totals: dict[str, int] = {}
    for entry in collected["state_counts"]:
        state_totals[entry["state"]] = state_totals.get(entry["state"], 0) + int(entry["count"])
    totals = {
        "messages": sum(state_totals.values()),
        "by_state": dict(sorted(state_totals.items())),
        "transitions": int(history_start["rows"]) if history_start is not None else 0,
        "confirmations": sum(int(r["count"]) for r in collected["confirmations"]),
        "routes": len({(r["service"], r["operation"]) for r in collected["state_counts"]}),
    }
    # the detail tables are the collected aggregates again (writing them reads nothing from the store)
    details = {name: spark.read.schema(frame.schema).json(spark.sparkContext.parallelize(lines[name] or [], 1))
               for name, frame in stats.items()}
    details["violations"] = found
    settings = {
        "url": masked_url(url), "now": now.isoformat(), "stuck_after": str(stuck),
        "heartbeat_timeout": str(heartbeat), "grace": str(grace_td),
        "confirmation_max_attempts": confirmation_max_attempts,
        "confirmed_systems": list(confirmed_systems) if confirmed_systems is not None else None,
        "include_archive": str(archive) if archive else None, "id_cap": id_cap,
    }
    return AuditResult(datetime.now(UTC), checks, collected, totals, settings, details,
                       [messages, transitions, confirmations, found])


# ---- command line (``openroute spark audit``) -------------------------------------------------------------


def add_audit_parser(subparsers: Any, parents: Sequence[argparse.ArgumentParser] = ()) -> argparse.ArgumentParser:
    """Add ``audit`` to ``subparsers`` (those of ``openroute spark``); :func:`run_audit_job` runs the parsed args.

    ``parents`` carry the options every Spark job shares (``--database-url``, ``--master``, ``--partitions``,
    ``--jdbc-path``); without them this parser adds its own.
    """
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "audit", parents=list(parents),
        help="statistics and consistency checks of the message store (exit 1 when a check fails)",
        description="Audit the message store in Spark: per-route statistics and consistency checks. Writes "
                    "report.html, summary.json and Parquet detail tables to --out. Exit status: 0 every check "
                    "passes, 1 a check fails, 2 usage or connection error.",
    )
    if not parents:
        parser.add_argument("--database-url", default=None,
                            help="the store's SQLAlchemy URL (default: $OPENROUTE_DATABASE_URL, else "
                                 "sqlite:///openroute.db)")
        parser.add_argument("--master", default=None, help="Spark master (local[*] by default, spark://..., yarn)")
        parser.add_argument("--partitions", type=int, default=4, help="parallel JDBC reads per table (default 4)")
        parser.add_argument("--jdbc-path", default=None, help="a JDBC driver jar or folder (before /usr/share/java)")
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

    Raises :class:`AuditError` for a bad option and ``SparkSetupError`` when the store cannot be read.
    """
    from openroute.persistence import DEFAULT_DATABASE_URL

    url = str(args.database_url or os.environ.get("OPENROUTE_DATABASE_URL") or DEFAULT_DATABASE_URL)
    result = audit(
        spark, url, now=args.now, stuck_after=args.stuck_after,
        heartbeat_timeout=args.heartbeat_timeout, grace=args.grace,
        confirmation_max_attempts=args.confirmation_max_attempts,
        confirmed_systems=args.confirmed_systems, include_archive=args.include_archive,
        partitions=args.partitions, id_cap=args.id_cap, jdbc_path=args.jdbc_path,
    )
    out = result.write(args.out)
    for check in result.checks:
        status = "ok  " if check.passed else "FAIL"
        shown = ", ".join(str(i) for i in check.ids[:10]) + (" ..." if check.count > 10 else "")
        print(f"{status} {check.name}: {check.count}" + (f" ({shown})" if check.count else ""))
    print(f"report: {out / 'report.html'}")
    return 0 if result.passed else 1


def main(argv: Sequence[str] | None = None) -> int:
    """``openroute spark audit`` on its own: parse ``argv``, run, return the exit status 0, 1 or 2 (one line on
    stderr for a bad option or an unreadable store; argparse itself exits 2 on a usage error)."""
    from openroute.spark.session import SparkSetupError, build_session

    parser = argparse.ArgumentParser(prog="openroute spark")
    add_audit_parser(parser.add_subparsers(dest="spark_command", required=True))
    args = parser.parse_args(["audit", *(argv if argv is not None else sys.argv[1:])])
    try:
        from pyspark.sql import SparkSession

        running = SparkSession.getActiveSession()
        spark = build_session(args.master, app_name="openroute spark audit", jdbc_path=args.jdbc_path)
        try:
            return run_audit_job(spark, args)
        finally:
            if running is None:  # a session the caller started stays running
                spark.stop()
    except (AuditError, SparkSetupError) as error:
        print(f"openroute spark audit: {mask_secrets(str(error))}", file=sys.stderr)
        return 2
