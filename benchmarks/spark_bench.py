r"""Spark jobs against plain SQL, as a user runs each: audit, reprocess plan, apply and archive, cold and warm.

    flock /work/bench.lock python benchmarks/spark_bench.py --sizes 100000,1000000,10000000 --repeat 3

Every measurement is one command in a fresh process, timed from its start to its exit (wall time):

* **Spark cold**: ``openroute spark <job> --master local[*]`` (a JVM and a session started by the command);
* **Spark warm**: ``openroute spark <job> --remote sc://127.0.0.1:<port>`` against a Spark Connect server this
  benchmark starts once (``openroute spark connect start``; its own start is not counted);
* **SQL**: ``psql -f`` of a script doing the same work with the same output: the audit's statistics and checks
  copied to CSV files (``\copy``), the plan's decisions copied to a CSV file, the apply as one staged UPDATE and
  INSERT of the transitions from that file, the archive as a ``\copy`` of the old messages and their rows followed
  by their DELETE, in one transaction.

The jobs: ``audit`` (the whole store), ``plan`` (``reprocess`` dry run of the FAILED messages, 5 %), ``apply``
(that plan applied: restart or skip as obsolete), ``archive`` (final messages older than 3 days: about 64 %).
``apply`` and ``archive`` change the store: each archive run gets its own copy of the size's database (``CREATE
DATABASE ... TEMPLATE``, not timed); the apply runs share one copy per size, put back as generated after each run
(its FAILED messages restored from a table saved at the copy, the job's transition rows deleted, ``VACUUM ANALYZE``;
not timed, and quicker than copying the whole store). Each apply reads the plan its own kind wrote (Parquet / CSV)
in an earlier, untimed run.

The cold kind runs on the empty store only (``--cold-sizes 0``, the default): a cold command is the warm one plus
the JVM and session start, which the empty store measures; ``--cold-sizes all`` (or a list) times it at other sizes
too.

Each size has a PostgreSQL database ``openroute_spark_bench_<size>`` generated once with set-based SQL (``INSERT ...
SELECT FROM generate_series``, as ``benchmarks/store_fill.py`` does, plus three transitions per message,
confirmations, external and entity calls, a node: an aged store whose receive times span the 7 to 1 days before
its generation; the secondary indexes built after the rows) and reused; the store of size 0 (empty) measures the
fixed cost of each kind of command: its start-up, reported apart. Runs are interleaved (each repeat goes through
every size, job and kind, the kinds in a rotating order).

It prints per job, size and kind the wall time min / median / max, the session start of the Spark commands (their
``spark session ready in`` line), the ratio Spark / SQL, the growth from one size to the next, and the crossover:
where the straight line through each kind's medians (fixed cost + cost per message, least squares) meets SQL's. The
figures also go to ``--json``. With ``--sizes 100000`` alone there is no line to fit: give two sizes or more.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import sqlalchemy as sa

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

ADMIN_URL = os.environ.get("OPENROUTE_BENCH_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
JOBS = ("audit", "plan", "apply", "archive")
KINDS = ("cold", "warm", "sql")
#: the share of FAILED messages in a generated store (``g % 100`` in 90..94): what a reprocessing job selects
FAILED_SHARE = 0.05
#: the plan's job id (the apply's transition rows carry ``reprocess:<it>``)
JOB_ID = "bench"

GENERATE = [
    """INSERT INTO node (id, host, pid, started_at, heartbeat_at, stopped_at)
       VALUES ('bench-node', 'bench', 1, now() - interval '8 days', now(), NULL)""",
    # 90% OK, 5% FAILED, 1% SKIPPED, 2% PARTLY_FAILED (due later), 1% POSTPONED, 1% PROCESSING
    """INSERT INTO message (id, correlation_id, source_system, process_id, service, operation, object_id,
           entity_type, funnel_value, payload, content_type, headers, state, failed_count, receive_ts, msg_ts,
           start_process_ts, last_update_ts, next_attempt_at, node_id, custom_data, business_errors,
           last_error_code, last_error_text, parent_id, version)
       SELECT g, 'c' || g, 'src' || (g % 3), NULL, 'svc' || (g % 5), 'op' || (g % 4), 'o' || (g % 50000),
           'customer', NULL, '{}', 'application/json', '{}'::jsonb, s.state,
           CASE WHEN s.state IN ('FAILED', 'PARTLY_FAILED') THEN 1 + g % 3 ELSE g % 2 END,
           r.ts, r.ts, r.ts, r.ts + ((g % 30) + 1) * interval '1 second',
           CASE WHEN s.state IN ('PARTLY_FAILED', 'POSTPONED') THEN now() + interval '1 hour' END,
           'bench-node', '{}'::jsonb,
           CASE WHEN s.state = 'FAILED' THEN ('[{"code": "B' || (g % 7) || '", "text": "refused"}]')::jsonb
                ELSE '[]'::jsonb END,
           CASE WHEN s.state IN ('FAILED', 'PARTLY_FAILED') THEN 'E' || (g % 11) END,
           CASE WHEN s.state IN ('FAILED', 'PARTLY_FAILED') THEN 'failed' END, NULL, 3
       FROM generate_series(1, :n) AS g
       CROSS JOIN LATERAL (SELECT CASE WHEN g % 100 < 90 THEN 'OK' WHEN g % 100 < 95 THEN 'FAILED'
           WHEN g % 100 = 95 THEN 'SKIPPED' WHEN g % 100 < 98 THEN 'PARTLY_FAILED'
           WHEN g % 100 = 98 THEN 'POSTPONED' ELSE 'PROCESSING' END AS state) AS s
       CROSS JOIN LATERAL (SELECT now() - interval '7 days' + g * (interval '6 days' / :n) AS ts) AS r""",
    """SELECT setval(pg_get_serial_sequence('message', 'id'), :n)""",
    """INSERT INTO message_transition (message_id, from_state, to_state, at, node_id, attempt, error_code, cause)
       SELECT id, NULL, 'NEW', receive_ts, node_id, 1, NULL, 'engine' FROM message""",
    """INSERT INTO message_transition (message_id, from_state, to_state, at, node_id, attempt, error_code, cause)
       SELECT id, 'NEW', 'PROCESSING', receive_ts + interval '1 second', node_id, 1, NULL, 'engine' FROM message""",
    """INSERT INTO message_transition (message_id, from_state, to_state, at, node_id, attempt, error_code, cause)
       SELECT id, 'PROCESSING', state, last_update_ts, node_id, failed_count + 1, last_error_code, 'engine'
       FROM message WHERE state <> 'PROCESSING'""",
    """INSERT INTO confirmation (message_id, source_system, outcome_state, status, attempts, next_attempt_at,
           last_error, created_at, updated_at, sent_at)
       SELECT id, source_system, state, 'SENT', 1, NULL, NULL, last_update_ts, last_update_ts + interval '2 s',
           last_update_ts + interval '2 seconds'
       FROM message WHERE state IN ('OK', 'FAILED')""",
    """INSERT INTO external_call (message_id, call_key, status, attempts, result, last_error, created_at, updated_at)
       SELECT id, 'push', 'OK', 1, NULL, NULL, receive_ts, receive_ts FROM message WHERE id % 2 = 0""",
    """INSERT INTO entity_call (entity_type, object_id, call_key, status, owner_message_id, attempts, result,
           last_error, created_at, updated_at)
       SELECT 'customer', 'o' || g, 'register', 'OK', g, 1, NULL, NULL, now(), now()
       FROM generate_series(1, LEAST(:n, 50000)) AS g""",
]

#: the audit's statistics and checks as PostgreSQL queries (the floor), every result fetched
FLOOR_AUDIT = [
    """SELECT service, operation, receive_ts::date, state, count(*) FROM message GROUP BY 1, 2, 3, 4""",
    """WITH f AS (SELECT m.id, m.service, m.operation, m.receive_ts,
                  coalesce((SELECT max(t.at) FROM message_transition t WHERE t.message_id = m.id
                            AND t.to_state IN ('OK', 'FAILED', 'SKIPPED', 'CANCEL')), m.last_update_ts) AS final_at
                FROM message m WHERE m.state IN ('OK', 'FAILED', 'SKIPPED', 'CANCEL'))
       SELECT service, operation, receive_ts::date, count(*),
              percentile_cont(ARRAY[0.5, 0.95, 0.99]) WITHIN GROUP (ORDER BY extract(epoch FROM final_at - receive_ts)),
              (SELECT count(*) FROM f) FROM f GROUP BY 1, 2, 3""",
    """SELECT m.service, m.operation, date_trunc('hour', t.at), count(*) FROM message_transition t
       JOIN message m ON m.id = t.message_id WHERE t.to_state IN ('OK', 'FAILED', 'SKIPPED', 'CANCEL')
       GROUP BY 1, 2, 3""",
    """SELECT m.service, m.operation, s.to_state, count(*), sum(s.secs), avg(s.secs),
              percentile_cont(0.95) WITHIN GROUP (ORDER BY s.secs)
       FROM (SELECT message_id, to_state,
                    extract(epoch FROM lead(at) OVER (PARTITION BY message_id ORDER BY id) - at) AS secs
             FROM message_transition) s JOIN message m ON m.id = s.message_id WHERE s.secs IS NOT NULL
       GROUP BY 1, 2, 3""",
    """SELECT service, operation, failed_count + 1, count(*) FROM message
       WHERE state IN ('OK', 'FAILED', 'SKIPPED', 'CANCEL') GROUP BY 1, 2, 3""",
    """SELECT service, operation, last_error_code, count(*) FROM message WHERE last_error_code IS NOT NULL
       GROUP BY 1, 2, 3 ORDER BY 4 DESC""",
    """SELECT service, operation, e->>'code', count(*) FROM message, jsonb_array_elements(business_errors) e
       GROUP BY 1, 2, 3""",
    """SELECT source_system, created_at::date, count(*), count(*) FILTER (WHERE status = 'FAILED'),
              percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM sent_at - created_at))
       FROM confirmation GROUP BY 1, 2""",
    """SELECT m.service, m.operation, m.receive_ts::date, count(*) FROM message_transition t
       JOIN message m ON m.id = t.message_id WHERE t.to_state = 'POSTPONED' GROUP BY 1, 2, 3""",
    # the checks
    """SELECT id FROM message WHERE state NOT IN ('OK', 'FAILED', 'SKIPPED', 'CANCEL')
       AND last_update_ts < now() - interval '1 hour'
       AND (next_attempt_at IS NULL OR next_attempt_at < now() - interval '1 hour')""",
    """SELECT m.id FROM message m LEFT JOIN node n ON n.id = m.node_id AND n.stopped_at IS NULL
       AND n.heartbeat_at >= now() - interval '5 minutes' WHERE m.state = 'PROCESSING' AND n.id IS NULL""",
    """SELECT m.id FROM message m WHERE m.state IN ('OK', 'FAILED', 'CANCEL') AND m.parent_id IS NULL
       AND m.last_update_ts < now() - interval '15 minutes'
       AND m.source_system IN (SELECT DISTINCT source_system FROM confirmation)
       AND NOT EXISTS (SELECT 1 FROM confirmation c WHERE c.message_id = m.id)""",
    """SELECT message_id FROM confirmation WHERE status = 'PENDING'
       AND (attempts >= 10 OR next_attempt_at < now() - interval '1 hour')""",
    """SELECT c.id FROM message c JOIN message p ON p.id = c.parent_id
       WHERE p.state IN ('OK', 'FAILED', 'SKIPPED', 'CANCEL')
       AND c.state NOT IN ('OK', 'FAILED', 'SKIPPED', 'CANCEL')""",
    """SELECT p.id FROM message p JOIN message c ON c.parent_id = p.id WHERE p.state = 'WAITING_FOR_CHILDREN'
       GROUP BY p.id HAVING bool_and(c.state IN ('OK', 'FAILED', 'SKIPPED', 'CANCEL'))""",
    """SELECT owner_message_id FROM entity_call WHERE status = 'OK' AND (entity_type, object_id, call_key) IN
       (SELECT entity_type, object_id, call_key FROM entity_call WHERE status = 'OK' GROUP BY 1, 2, 3
        HAVING count(*) > 1)
       UNION SELECT message_id FROM external_call WHERE status = 'OK' GROUP BY message_id, call_key
       HAVING count(*) > 1""",
    """WITH s AS (SELECT message_id, from_state, to_state,
                  lag(to_state) OVER (PARTITION BY message_id ORDER BY id) AS prev_to,
                  row_number() OVER (PARTITION BY message_id ORDER BY id DESC) AS rank_desc
                  FROM message_transition)
       SELECT message_id FROM s WHERE prev_to IS NOT NULL AND from_state IS DISTINCT FROM prev_to
       UNION SELECT m.id FROM message m LEFT JOIN s ON s.message_id = m.id AND s.rank_desc = 1
       WHERE s.to_state IS DISTINCT FROM m.state""",
]

#: the reprocess plan's decisions for the FAILED messages as one PostgreSQL query (the floor)
FLOOR_PLAN = [
    """SELECT m.id, m.service || '/' || m.operation,
              CASE WHEN EXISTS (SELECT 1 FROM message n WHERE n.entity_type = m.entity_type
                                AND n.object_id = m.object_id AND n.state = 'OK' AND n.receive_ts > m.receive_ts)
                   THEN 'SKIP_OBSOLETE'
                   WHEN m.parent_id IS NOT NULL THEN 'LEAVE' ELSE 'RESTART' END
       FROM message m WHERE m.state = 'FAILED'""",
]



#: the reprocess plan's decisions for the FAILED messages, as the Spark plan decides them (reprocess._verdict) and
#: with its columns
SQL_PLAN = f"""
SELECT m.id, m.version, m.state, m.service, m.operation, m.service || '/' || m.operation AS route, m.source_system,
       m.correlation_id, m.entity_type, m.object_id, m.parent_id, m.receive_ts, m.failed_count, m.last_error_code,
       CASE WHEN d.done THEN 'LEAVE' WHEN p.state IN ('OK', 'FAILED', 'SKIPPED', 'CANCEL') THEN 'LEAVE'
            WHEN n.id IS NOT NULL THEN 'SKIP_OBSOLETE' ELSE 'RESTART' END AS decision,
       CASE WHEN d.done THEN 'already restarted by this job'
            WHEN p.state IN ('OK', 'FAILED', 'SKIPPED', 'CANCEL')
            THEN 'parent #' || p.id || ' is final (' || p.state || '): restart the parent instead'
            WHEN n.id IS NOT NULL THEN 'newer message #' || n.id || ' of the same ' || m.entity_type || ' ended OK'
       END AS reason,
       n.id AS newer_ok_id, '{JOB_ID}' AS job_id
