"""Applying a reprocessing plan: the planned restarts and skips written to the store through the engine's rules.

The plan (written by :func:`openroute.spark.reprocess.write_plan`) streams from its Parquet files partition by
partition; each batch is one transaction that decides every row's next state with
:mod:`openroute.engine.outcome` (as ``Engine.restart`` and the admin API do) and writes the whole batch through
:func:`openroute.states.transition_many`: one grouped UPDATE per set of changed columns and one INSERT of the
``message_transition`` rows, version-checked.
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

from openroute import states as lifecycle
from openroute.engine import outcome as outcomes
from openroute.errors import StaleMessageError
from openroute.persistence import GroupConflict, MessageState, MessageStore, StoredMessage
from openroute.persistence.models import message_table, message_transition_table
from openroute.spark._pause import pause_point

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

S = MessageState

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
    cause = job_cause(job_id)
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


