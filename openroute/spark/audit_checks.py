"""The audit's named steps: each statistic and each consistency check is one small function over the store's frames.

:func:`openroute.spark.audit.audit` reads the tables once (:class:`AuditFrames`), then runs
:data:`STATISTICS` and :data:`CONSISTENCY_CHECKS` in order; a check returns the ids of the messages that break
it (a frame of ``message_id``), a statistic a small aggregate frame. The name of each is the one the
report and ``summary.json`` show::

    from openroute.spark.audit_checks import CONSISTENCY_CHECKS

    for check in CONSISTENCY_CHECKS:
        print(check.name, check.description)        # stuck, dead_node_processing, ...
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from openroute.engine.outcome import NOT_ATTEMPTS, ErrorCode
from openroute.persistence.models import FINAL_STATES, ConfirmationStatus, ExternalCallStatus, MessageState

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

FINAL = sorted(state.value for state in FINAL_STATES)
#: the codes of holds that are no error: a funnel's, a newer message's (the top errors leave them out)
_NOT_ERRORS = frozenset({ErrorCode.FUNNEL.value, ErrorCode.OBSOLETE.value})
#: final states for which the source system is owed a confirmation (confirmation.model.CONFIRMED_STATES)
CONFIRMED = (MessageState.CANCEL.value, MessageState.FAILED.value, MessageState.OK.value)


@dataclass(frozen=True)
class AuditSettings:
    """The thresholds of one audit (see :func:`openroute.spark.audit.audit` for each)."""

    now: datetime
    stuck_after: timedelta
    heartbeat_timeout: timedelta
    grace: timedelta
    confirmation_max_attempts: int
    confirmed_systems: Sequence[str] | None
    top: int


@dataclass(frozen=True)
class AuditFrames:
    """What every step reads: the store's tables as Spark frames (messages and transitions cached)."""

    spark: SparkSession
    settings: AuditSettings
    #: the message table with ``day`` (of receipt) and ``is_final``
    messages: DataFrame
    transitions: DataFrame
    confirmations: DataFrame
    nodes: DataFrame
    #: reads another table of the store (entity_call, external_call) with the audit's partitions and archive
    read: Callable[[str], DataFrame]

    def ago(self, age: timedelta) -> Column:
        """The audit's clock minus ``age``, as a Spark timestamp."""
        from pyspark.sql import functions as F

        return F.lit(self.settings.now) - F.expr(f"INTERVAL {int(age.total_seconds())} SECONDS")

    def routes(self) -> DataFrame:
        """message_id -> service, operation, day."""
        from pyspark.sql import functions as F

        return self.messages.select(F.col("id").alias("message_id"), "service", "operation", "day")

    def steps(self) -> DataFrame:
        """The transitions with, per message, the next row's time, the previous row's state and the rank from
        the last row (1 = the last)."""
        from pyspark.sql import Window
        from pyspark.sql import functions as F

        by_message = Window.partitionBy("message_id").orderBy("id")
        return (
            self.transitions.withColumn("next_at", F.lead("at").over(by_message))
            .withColumn("prev_to", F.lag("to_state").over(by_message))
            .withColumn("rank_desc", F.row_number().over(Window.partitionBy("message_id").orderBy(F.desc("id"))))
        )


def seconds(column: Column) -> Column:
    """A timestamp column as seconds since the epoch (a double)."""
    from pyspark.sql import functions as F

    return F.unix_micros(column) / F.lit(1_000_000.0)


@dataclass(frozen=True)
class Step:
    """A named step of the audit: a statistic (a small table) or a check (offending message ids)."""

    name: str
    description: str
    run: Callable[[AuditFrames], DataFrame]


# ---- statistics ----------------------------------------------------------------------------------------------


def state_counts(frames: AuditFrames) -> DataFrame:
    """Statistic: messages per route, day of receipt and state (``count``)."""
    from pyspark.sql import functions as F

    return frames.messages.groupBy("service", "operation", "day", "state").agg(F.count("*").alias("count"))


def _finished(frames: AuditFrames) -> DataFrame:
    """Final messages with the time they ended (their last transition into a final state) and their latency."""
    from pyspark.sql import functions as F

    messages = frames.messages
    final_at = (
        frames.transitions.where(F.col("to_state").isin(FINAL))
        .groupBy("message_id").agg(F.max("at").alias("final_at"))
    )
    return (
        messages.where("is_final").join(final_at, messages.id == final_at.message_id, "left")
        .withColumn("final_at", F.coalesce("final_at", "last_update_ts"))
        .withColumn("seconds", seconds(F.col("final_at")) - seconds(F.col("receive_ts")))
    )


def throughput_hourly(frames: AuditFrames) -> DataFrame:
    """Statistic: final messages per route and hour in which they ended (``finished``)."""
    from pyspark.sql import functions as F

    hour = F.date_format("final_at", "yyyy-MM-dd HH:00").alias("hour")
    return _finished(frames).groupBy("service", "operation", hour).agg(F.count("*").alias("finished"))


