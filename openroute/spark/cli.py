"""``openroute spark ...``: the bulk jobs from the command line (reprocess, archive; audit by its own module).

For example::

    openroute spark reprocess --service crm --since 7d                 # dry run: plan + summary
    openroute spark reprocess --plan reprocess-rp-... --apply --rate 200/s
    openroute spark archive --keep OK=30d,FAILED=180d --to /data/openroute-archive
    openroute spark audit --out audit-report --stuck-after 2h                # exit 1 when a check fails
    openroute spark connect start                                      # a warm server on sc://127.0.0.1:15002
    openroute spark audit --remote sc://127.0.0.1:15002                # a job on it: no JVM start-up

Exit status: 0 done, 2 a usage or setup problem (no Java, no JDBC driver, database unreachable, bad option),
printed as one line on stderr; Spark's own log and any Java stack trace go to a file, never to the terminal.
When stderr is a terminal, one line there shows the Spark stages done / total while the job runs
(``spark stages 7/9 (job 6 running)``), erased before the results are printed.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

from openroute.persistence.secrets import mask_secrets
from openroute.spark.guidance import suggestion
from openroute.spark.outputs import OutputKind, pruned_line


def _common() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    group = common.add_argument_group("Spark and the store")
    group.add_argument("--database-url", default=None,
                       help="SQLAlchemy URL of the store (default: $OPENROUTE_DATABASE_URL, else the --config file's "
                            "database_url, else sqlite:///openroute.db)")
    group.add_argument("--config", default=None, metavar="FILE",
                       help="the server's TOML configuration (its database_url), under --database-url and "
                            "$OPENROUTE_DATABASE_URL")
    group.add_argument("--master", default=None, help="Spark master (default local[*]; spark://..., k8s://..., yarn)")
    group.add_argument("--remote", default=None, metavar="sc://HOST:PORT",
                       help="run on a Spark Connect server (openroute spark connect start) instead of a JVM here")
    group.add_argument("--partitions", type=int, default=4, help="parallel JDBC reads per table (default 4)")
    group.add_argument("--jdbc-path", default=None, help="a JDBC driver jar or folder (default /usr/share/java)")
    group.add_argument("--retention", default=None, metavar="AGE",
                       help="delete plan / audit folders beside --out older than this, e.g. 30d (default: "
                            "$OPENROUTE_SPARK_RETENTION, else keep all)")
    group.add_argument("--spark-log", default=None,
                       help="file for Spark's own log and the JVM's stderr (default: a file in the temp folder)")
    return common


def add_parser(subparsers: Any) -> None:
    """Register ``openroute spark`` and its subcommands on the ``openroute`` parser's subcommands."""
    spark = subparsers.add_parser("spark", help="bulk jobs on the store with PySpark: reprocess, archive, audit")
    jobs = spark.add_subparsers(dest="spark_command", required=True)
    common = _common()

    rp = jobs.add_parser("reprocess", parents=[common], help="plan (dry run) and apply a bulk restart",
                         description="Plan restarting stored messages; --apply applies the plan.")
    pick = rp.add_argument_group("which messages")
    pick.add_argument("--state", action="append", dest="states", default=None,
                      help="state to select, repeatable (default FAILED)")
    pick.add_argument("--service")
    pick.add_argument("--operation")
    pick.add_argument("--source-system")
    pick.add_argument("--since", help="received at or after: ISO-8601 or an age like 7d, 12h")
    pick.add_argument("--until", help="received before: ISO-8601 or an age")
    pick.add_argument("--error-code", help="last error code")
    pick.add_argument("--business-error-code", help="a business error code of the message")
    pick.add_argument("--error-text", help="text in the last error (case-insensitive)")
    pick.add_argument("--ids-file", help="file of message ids, one a line")
    pick.add_argument("--object-ids-file", help="file of object ids, one a line")
    job = rp.add_argument_group("the job")
    job.add_argument("--out", default=None, help="plan folder (default reprocess-<job id>)")
    job.add_argument("--job-id", default=None, help="job id (give an earlier one to re-plan and resume it)")
    job.add_argument("--plan", default=None, help="apply this existing plan folder instead of planning again")
    job.add_argument("--csv", action="store_true", help="also write the plan as CSV")
    job.add_argument("--apply", action="store_true", help="apply the plan (default: dry run, nothing changes)")
    job.add_argument("--rate", default=None, help="release at most this many messages: 200/s, 50/m, 1000/h")
    from openroute.spark.apply import BATCH_SIZE

    job.add_argument("--batch-size", type=int, default=BATCH_SIZE,
                     help=f"messages per transaction (default {BATCH_SIZE})")

    ar = jobs.add_parser("archive", parents=[common], help="move old final messages to Parquet",
                         description="Copy final messages older than their keep time to Parquet, verify, delete.")
    ar.add_argument("--keep", required=True, help="keep time per final state: OK=30d,FAILED=180d,...")
    ar.add_argument("--to", required=True, dest="to", help="archive folder (local path or a Spark URL)")
    ar.add_argument("--batch-size", type=int, default=1000, help="messages deleted per transaction (default 1000)")

    from openroute.spark.audit import add_audit_parser

    add_audit_parser(jobs, parents=[common])

    server = jobs.add_parser("connect", help="start, stop or show a Spark Connect server for warm jobs",
                             description="A long-lived Spark Connect server (JDBC drivers on its class path): jobs "
                                         "given --remote sc://HOST:PORT run on it and start in about a second.",
                             epilog="examples:\n  openroute spark connect start --port 15002\n"
                                    "  openroute spark audit --remote sc://127.0.0.1:15002\n"
                                    "  openroute spark connect stop",
                             formatter_class=argparse.RawDescriptionHelpFormatter)
    server.add_argument("action", choices=("start", "stop", "status"))
    server.add_argument("--port", type=int, default=None, help="the server's port (default 15002)")
    server.add_argument("--master", default=None, help="the server's Spark master (default local[*])")
    server.add_argument("--wait", type=float, default=120.0, metavar="SECONDS",
                        help="how long start waits for the server to listen (default 120; a loaded machine needs more)")