FROM message m
LEFT JOIN message p ON p.id = m.parent_id
LEFT JOIN LATERAL (SELECT o.id FROM message o WHERE o.entity_type = m.entity_type AND o.object_id = m.object_id
                   AND o.state = 'OK' AND (o.receive_ts, o.id) > (m.receive_ts, m.id)
                   ORDER BY o.receive_ts DESC, o.id DESC LIMIT 1) n ON true
CROSS JOIN LATERAL (SELECT EXISTS (SELECT 1 FROM message_transition t WHERE t.message_id = m.id
                                   AND t.cause = 'reprocess:{JOB_ID}') AS done) d
WHERE m.state = 'FAILED'
"""

#: the plan applied as the engine's rules decide (engine/outcome.py: restarted, obsolete): one UPDATE of the rows
#: still at their planned version and one INSERT of their transition rows
SQL_APPLY = f"""
BEGIN;
CREATE TEMPORARY TABLE plan (id bigint, version integer, state text, service text, operation text, route text,
  source_system text, correlation_id text, entity_type text, object_id text, parent_id bigint, receive_ts timestamptz,
  failed_count integer, last_error_code text, decision text, reason text, newer_ok_id bigint, job_id text);
\\copy plan FROM '{{plan}}' CSV HEADER
WITH written AS (
  UPDATE message m SET
    state = CASE WHEN p.decision = 'RESTART' THEN 'PARTLY_FAILED' ELSE 'SKIPPED' END,
    version = m.version + 1, last_update_ts = now(), failed_count = 0, business_errors = '[]'::jsonb,
    next_attempt_at = CASE WHEN p.decision = 'RESTART' THEN now() END,
    last_error_code = CASE WHEN p.decision = 'RESTART' THEN m.last_error_code ELSE 'OBSOLETE' END,
    last_error_text = CASE WHEN p.decision = 'RESTART' THEN m.last_error_text
                      ELSE 'a newer message for ' || p.entity_type || ' ' || p.object_id || ' ended OK' END,
    last_error_trace = CASE WHEN p.decision = 'RESTART' THEN m.last_error_trace END
  FROM plan p
  WHERE m.id = p.id AND m.version = p.version AND p.decision IN ('RESTART', 'SKIP_OBSOLETE')
  RETURNING m.id, p.decision, m.state, m.last_update_ts, m.last_error_code, m.last_error_text
)
INSERT INTO message_transition (message_id, from_state, to_state, at, node_id, attempt, error_code, error_text,
                                error_trace, cause)