def latency(frames: AuditFrames) -> DataFrame:
    """Statistic: time from receipt to final state per route and day of receipt (count; p50, p95, p99, max seconds)."""
    from pyspark.sql import functions as F

    return _finished(frames).groupBy("service", "operation", "day").agg(
        F.count("*").alias("finished"),
        F.percentile_approx("seconds", 0.5).alias("p50_s"),
        F.percentile_approx("seconds", 0.95).alias("p95_s"),
        F.percentile_approx("seconds", 0.99).alias("p99_s"),
        F.max("seconds").alias("max_s"),
    )


def time_in_state(frames: AuditFrames) -> DataFrame:
    """Statistic: per route and state, the visits and the seconds spent there (total, mean, p95); a state not left yet
    is not counted."""
    from pyspark.sql import functions as F

    spent = frames.steps().where(F.col("next_at").isNotNull()).withColumn(
        "seconds", seconds(F.col("next_at")) - seconds(F.col("at"))
    )
    return (
        spent.join(frames.routes(), "message_id")
        .groupBy("service", "operation", F.col("to_state").alias("state"))
        .agg(F.count("*").alias("visits"), F.sum("seconds").alias("total_s"), F.avg("seconds").alias("avg_s"),
             F.percentile_approx("seconds", 0.95).alias("p95_s"))
    )


def attempts(frames: AuditFrames) -> DataFrame:
    """Final messages per route by their attempts over the whole history: the transitions that ended an attempt
    (:func:`openroute.engine.outcome.ends_attempt`), so a restarted message counts the attempts before its restart
    (its failed count starts again)."""
    from pyspark.sql import functions as F

    ended = (F.col("from_state") == MessageState.PROCESSING.value) & (
        F.col("error_code").isNull() | ~F.col("error_code").isin(sorted(NOT_ATTEMPTS)))
    runs = frames.transitions.where(ended).groupBy("message_id").agg(F.count("*").alias("attempts"))
    final = frames.messages.where("is_final").select(F.col("id").alias("message_id"), "service", "operation")
    return (
        final.join(runs, "message_id", "left")
        .groupBy("service", "operation", F.coalesce("attempts", F.lit(0)).alias("attempts"))
        .agg(F.count("*").alias("count"))
    )


def _top_per_route(counts: DataFrame, top: int) -> DataFrame:
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    per_route = Window.partitionBy("service", "operation").orderBy(F.desc("count"), "code")
    return counts.withColumn("rank", F.row_number().over(per_route)).where(F.col("rank") <= top).drop("rank")


def top_errors(frames: AuditFrames) -> DataFrame:
    """The error codes met per route over the whole history (the transitions: a restarted message that ended OK
    still counts the outage it met): ``count`` the changes that carried the code, ``messages`` the messages that
    met it, ``current`` the messages not OK whose current error it is. A funnel's or a newer message's hold is no
    error and not counted."""
    from pyspark.sql import functions as F

    met = frames.transitions.where(F.col("error_code").isNotNull() & ~F.col("error_code").isin(sorted(_NOT_ERRORS)))
    history = met.join(frames.routes(), "message_id").groupBy(
        "service", "operation", F.col("error_code").alias("code")).agg(
        F.count("*").alias("count"), F.countDistinct("message_id").alias("messages"))
    failing = frames.messages.where(F.col("last_error_code").isNotNull() & (F.col("state") != MessageState.OK.value)
                                    & ~F.col("last_error_code").isin(sorted(_NOT_ERRORS)))
    current = failing.groupBy("service", "operation", F.col("last_error_code").alias("code")).agg(
        F.count("*").alias("current"))
    counts = history.join(current, ["service", "operation", "code"], "full").select(
        "service", "operation", "code", *(F.coalesce(name, F.lit(0)).alias(name)
                                          for name in ("count", "messages", "current")))
    return _top_per_route(counts, frames.settings.top)


def business_errors(frames: AuditFrames) -> DataFrame:
    """Statistic: the ``top`` most frequent business error codes per route (from the messages' ``business_errors``)."""
    from pyspark.sql import functions as F

    errors = frames.messages.select(
        "service", "operation",
        F.explode(F.from_json("business_errors", "array<struct<code:string,text:string>>")).alias("error"),
    )
    counts = errors.groupBy("service", "operation", F.col("error.code").alias("code")).agg(F.count("*").alias("count"))
    return _top_per_route(counts, frames.settings.top)


