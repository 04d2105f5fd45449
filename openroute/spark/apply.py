"""Applying a reprocessing plan: the planned restarts and skips written to the store through the engine's rules.

The plan (written by :func:`openroute.spark.reprocess.write_plan`) streams from its Parquet files partition by
partition; each batch is one transaction that decides every row's next state with
:mod:`openroute.engine.outcome` (as ``Engine.restart`` and the admin API do) and writes the whole batch set-based
through :func:`openroute.engine.states.transition_set`: the rows staged in a temporary table (``COPY`` on PostgreSQL),
then one UPDATE of the messages still at their planned version and one INSERT of their ``message_transition`` rows.
A message changed since the plan is not overwritten: it is counted and listed (``ApplyResult.moved``).
Those rows carry the cause ``reprocess:<job id>``: the job's applied marker, so applying again or resuming after
a kill changes each planned message exactly once::

    from openroute.spark.apply import apply_plan

    applied = apply_plan(build_session(), "sqlite:///openroute.db", "reprocess-rp-...", rate="200/s")
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa

from openroute.definitions.errors import StaleMessageError
from openroute.engine import outcome as outcomes
from openroute.engine import states as lifecycle
from openroute.persistence import GroupConflict, MessageState, MessageStore, StoredMessage
from openroute.persistence.models import message_table, message_transition_table
from openroute.spark._pause import pause_point

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

S = MessageState

#: messages per transaction of an apply: 500, 2,000 and 10,000 took the same time on 50,000 restarts (the database's
#: per-row work dominates, docs/spark.md "The batch size"), and the smallest holds its row locks the shortest
BATCH_SIZE = 500

#: the plan's decisions: restart (FAILED/CANCEL -> PARTLY_FAILED), skip as obsolete (-> SKIPPED), leave alone
RESTART = "RESTART"
SKIP_OBSOLETE = "SKIP_OBSOLETE"
LEAVE = "LEAVE"


def job_cause(job_id: str) -> str:
    """The cause of the ``message_transition`` rows a job writes: its applied marker."""
    return f"reprocess:{job_id}"


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
class ApplyResult:
    """What applying a plan did: counts, and the ids left alone because they changed since the plan (two results
    add up: the sum of two batches)."""

    restarted: int = 0
    skipped: int = 0
    #: planned messages this job had already changed (an earlier or interrupted apply)
    already_applied: int = 0
    #: planned messages whose version moved since the plan (someone else changed them): left alone
    moved: list[int] = field(default_factory=list)
    #: planned messages no longer in the store (archived or deleted)
    missing: list[int] = field(default_factory=list)
    batches: int = 0

    def __add__(self, other: ApplyResult) -> ApplyResult:
        return ApplyResult(self.restarted + other.restarted, self.skipped + other.skipped,
                           self.already_applied + other.already_applied, self.moved + other.moved,
                           self.missing + other.missing, self.batches + other.batches)


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


@dataclass(frozen=True)
class _Entity:
    """A planned row's entity, as :func:`openroute.engine.outcome.obsolete` reads it (pinned by the row's version)."""

    entity_type: str | None
    object_id: str | None


def _decided(row: Any, now: datetime) -> tuple[MessageState, dict[str, Any]]:
    """The next state and columns of a planned row, by the engine's own rules (engine/outcome.py), as the admin
    API, the CLI and the engine apply them: RESTART is Engine.restart's decision; SKIP_OBSOLETE is where the engine
    takes a restarted message once its obsolete check finds the newer OK one (restart's columns, then the obsolete
    decision)."""
    restart = outcomes.restarted(now)
    if row["decision"] == RESTART:
        return restart.target, dict(restart.changes)
    skip = outcomes.obsolete(_Entity(row["entity_type"], row["object_id"]))
    return skip.target, {**restart.changes, **skip.changes}


def _unwritten(connection: sa.Connection, ids: list[int], cause: str) -> ApplyResult:
    """The planned ids nothing was written for, sorted: this job's already, gone from the store, or moved."""
    if not ids:
        return ApplyResult()
    t = message_transition_table.c
    done = set(connection.execute(sa.select(t.message_id).where(t.cause == cause, t.message_id.in_(ids))).scalars())
    present = set(connection.execute(sa.select(message_table.c.id).where(message_table.c.id.in_(ids))).scalars())
    return ApplyResult(already_applied=sum(1 for i in ids if i in done),
                       moved=[i for i in ids if i not in done and i in present],
                       missing=[i for i in ids if i not in done and i not in present])