SELECT id, 'FAILED', state, last_update_ts, 'sql', 1,
       CASE WHEN decision = 'SKIP_OBSOLETE' THEN last_error_code END,
       CASE WHEN decision = 'SKIP_OBSOLETE' THEN last_error_text END, NULL, 'reprocess:{JOB_ID}'
FROM written;
COMMIT;
"""

#: the messages (and their rows) the archive takes: final and last changed before the cut-off
ARCHIVED = ("SELECT id FROM message WHERE state IN ('OK', 'FAILED', 'SKIPPED', 'CANCEL') "
            "AND last_update_ts < now() - interval '{hours} hours'")

SQL_ARCHIVE = """
BEGIN;
CREATE TEMPORARY TABLE old AS """ + ARCHIVED + """;
""" + "".join(
    f"\\copy (SELECT x.* FROM {table} x JOIN old ON old.id = x.{key}) TO '{{out}}/{table}.csv' CSV HEADER\n"
    for table, key in (("message", "id"), ("message_transition", "message_id"), ("external_call", "message_id"),
                       ("confirmation", "message_id"))
) + """DELETE FROM message WHERE id IN (SELECT id FROM old);
COMMIT;
"""


#: the indexes of the store that back no constraint (the generation drops and rebuilds them)
SECONDARY_INDEXES = """
SELECT i.indexname, i.indexdef FROM pg_indexes i
WHERE i.schemaname = 'public'
  AND NOT EXISTS (SELECT 1 FROM pg_constraint c WHERE c.conindid = format('%I.%I', i.schemaname, i.indexname)::regclass)