def confirmations(frames: AuditFrames) -> DataFrame:
    """Statistic: confirmations per source system and day of creation: counts by status, mean attempts, and the lag from
    creation to sending (p50, p95, max seconds)."""
    from pyspark.sql import functions as F

    def having(status: ConfirmationStatus) -> Column:
        return F.sum(F.when(F.col("status") == status.value, 1).otherwise(0)).alias(status.value.lower())

    return (
        frames.confirmations.withColumn("day", F.to_date("created_at"))
        .withColumn("lag_s", seconds(F.col("sent_at")) - seconds(F.col("created_at")))
        .groupBy("source_system", "day")
        .agg(F.count("*").alias("count"), having(ConfirmationStatus.SENT),
             having(ConfirmationStatus.PENDING), having(ConfirmationStatus.FAILED),
             F.avg("attempts").alias("avg_attempts"),
             F.percentile_approx("lag_s", 0.5).alias("lag_p50_s"),
             F.percentile_approx("lag_s", 0.95).alias("lag_p95_s"),
             F.max("lag_s").alias("lag_max_s"))
    )


def funnel_postpones(frames: AuditFrames) -> DataFrame:
    """Statistic: changes to POSTPONED per route and day of receipt (``postpones``) and the messages they concern
    (``messages``)."""
    from pyspark.sql import functions as F

    return (
        frames.transitions.where(F.col("to_state") == MessageState.POSTPONED.value).join(frames.routes(), "message_id")
        .groupBy("service", "operation", "day")
        .agg(F.count("*").alias("postpones"), F.countDistinct("message_id").alias("messages"))
    )


#: the statistics, in the report's order (name: the table name in summary.json and the Parquet folder)
STATISTICS: tuple[Step, ...] = (
    Step("state_counts", "messages per route, day of receipt and state", state_counts),
    Step("throughput_hourly", "messages ended per route and hour", throughput_hourly),
    Step("latency", "time from receipt to final state per route and day", latency),
    Step("time_in_state", "time spent in each state per route", time_in_state),
    Step("attempts", "attempts of final messages per route, over their whole history (restarts included)",
         attempts),
    Step("top_errors", "the error codes met most per route, over the whole history", top_errors),
    Step("business_errors", "the most frequent business error codes per route", business_errors),
    Step("confirmations", "confirmations per source system and day", confirmations),
    Step("funnel_postpones", "postpones per route and day", funnel_postpones),
)


# ---- consistency checks (each a frame of message_id) ---------------------------------------------------------


def stuck(frames: AuditFrames) -> DataFrame:
    """Check: messages not final whose last update, and next attempt if any, are older than ``stuck_after``."""
    from pyspark.sql import functions as F

    horizon = frames.ago(frames.settings.stuck_after)
    return frames.messages.where(
        ~F.col("is_final") & (F.col("last_update_ts") < horizon)
        & (F.col("next_attempt_at").isNull() | (F.col("next_attempt_at") < horizon))
    ).select(F.col("id").alias("message_id"))


def dead_node_processing(frames: AuditFrames) -> DataFrame:
    """Check: PROCESSING messages whose node stopped, has been silent longer than ``heartbeat_timeout``, or is
    unknown."""
    from pyspark.sql import functions as F

    alive = frames.nodes.where(
        F.col("stopped_at").isNull() & (F.col("heartbeat_at") >= frames.ago(frames.settings.heartbeat_timeout))
    ).select(F.col("id").alias("node_id"))
    return (
        frames.messages.where(F.col("state") == MessageState.PROCESSING.value)
        .join(alive, "node_id", "left_anti").select(F.col("id").alias("message_id"))
    )


def confirmation_missing(frames: AuditFrames) -> DataFrame:
    """Check: top-level messages final (CANCEL, FAILED, OK) for longer than ``grace`` in a confirmed source system,
    without any confirmation row.

    The confirmed systems are ``confirmed_systems``, or, when it is None, those that have confirmation rows.
    """
    from pyspark.sql import functions as F

    given = frames.settings.confirmed_systems
    if given is None:
        systems = frames.confirmations.select("source_system").distinct()
    else:
        systems = frames.spark.createDataFrame([(s,) for s in given], "source_system string")
    owed = (
        frames.messages.where(F.col("state").isin(list(CONFIRMED)) & F.col("parent_id").isNull()
                              & (F.col("last_update_ts") < frames.ago(frames.settings.grace)))
        .join(F.broadcast(systems), "source_system", "left_semi")
    )
    return (
        owed.join(frames.confirmations.select(F.col("message_id").alias("id")), "id", "left_anti")
        .select(F.col("id").alias("message_id"))
    )


def confirmation_overdue(frames: AuditFrames) -> DataFrame:
    """Check: PENDING confirmations that used ``confirmation_max_attempts`` or were due longer than ``stuck_after``
    ago."""
    from pyspark.sql import functions as F

    settings = frames.settings
    return frames.confirmations.where(
        (F.col("status") == "PENDING")
        & ((F.col("attempts") >= settings.confirmation_max_attempts)
           | (F.col("next_attempt_at") < frames.ago(settings.stuck_after)))
    ).select("message_id")