def _url(args: argparse.Namespace) -> str:
    """The store's URL, resolved by the command line before the job runs (:mod:`openroute.cli`, as for every
    command: ``--database-url`` over ``OPENROUTE_DATABASE_URL`` over the ``--config`` file over the default)."""
    return str(args.database_url)


class _Progress:
    """The Spark stages done / total of this command on one line of stderr, redrawn while it runs (a terminal only).

    The line counts every stage of the jobs this command started (a finished job's skipped stages count as done)
    and names the jobs running, for example ``spark stages 7/9 (job 6 running); batch 2: restarted 4, skipped
    0``, the part after ``;`` being :meth:`note`. It is erased before anything else is printed: while the
    progress is on, ``sys.stdout`` goes through :class:`_ErasingWriter`, and the line is not drawn while a
    printed line is still unfinished. Disabled (``enabled=False``), it writes nothing and changes nothing.
    """

    #: seconds between two looks at Spark's status tracker
    interval = 0.5

    def __init__(self, spark: Any, enabled: bool, stream: TextIO | None = None) -> None:
        self.spark, self.enabled = spark, enabled
        self.stream = stream if stream is not None else sys.stderr
        self.lock = threading.RLock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="openroute-spark-progress", daemon=True)
        self._shown = False  # the line is on the terminal
        self._midline = False  # stdout printed part of a line: drawing now would erase it
        self._stages = ""
        self._note = ""
        self._drawn = ""
        self._earlier: set[int] = set()  # jobs of a caller's session that ran before this command
        self._finished: dict[int, list[int]] = {}  # stage ids of this command's finished jobs
        self._stdout: Any = None

    def __enter__(self) -> _Progress:
        if self.enabled:
            tracker = self.spark.sparkContext.statusTracker()
            self._earlier = set(tracker.getJobIdsForGroup())
            self._stdout = sys.stdout
            sys.stdout = _ErasingWriter(sys.stdout, self)
            self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        if self.enabled:
            self._stop.set()
            self._thread.join()
            sys.stdout = self._stdout
            self.erase()

    def note(self, text: str) -> None:
        """Show ``text`` after the stages (what the job did so far, e.g. the apply's batches)."""
        self._note = text
        self._draw()

    def erase(self) -> None:
        """Take the line off the terminal (it comes back at the next redraw)."""
        with self.lock:
            if self._shown:
                self.stream.write("\r\033[K")
                self.stream.flush()
                self._shown = False

    def printed(self, text: str) -> None:
        """Something else went to the terminal: the line was erased before, and waits for the end of that line."""
        self._midline = not text.endswith("\n")

    def _draw(self) -> None:
        line = "; ".join(part for part in (self._stages, self._note) if part)
        with self.lock:
            if not self.enabled or self._midline or not line or (self._shown and line == self._drawn):
                return
            self.stream.write("\r\033[K" + line)
            self.stream.flush()
            self._shown, self._drawn = True, line

    def stages(self) -> tuple[int, int, list[int]]:
        """(stages done, stages known, running job ids) of the jobs this command started."""
        tracker = self.spark.sparkContext.statusTracker()
        done: set[int] = set()
        known: set[int] = set()
        running: list[int] = []
        for job_id in sorted(set(tracker.getJobIdsForGroup()) - self._earlier):
            stage_ids = self._finished.get(job_id)
            if stage_ids is None:
                job = tracker.getJobInfo(job_id)
                if job is None:
                    continue
                stage_ids = list(job.stageIds)
                if job.status == "RUNNING" or job.status == "UNKNOWN":
                    running.append(job_id)
                    known.update(stage_ids)
                    done.update(s for s in stage_ids if (info := tracker.getStageInfo(s)) is not None
                                and info.numTasks > 0 and info.numCompletedTasks == info.numTasks)
                    continue
                self._finished[job_id] = stage_ids
            known.update(stage_ids)
            done.update(stage_ids)
        return len(done), len(known), running

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            done, known, running = self.stages()
            if known:
                jobs = ", ".join(str(j) for j in running)
                self._stages = f"spark stages {done}/{known}" + (
                    f" (job{'s' if len(running) > 1 else ''} {jobs} running)" if running else "")
            self._draw()