ORDER BY i.indexname
"""

#: the columns an apply changes, restored from ``bench_undo`` (the FAILED messages as generated) after each apply
UNDO = """
DELETE FROM message_transition WHERE cause = 'reprocess:{job}';
UPDATE message m SET {assignments} FROM bench_undo b WHERE m.id = b.id AND m.version <> b.version;
"""


def database_url(size: int, suffix: str = "") -> str:
    return ADMIN_URL.rsplit("/", 1)[0] + f"/openroute_spark_bench_{size}{suffix}"


def psql_url(url: str) -> str:
    return url.replace("postgresql+psycopg://", "postgresql://")


def _admin() -> sa.Engine:
    return sa.create_engine(ADMIN_URL, isolation_level="AUTOCOMMIT")


def ensure_store(size: int) -> str:
    """The benchmark database of ``size`` messages, generated unless it already holds exactly that many."""
    from openroute.persistence import MessageStore

    url = database_url(size)
    name = url.rsplit("/", 1)[1]
    admin = _admin()
    with admin.connect() as connection:
        exists = connection.execute(sa.text("SELECT 1 FROM pg_database WHERE datname = :n"), {"n": name}).first()
        if exists:
            engine = sa.create_engine(url)
            try:
                with engine.connect() as c:
                    done = c.execute(sa.text("SELECT count(*) FROM node")).scalar()
                    count = c.execute(sa.text("SELECT count(*) FROM message")).scalar()
            except sa.exc.DBAPIError:
                done, count = 0, -1
            finally:
                engine.dispose()
            if count == size and done:
                admin.dispose()
                return url
            connection.execute(sa.text(f'DROP DATABASE "{name}" WITH (FORCE)'))
        connection.execute(sa.text(f'CREATE DATABASE "{name}"'))
    admin.dispose()
    store = MessageStore(url)
    store.create_schema()
    store.dispose()
    started = time.perf_counter()
    engine = sa.create_engine(url)
    with engine.begin() as connection:
        # the secondary indexes (trigram ones included) built once after the rows, not updated row by row: the same
        # indexes, generated about twice as fast
        indexes = connection.execute(sa.text(SECONDARY_INDEXES)).all()
        for index, _definition in indexes:
            connection.execute(sa.text(f'DROP INDEX "{index}"'))
        for statement in GENERATE if size else GENERATE[:1]:
            connection.execute(sa.text(statement), {"n": size})
        connection.execute(sa.text("SET LOCAL maintenance_work_mem = '512MB'"))
        for _index, definition in indexes:
            connection.execute(sa.text(definition))
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
        connection.execute(sa.text("VACUUM ANALYZE"))
    engine.dispose()
    print(f"generated {size:,} messages in {time.perf_counter() - started:.1f} s ({name})", flush=True)
    return url


def fresh_copy(size: int) -> str:
    """A copy of the size's database for one run that changes it (the previous copy dropped first)."""
    url = database_url(size, "_run")
    name, template = url.rsplit("/", 1)[1], database_url(size).rsplit("/", 1)[1]
    admin = _admin()
    with admin.connect() as connection:
        connection.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        for attempt in range(30):  # the template must have no session: a job's last JDBC connection may linger
            try:
                connection.execute(sa.text(f'CREATE DATABASE "{name}" TEMPLATE "{template}" STRATEGY FILE_COPY'))
                break
            except sa.exc.OperationalError:
                if attempt == 29:
                    raise
                time.sleep(1)
    admin.dispose()
    return url