def _children(frames: AuditFrames) -> DataFrame:
    """Child messages with their parent's finality, state and last update."""
    from pyspark.sql import functions as F

    parents = frames.messages.select(F.col("id").alias("parent_id"), F.col("is_final").alias("parent_final"),
                                     F.col("state").alias("parent_state"),
                                     F.col("last_update_ts").alias("parent_ts"))
    return frames.messages.where(F.col("parent_id").isNotNull()).join(parents, "parent_id")


def parent_final_child_open(frames: AuditFrames) -> DataFrame:
    """Check: children not final under a final parent (the id is the child's)."""
    from pyspark.sql import functions as F

    return _children(frames).where(F.col("parent_final") & ~F.col("is_final")).select(
        F.col("id").alias("message_id"))


def children_final_parent_waiting(frames: AuditFrames) -> DataFrame:
    """Check: parents WAITING_FOR_CHILDREN whose children are all final, the last one for longer than ``grace`` (the id
    is the parent's)."""
    from pyspark.sql import functions as F

    return (
        _children(frames).where(F.col("parent_state") == MessageState.WAITING_FOR_CHILDREN.value)
        .groupBy("parent_id")
        .agg(F.min(F.col("is_final").cast("int")).alias("all_final"), F.max("last_update_ts").alias("last_child"))
        .where((F.col("all_final") == 1) & (F.col("last_child") < frames.ago(frames.settings.grace)))
        .select(F.col("parent_id").alias("message_id"))
    )


def duplicate_ok_call(frames: AuditFrames) -> DataFrame:
    """Check: messages owning an external call recorded OK more than once: per (entity type, object id, call key) in
    ``entity_call``, per (message, call key) in ``external_call``."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    entity_dups = (
        frames.read("entity_call").where(F.col("status") == ExternalCallStatus.OK.value)
        .withColumn("n", F.count("*").over(Window.partitionBy("entity_type", "object_id", "call_key")))
        .where(F.col("n") > 1).select(F.col("owner_message_id").alias("message_id"))
    )
    message_dups = (
        frames.read("external_call").where(F.col("status") == ExternalCallStatus.OK.value)
        .withColumn("n", F.count("*").over(Window.partitionBy("message_id", "call_key")))
        .where(F.col("n") > 1).select("message_id")
    )
    return entity_dups.unionByName(message_dups).where(F.col("message_id").isNotNull())


def history_mismatch(frames: AuditFrames) -> DataFrame:
    """Check: messages whose transitions do not chain (a row's from-state is not the previous row's to-state) or do not
    end in the message's state.

    A message without transitions counts only when it was received after the first transition of the store: older
    messages had no history kept.
    """
    from pyspark.sql import functions as F

    steps = frames.steps()
    broken = steps.where(
        F.col("prev_to").isNotNull() & ~F.col("from_state").eqNullSafe(F.col("prev_to"))
    ).select("message_id")
    last = steps.where(F.col("rank_desc") == 1).select("message_id", F.col("to_state").alias("last_to"))
    messages = frames.messages
    wrong_end = (
        messages.join(last, messages.id == last.message_id, "left")
        .where(F.col("last_to").isNull() | (F.col("last_to") != F.col("state")))
    )
    # messages received before the store kept transitions have no history to check
    started = frames.transitions.agg(F.min("at").alias("started"))
    wrong_end = wrong_end.crossJoin(started).where(
        F.col("last_to").isNotNull() | (F.col("started").isNotNull() & (F.col("receive_ts") >= F.col("started")))
    )
    return broken.unionByName(wrong_end.select(F.col("id").alias("message_id")))


#: the consistency checks, in the report's order (name: the key in the report and summary.json)
CONSISTENCY_CHECKS: tuple[Step, ...] = (
    Step("stuck", "non-final messages that have not moved and are not scheduled for longer than stuck_after", stuck),
    Step("dead_node_processing",
         "PROCESSING messages owned by a node whose heartbeat stopped (or that is unknown)", dead_node_processing),
    Step("confirmation_missing",
         "final top-level messages of a confirmed source system without any confirmation row", confirmation_missing),
    Step("confirmation_overdue", "confirmations still PENDING after their retries or long past their due time",
         confirmation_overdue),
    Step("parent_final_child_open", "final parent messages with a child that is not final (id: the child)",
         parent_final_child_open),
    Step("children_final_parent_waiting",
         "parents WAITING_FOR_CHILDREN whose children are all final (id: the parent)", children_final_parent_waiting),
    Step("duplicate_ok_call", "an external call recorded OK more than once for one (entity, key) or (message, key)",
         duplicate_ok_call),
    Step("history_mismatch",
         "messages whose transition history does not lead to their state (or is missing, broken)", history_mismatch),
)