class _ErasingWriter:
    """``sys.stdout`` while the progress line is on: each write erases the line first, under its lock."""

    def __init__(self, target: TextIO, progress: _Progress) -> None:
        self.target, self.progress = target, progress

    def write(self, text: str) -> int:
        with self.progress.lock:
            self.progress.erase()
            written = self.target.write(text)
            self.target.flush()  # on the terminal before the progress line comes back
            self.progress.printed(text)
        return written

    def flush(self) -> None:
        self.target.flush()

    def isatty(self) -> bool:
        return self.target.isatty()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.target, name)


def _table(rows: list[tuple[str, str, int]], headers: tuple[str, str, str]) -> str:
    widths = [max(len(str(r[i])) for r in [headers, *rows]) for i in range(3)]
    lines = [f"{headers[0]:<{widths[0]}}  {headers[1]:<{widths[1]}}  {headers[2]:>{widths[2]}}"]
    lines += [f"{a:<{widths[0]}}  {b:<{widths[1]}}  {c:>{widths[2]}}" for a, b, c in rows]
    return "\n".join(lines)


def _run_reprocess(spark: Any, args: argparse.Namespace, progress: _Progress) -> int:
    from openroute.spark.apply import apply_plan, read_job
    from openroute.spark.reprocess import reprocess

    url = _url(args)
    if args.plan is not None:
        if not args.apply:
            print(f"openroute spark reprocess: --plan {args.plan} applies a plan: add --apply", file=sys.stderr)
            return 2
        meta = read_job(args.plan)
        print(f"job {meta['job_id']}: applying the plan in {args.plan}")
        applied = apply_plan(spark, url, args.plan, rate=args.rate, batch_size=args.batch_size,
                             progress=_apply_progress(progress))
        _print_applied(applied, args.plan)
        return 0
    result = reprocess(
        spark, url, states=args.states or ["FAILED"], service=args.service, operation=args.operation,
        source_system=args.source_system, since=args.since, until=args.until, error_code=args.error_code,
        business_error_code=args.business_error_code, error_text=args.error_text, ids_file=args.ids_file,
        object_ids_file=args.object_ids_file, out=args.out, job_id=args.job_id, apply=args.apply,
        rate=args.rate, batch_size=args.batch_size, partitions=args.partitions, csv=args.csv,
        jdbc_path=args.jdbc_path, progress=_apply_progress(progress) if args.apply else None,
        retention=args.retention,
    )
    folder = result.plan_path.parent
    print(f"job {result.job_id}: plan in {result.plan_path}")
    print(_table(result.summary, ("route", "decision", "messages")) if result.summary else "no candidates")
    for line in (pruned_line(result.pruned, OutputKind.PLAN), suggestion(sum(result.counts().values()))):
        if line:
            print(line)
    if result.applied is None:
        print(f"dry run: nothing changed. Apply it with: openroute spark reprocess --plan {folder} --apply")
    else:
        _print_applied(result.applied, folder)
    return 0


def _apply_progress(progress: _Progress) -> Callable[[Any], None] | None:
    if not progress.enabled:
        return None

    def show(applied: Any) -> None:
        progress.note(f"batch {applied.batches}: restarted {applied.restarted}, skipped {applied.skipped}")

    return show