def drop_copy(size: int, suffix: str = "_run") -> None:
    admin = _admin()
    with admin.connect() as connection:
        name = database_url(size, suffix).rsplit("/", 1)[1]
        connection.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()


def apply_copy(size: int) -> str:
    """The copy of the size's database the apply runs change, made once: each apply is undone after it (the FAILED
    messages restored from ``bench_undo``, the job's transition rows deleted, both tables vacuumed), untimed, which
    is quicker than a copy of the whole store per run."""
    url = fresh_copy(size).replace("_run", "_apply")
    drop_copy(size, "_apply")
    admin = _admin()
    with admin.connect() as connection:
        old, new = database_url(size, "_run").rsplit("/", 1)[1], url.rsplit("/", 1)[1]
        connection.execute(sa.text(f'ALTER DATABASE "{old}" RENAME TO "{new}"'))
    admin.dispose()
    engine = sa.create_engine(url)
    with engine.begin() as connection:
        connection.execute(sa.text("CREATE TABLE bench_undo AS SELECT * FROM message WHERE state = 'FAILED'"))
    engine.dispose()
    return url


def undo_apply(url: str) -> None:
    """Put the apply copy back as generated (see :func:`apply_copy`)."""
    engine = sa.create_engine(url)
    with engine.begin() as connection:
        columns = [c["name"] for c in sa.inspect(connection).get_columns("message") if c["name"] != "id"]
        assignments = f"({', '.join(columns)}) = ({', '.join('b.' + c for c in columns)})"
        for statement in UNDO.format(job=JOB_ID, assignments=assignments).split(";"):
            if statement.strip():
                connection.execute(sa.text(statement))
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
        connection.execute(sa.text("VACUUM ANALYZE message, message_transition"))
    engine.dispose()