def _apply_set(store: MessageStore, batch: list[Any], job_id: str, now: datetime) -> ApplyResult:
    """One transaction, set-based: the batch's planned changes staged and written by one UPDATE and one INSERT
    (:func:`openroute.engine.states.transition_set`), each row still at its planned version; the rest sorted after."""
    cause = job_cause(job_id)
    requests: list[lifecycle.StagedRequest] = []
    for row in batch:
        target, changes = _decided(row, now)
        requests.append((int(row["id"]), int(row["version"]), MessageState(row["state"]), target, now, changes,
                         cause))
    with store.begin() as connection:
        results = lifecycle.transition_set(store, requests, connection, node_id="spark")
        written = [request[3] for request, result in zip(requests, results, strict=True) if result is True]
        # an illegal transition means the plan's state is not the row's: moved, like a stale one
        unwritten = [request[0] for request, result in zip(requests, results, strict=True) if result is not True]
        tally = ApplyResult(sum(1 for s in written if s is not S.SKIPPED), sum(1 for s in written if s is S.SKIPPED),
                            batches=1) + _unwritten(connection, unwritten, cause)
        # written, not committed: a test kills the job here (kill -9) to see the database roll the batch back
        pause_point("batch-written")
    return tally


def _apply_rows(store: MessageStore, batch: list[Any], job_id: str, now: datetime,
                one_by_one: bool) -> ApplyResult:
    """One transaction, row by row (the engine's per-message path, :func:`openroute.engine.states.transition_many`): the
    current rows read, each change version-checked; the reference the set-based path is tested against."""
    cause = job_cause(job_id)
    ids = [int(r["id"]) for r in batch]
    restarted = skipped = 0
    with store.begin() as connection:
        current = {m.id: m for m in store.find(message_table.c.id.in_(ids), connection=connection)}
        requests: list[lifecycle.TransitionRequest] = []
        unwritten = []
        for row in batch:
            message: StoredMessage | None = current.get(int(row["id"]))
            if message is None or message.version != int(row["version"]):
                unwritten.append(int(row["id"]))
            else:
                target, changes = _decided(row, now)
                requests.append((message, target, now, changes, cause))
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
                unwritten.append(request[0].id)
            elif result.state is S.SKIPPED:
                skipped += 1
            else:
                restarted += 1
        tally = ApplyResult(restarted, skipped, batches=1) + _unwritten(connection, sorted(unwritten), cause)
        pause_point("batch-written")
    return tally


def _log_batch(job_id: str, batch: int, restarted: int, skipped: int) -> None:
    """One line per applied batch (who: the job, the OS user and host); each message's transition row has the
    cause ``reprocess:<job id>``, and a server's log shows its next state change when its repoll takes it."""
    import getpass
    import socket

    from openroute.runtime.logs import actions_log, ensure_action_log

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
    batch_size: int = BATCH_SIZE,
    progress: Callable[[ApplyResult], None] | None = None,
    now: Callable[[], datetime] = lambda: datetime.now(UTC),
    set_based: bool = True,
) -> ApplyResult:
    """Apply the plan written under ``out`` (RESTART and SKIP_OBSOLETE rows) to the store at ``url``.

    Rows stream from the Parquet plan partition by partition (never the whole plan on the driver), in batches
    of ``batch_size``, one transaction each; ``rate`` (messages per second, or ``"50/m"``) paces the releases.
    A message this job changed already is counted, not changed again; one whose version moved since the
    plan is left alone and listed. Each batch is written set-based (staged, then one UPDATE and one INSERT);
    ``set_based=False`` writes it row by row through the engine's per-message path instead (the reference the tests
    compare with). Raises ``ValueError`` for a folder without a plan or a bad rate.
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
        .select("id", "version", "state", "entity_type", "object_id", "decision")
        .orderBy("id")
    )
    store = MessageStore(url, pool_size=1)
    pacer = _Pacer(per_second)
    total = ApplyResult()
    try:
        for batch in _batches(plan.toLocalIterator(), batch_size):
            if set_based:
                tally = _apply_set(store, batch, job_id, now())
            else:
                try:
                    tally = _apply_rows(store, batch, job_id, now(), one_by_one=False)
                except GroupConflict:  # some item lost inside a grouped statement: redo the batch item by item
                    tally = _apply_rows(store, batch, job_id, now(), one_by_one=True)
            total += tally
            if tally.restarted or tally.skipped:
                _log_batch(job_id, total.batches, tally.restarted, tally.skipped)
            pacer.released_now(tally.restarted + tally.skipped)
            if progress is not None:
                progress(total)
    finally:
        store.dispose()
    return total