def _print_applied(applied: Any, folder: str | Path) -> None:
    print(f"applied: restarted {applied.restarted}, skipped as obsolete {applied.skipped}, "
          f"already done by this job {applied.already_applied}, changed since the plan {len(applied.moved)}, "
          f"no longer stored {len(applied.missing)} ({applied.batches} batches)")
    if applied.moved or applied.missing:
        report = Path(folder) / "left-alone.json"
        import json

        report.write_text(json.dumps({"moved": applied.moved, "missing": applied.missing}) + "\n")
        shown = ", ".join(str(i) for i in applied.moved[:20])
        print(f"left alone (changed since the plan): {shown}{' ...' if len(applied.moved) > 20 else ''}; "
              f"all ids in {report}")


def _run_archive(spark: Any, args: argparse.Namespace, _progress: _Progress) -> int:
    from openroute.spark.archive import archive

    result = archive(spark, _url(args), keep=args.keep, to=args.to, batch_size=args.batch_size,
                     partitions=args.partitions, jdbc_path=args.jdbc_path)
    print(f"archived {result.messages} messages ({result.transitions} transitions, {result.external_calls} "
          f"external calls, {result.confirmations} confirmations) to {result.path}; verified by reading back; "
          f"deleted {result.deleted} from the store")
    return 0


def run(args: argparse.Namespace) -> int:
    """Run ``openroute spark <job>``; returns the exit status (2 for a setup or usage problem)."""
    from openroute.spark.session import SparkSetupError, build_session

    name = f"openroute spark {args.spark_command}"
    if args.spark_command == "connect":
        return _run_connect(args, name)
    if args.database_url is None:  # the command line resolves it before the job runs (openroute.cli)
        print(f"{name}: the store's URL is not resolved: run openroute spark (openroute.cli.main)", file=sys.stderr)
        return 2
    jvm_log = args.spark_log or str(Path(tempfile.gettempdir()) / f"openroute-spark-{os.getpid()}.log")
    if args.partitions < 1:
        print(f"{name}: --partitions must be >= 1, got {args.partitions}", file=sys.stderr)
        return 2
    from openroute.runtime.logs import ensure_action_log

    # the job's action lines (each reprocess batch, by whom) go to the log file: stderr is for errors only
    ensure_action_log(open(jvm_log, "a", encoding="utf-8"))  # noqa: SIM115  open for the life of the command
    try:
        from pyspark.sql import SparkSession

        owned = SparkSession.getActiveSession() is None  # a session the caller started stays running
        started = time.monotonic()
        spark = build_session(args.master, app_name=name, jdbc_path=args.jdbc_path, jvm_log=jvm_log,
                              remote=args.remote)
        where = args.remote or args.master or "local[*]"
        print(f"spark session ready in {time.monotonic() - started:.1f} s on {where}")
    except ImportError:
        print(f"{name}: PySpark is not installed: pip install 'openroute[spark]'", file=sys.stderr)
        return 2
    except SparkSetupError as problem:
        print(f"{name}: {mask_secrets(str(problem))}", file=sys.stderr)
        return 2
    from openroute.spark.audit import run_audit_job

    jobs: dict[str, Callable[[Any, argparse.Namespace, _Progress], int]] = {
        "reprocess": _run_reprocess, "archive": _run_archive,
        "audit": lambda spark, args, _progress: run_audit_job(spark, args),
    }
    progress = _Progress(spark, sys.stderr.isatty() and args.remote is None)  # a Connect client has no tracker
    try:
        with progress:
            return jobs[args.spark_command](spark, args, progress)
    except (SparkSetupError, ValueError) as problem:
        print(f"{name}: {mask_secrets(str(problem))}", file=sys.stderr)
        return 2
    except Exception as error:  # a Java error mid-job: one line here, the stack trace in the Spark log
        from openroute.spark.session import first_line

        print(f"{name}: failed: {first_line(error)} (details in {jvm_log})", file=sys.stderr)
        return 1
    finally:
        if owned:
            spark.stop()


def _run_connect(args: argparse.Namespace, name: str) -> int:
    """``openroute spark connect start|stop|status``: one line on stdout; 2 with one line on stderr on failure."""
    from openroute.spark.connect import DEFAULT_PORT, ConnectServer
    from openroute.spark.session import SparkSetupError

    server = ConnectServer(args.port or DEFAULT_PORT)
    try:
        if args.action == "start":
            started = time.monotonic()
            pid = server.start(args.master or "local[*]", wait=args.wait)
            took = time.monotonic() - started
            print(f"Spark Connect server running (pid {pid}) on {server.remote} after {took:.1f} s; "
                  f"use --remote {server.remote}")
        elif args.action == "stop":
            print(f"stopped the server on {server.remote}" if server.stop() else f"no server ran on {server.remote}")
        else:
            print(server.status())
    except SparkSetupError as problem:
        print(f"{name}: {mask_secrets(str(problem))}", file=sys.stderr)
        return 2
    return 0