def keep_hours(url: str) -> int:
    """Hours that put the archive's cut-off 3 days before the store's generation (its last receive time + 1 day),
    whenever the benchmark runs: the same messages are archived on every run."""
    engine = sa.create_engine(url)
    with engine.connect() as connection:
        hours = connection.execute(sa.text(
            "SELECT extract(epoch FROM now() - (max(receive_ts) + interval '1 day' - interval '3 days')) / 3600 "
            "FROM message")).scalar()
    engine.dispose()
    return max(1, math.ceil(float(hours))) if hours is not None else 72


class Runner:
    """Builds and times each command; keeps the plans the apply runs read."""

    def __init__(self, work: Path, master: str, remote: str | None, partitions: int) -> None:
        self.work, self.master, self.remote, self.partitions = work, master, remote, partitions
        self.hours: dict[int, int] = {}
        self.applied: dict[int, str] = {}  # size -> its apply copy

    def _spark(self, kind: str, url: str, job: list[str]) -> list[str]:
        where = ["--remote", self.remote] if kind == "warm" and self.remote else ["--master", self.master]
        return [sys.executable, "-m", "openroute", "spark", *job, "--database-url", url, *where,
                "--partitions", str(self.partitions)]

    def plan_folder(self, kind: str, size: int) -> Path:
        return self.work / f"plan-{kind if kind == 'sql' else 'spark'}-{size}"

    def command(self, job: str, kind: str, size: int, url: str, out: Path) -> list[str]:
        psql = ["psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", psql_url(url)]
        if kind == "sql":
            script = out.with_suffix(".sql")
            if job == "audit":
                out.mkdir(parents=True)
                text = "".join(f"\\copy ({' '.join(q.split())}) TO '{out}/audit-{i}.csv' CSV HEADER\n"
                               for i, q in enumerate(FLOOR_AUDIT))
            elif job == "plan":
                out.mkdir(parents=True)
                text = f"\\copy ({' '.join(SQL_PLAN.split())}) TO '{out}/plan.csv' CSV HEADER\n"
            elif job == "apply":
                text = SQL_APPLY.replace("{plan}", str(self.plan_folder("sql", size) / "plan.csv"))
            else:
                out.mkdir(parents=True)
                text = SQL_ARCHIVE.replace("{hours}", str(self.hours[size])).replace("{out}", str(out))
            script.write_text(text)
            return [*psql, "-f", str(script)]
        if job == "audit":
            return self._spark(kind, url, ["audit", "--out", str(out)])
        if job == "plan":
            return self._spark(kind, url, ["reprocess", "--out", str(out), "--job-id", JOB_ID])
        if job == "apply":
            return self._spark(kind, url, ["reprocess", "--plan", str(self.plan_folder("spark", size)), "--apply"])
        keep = ",".join(f"{state}={self.hours[size]}h" for state in ("OK", "FAILED", "SKIPPED", "CANCEL"))
        return self._spark(kind, url, ["archive", "--keep", keep, "--to", str(out)])

    def run(self, job: str, kind: str, size: int, keep_output: Path | None = None) -> dict[str, Any]:
        """One timed command; the store copied first for a job that changes it."""
        if job == "apply":
            if size not in self.applied:
                self.applied[size] = apply_copy(size)
            url = self.applied[size]
        else:
            url = fresh_copy(size) if job == "archive" else database_url(size)
        if job == "archive" and size not in self.hours:
            self.hours[size] = keep_hours(url)
        out = keep_output or Path(tempfile.mkdtemp(dir=self.work)) / "out"
        argv = self.command(job, kind, size, url, out)
        started = time.perf_counter()
        child = subprocess.run(argv, capture_output=True, text=True, check=False)
        wall = time.perf_counter() - started
        if job == "apply":
            undo_apply(url)
        elif job == "archive":
            drop_copy(size)
        if keep_output is None:
            shutil.rmtree(out.parent, ignore_errors=True)
        # audit exits 1 when a check fails: the generated store has stuck messages on purpose
        if child.returncode not in ((0, 1) if job == "audit" and kind != "sql" else (0,)):
            tail = (child.stderr.strip() or child.stdout.strip()).splitlines()[-3:]
            sys.exit(f"{job} {kind} on {size:,}: exit {child.returncode}: {' | '.join(tail)}\n{' '.join(argv)}")
        session = re.search(r"spark session ready in ([0-9.]+) s", child.stdout)
        return {"wall_s": wall, "session_s": float(session.group(1)) if session else None}


def fit(points: list[tuple[int, float]]) -> tuple[float, float] | None:
    """(fixed seconds, seconds per message) of the least-squares line through ``points``; None for one size."""
    if len({n for n, _ in points}) < 2:
        return None
    mean_n = statistics.fmean(n for n, _ in points)
    mean_t = statistics.fmean(t for _, t in points)
    slope = sum((n - mean_n) * (t - mean_t) for n, t in points) / sum((n - mean_n) ** 2 for n, _ in points)
    return mean_t - slope * mean_n, slope


def crossover(spark: tuple[float, float] | None, sql: tuple[float, float] | None) -> str:
    """Where the Spark line meets the SQL line, in words."""
    if spark is None or sql is None:
        return "n/a (give two sizes or more)"
    (a_spark, b_spark), (a_sql, b_sql) = spark, sql
    if b_spark < 0 or b_sql < 0:  # a time that fell with the size: the noise is larger than the growth
        return "n/a: a line falls with the size (noise larger than the growth: repeat on a quiet machine)"
    if b_sql <= b_spark:
        return "none: SQL grows as slowly or slower, Spark never catches up" if a_spark >= a_sql else \
            "none: Spark quicker at every size"
    at = (a_spark - a_sql) / (b_sql - b_spark)
    return f"{max(at, 0):,.0f} messages" if at > 0 else "none: Spark quicker at every size"


def _spread(values: list[float]) -> str:
    return f"{min(values):.2f} / {statistics.median(values):.2f} / {max(values):.2f}"


def report(results: dict[tuple[str, str, int], list[dict[str, Any]]], sizes: list[int], jobs: list[str],
           kinds: list[str]) -> dict[str, Any]:
    """Print the tables; returns the crossovers and fits (for --json)."""
    summary: dict[str, Any] = {"crossover": {}, "fit": {}}
    print(f"\n{'job':<8} {'messages':>11} {'kind':<5} {'wall s min / median / max':>27} {'session s':>10} "
          f"{'/ SQL (median)':>15} {'growth':>7}")
    for job in jobs:
        for kind in kinds:
            previous: float | None = None
            for size in sizes:
                runs = results.get((job, kind, size), [])
                if not runs:
                    continue
                walls = [r["wall_s"] for r in runs]
                sessions = [r["session_s"] for r in runs if r["session_s"] is not None]
                median = statistics.median(walls)
                sql = results.get((job, "sql", size))
                ratio = f"{median / statistics.median(r['wall_s'] for r in sql):.2f}x" if sql and kind != "sql" else ""
                growth = f"{median / previous:.1f}x" if previous else ""
                session = f"{statistics.median(sessions):.1f}" if sessions else ""
                print(f"{job:<8} {size:>11,} {kind:<5} {_spread(walls):>27} {session:>10} {ratio:>15} {growth:>7}")
                previous = median
        fits = {kind: fit([(size, statistics.median(r["wall_s"] for r in results[(job, kind, size)]))
                           for size in sizes if size and (job, kind, size) in results]) for kind in kinds}
        summary["fit"][job] = fits
        for kind in kinds:
            if kind != "sql" and "sql" in kinds:
                line = fits[kind]
                where = crossover(line, fits["sql"])
                summary["crossover"][f"{job}/{kind}"] = where
                shape = f" (Spark {line[0]:.1f} s + {line[1] * 1e6:.2f} s per million" \
                        f", SQL {fits['sql'][0]:.1f} s + {fits['sql'][1] * 1e6:.2f} s per million)" \
                    if line and fits["sql"] else ""
                print(f"  crossover {job} {kind} vs SQL: {where}{shape}")
    if "plan" in jobs and "apply" in jobs and "sql" in kinds:
        # a reprocessing job is a plan and an apply: the lines add up (openroute.runtime.bulk.SPARK_PAYS_OFF_AT is this
        # one)
        def both(kind: str) -> tuple[float, float] | None:
            plan, apply = summary["fit"]["plan"][kind], summary["fit"]["apply"][kind]
            return None if plan is None or apply is None else (plan[0] + apply[0], plan[1] + apply[1])

        for kind in kinds:
            if kind != "sql":
                where = crossover(both(kind), both("sql"))
                summary["crossover"][f"reprocess/{kind}"] = where
                line, sql = both(kind), both("sql")
                selected = ""
                if line is not None and sql is not None and sql[1] > line[1] >= 0 and line[0] > sql[0]:
                    # the commands' threshold counts the messages a job selects: the FAILED ones, 5 % of the store
                    selected = f" (~{(line[0] - sql[0]) / (sql[1] - line[1]) * FAILED_SHARE:,.0f} FAILED selected)"
                print(f"  crossover reprocess (plan + apply) {kind} vs SQL: {where}{selected}")
    return summary


def measure(runner: Runner, sizes: list[int], jobs: list[str], kinds: list[str],
            repeat: int, cold_sizes: set[int]) -> dict[tuple[str, str, int], list[dict[str, Any]]]:
    """Every (job, kind, size) ``repeat`` times, interleaved; the empty store (size 0) gets the plan only, and the
    cold kind runs at ``cold_sizes`` only (elsewhere it is the warm run plus the start-up measured at size 0)."""
    remote = runner.remote
    # the plans the apply runs read (untimed): the same store, the same decisions, each kind's own format
    for size in sizes:
        if "apply" in jobs:
            if "sql" in kinds:
                runner.run("plan", "sql", size, keep_output=runner.plan_folder("sql", size))
            if {"cold", "warm"} & set(kinds):
                runner.run("plan", "warm" if remote else "cold", size, keep_output=runner.plan_folder("spark", size))
    results: dict[tuple[str, str, int], list[dict[str, Any]]] = {}
    for turn_number in range(repeat):
        for size in [0, *sizes]:
            for job in (["plan"] if size == 0 else jobs):  # the empty store: start-up and fixed cost only
                turn = kinds[turn_number % len(kinds):] + kinds[:turn_number % len(kinds)]  # rotating order
                for kind in (k for k in turn if k != "cold" or size in cold_sizes):
                    measured = runner.run(job, kind, size)
                    results.setdefault((job, kind, size), []).append(measured)
                    session = f" (session {measured['session_s']:.1f} s)" if measured["session_s"] else ""
                    print(f"run {turn_number + 1}: {job:<8} {kind:<5} {size:>11,}: {measured['wall_s']:.2f} s"
                          f"{session}", flush=True)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="100000,1000000,10000000", help="messages per store, comma-separated")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--jobs", default=",".join(JOBS), help="of audit, plan, apply, archive")
    parser.add_argument("--kinds", default=",".join(KINDS), help="of cold, warm, sql")
    parser.add_argument("--cold-sizes", default="0",
                        help="the sizes the cold kind runs at (default 0: a cold command is the warm one plus the "
                             "start-up, measured on the empty store); 'all' for every size")
    parser.add_argument("--partitions", type=int, default=4, help="JDBC partitions of the Spark jobs (default 4)")
    parser.add_argument("--master", default="local[*]", help="the cold jobs' and the Connect server's master")
    parser.add_argument("--port", type=int, default=15028, help="the Connect server's port (default 15028)")
    parser.add_argument("--json", default=None, help="also write every measurement and the crossovers here")
    args = parser.parse_args()
    sizes = sorted({int(s) for s in args.sizes.split(",")} - {0})  # the empty store is always measured
    cold_sizes = {0, *sizes} if args.cold_sizes == "all" else {int(s) for s in args.cold_sizes.split(",")}
    jobs = [j.strip() for j in args.jobs.split(",")]
    kinds = [k.strip() for k in args.kinds.split(",")]
    if set(jobs) - set(JOBS) or set(kinds) - set(KINDS):
        sys.exit(f"--jobs takes {JOBS}, --kinds {KINDS}")
    print(f"load: {os.getloadavg()}", flush=True)
    for size in [0, *sizes]:
        ensure_store(size)
    work = Path(tempfile.mkdtemp(prefix="openroute-spark-bench-"))
    connect_dir = work / "connect"
    os.environ["OPENROUTE_SPARK_CONNECT_DIR"] = str(connect_dir)
    remote = f"sc://127.0.0.1:{args.port}" if "warm" in kinds else None
    runner = Runner(work, args.master, remote, args.partitions)
    try:
        if remote:
            started = time.perf_counter()
            subprocess.run([sys.executable, "-m", "openroute", "spark", "connect", "start", "--port", str(args.port),
                            "--master", args.master, "--wait", "900"], check=True)
            print(f"Connect server up in {time.perf_counter() - started:.1f} s (not counted)", flush=True)
        results = measure(runner, sizes, jobs, kinds, args.repeat, cold_sizes)
    finally:
        if remote:
            subprocess.run([sys.executable, "-m", "openroute", "spark", "connect", "stop", "--port", str(args.port)],
                           check=False)
        shutil.rmtree(work, ignore_errors=True)
        for size in runner.applied:
            drop_copy(size, "_apply")
    print(f"\n{args.repeat} runs each, master {args.master}, {args.partitions} JDBC partitions; load after: "
          f"{os.getloadavg()}")
    start_up = {kind: statistics.median(r["wall_s"] for r in results[("plan", kind, 0)]) for kind in kinds}
    print("start-up (plan of an empty store, whole command, median): "
          + ", ".join(f"{kind} {seconds:.2f} s" for kind, seconds in start_up.items()))
    if "cold" in start_up and "warm" in start_up:
        print(f"a cold command = the warm one + {start_up['cold'] - start_up['warm']:.2f} s (the JVM and session start)"
              + ("" if cold_sizes - {0} else "; cold measured at size 0 only (--cold-sizes)"))
    summary = report(results, sizes, jobs, kinds)
    if args.json:
        Path(args.json).write_text(json.dumps({
            "sizes": sizes, "start_up_s": start_up, **summary,
            "runs": [{"job": j, "kind": k, "size": n, **r} for (j, k, n), rs in results.items() for r in rs],
        }, indent=1, default=str))


if __name__ == "__main__":
    main()
