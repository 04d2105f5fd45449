"""Spark jobs benchmark: audit and reprocess-plan wall time on stores of 100,000 and 1,000,000 messages, against
the same aggregates written as plain SQL on PostgreSQL (the floor), and the driver's peak memory.

    python benchmarks/spark_bench.py [--sizes 100000,1000000] [--repeat 3] [--partitions 4] [--master local[2]]

Each size has its own PostgreSQL database (``openroute_spark_bench_<size>``), generated once with set-based SQL
(``INSERT ... SELECT FROM generate_series``: messages, three transitions each, confirmations, external and entity
calls, a node) and reused by later runs. Every measurement runs in a fresh child process, interleaved across
sizes and jobs and repeated: the audit (``openroute.spark.audit.audit`` + writing its report), the reprocess plan
(``openroute.spark.reprocess.write_plan`` of the FAILED messages) and their SQL floors (the same statistics and
checks, the same plan decisions, as PostgreSQL queries fetched by psycopg). Spark's start-up is not counted.

It prints, per size and job: wall time min/median/max, the ratio job / floor (min/median/max over the repeats),
the growth 100k -> 1M (10x the rows: linear is 10x), and the driver's peak memory (the Python process's peak
RSS and the JVM's VmHWM; in local mode the JVM is the driver and the executors at once).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import sqlalchemy as sa

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

ADMIN_URL = os.environ.get("OPENROUTE_BENCH_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")

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


def database_url(size: int) -> str:
    return ADMIN_URL.rsplit("/", 1)[0] + f"/openroute_spark_bench_{size}"


def ensure_store(size: int) -> str:
    """The benchmark database of ``size`` messages, generated unless it already holds exactly that many."""
    from openroute.persistence import MessageStore

    url = database_url(size)
    name = url.rsplit("/", 1)[1]
    admin = sa.create_engine(ADMIN_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        exists = connection.execute(sa.text("SELECT 1 FROM pg_database WHERE datname = :n"), {"n": name}).first()
        if exists:
            engine = sa.create_engine(url)
            try:
                with engine.connect() as c:
                    done = c.execute(sa.text("SELECT count(*) FROM confirmation")).scalar()
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
        for statement in GENERATE:
            connection.execute(sa.text(statement), {"n": size})
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
        connection.execute(sa.text("ANALYZE"))
    engine.dispose()
    print(f"generated {size:,} messages in {time.perf_counter() - started:.1f} s ({name})", flush=True)
    return url


def _jvm_peak_kib() -> int:
    """VmHWM of this process's java children (the Spark driver JVM), in KiB; 0 when none."""
    me = str(os.getpid())
    peak = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            if stat.rsplit(")", 1)[1].split()[1] != me:
                continue
            for line in (entry / "status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    peak = max(peak, int(line.split()[1]))
        except (OSError, IndexError, ValueError):
            continue
    return peak


def run_one(job: str, size: int, partitions: int, master: str) -> dict[str, float]:
    """One measurement in this (fresh) process: wall seconds and peak memory."""
    url = database_url(size)
    if job.startswith("floor"):
        statements = FLOOR_AUDIT if job == "floor_audit" else FLOOR_PLAN
        engine = sa.create_engine(url)
        started = time.perf_counter()
        rows = 0
        with engine.connect() as connection:
            for statement in statements:
                rows += len(connection.execute(sa.text(statement)).fetchall())
        wall = time.perf_counter() - started
        engine.dispose()
        return {"wall_s": wall, "rows": rows, "py_peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
    from openroute.spark.session import build_session

    log = Path(tempfile.gettempdir()) / f"openroute-spark-bench-{os.getpid()}.log"
    spark = build_session(master, app_name=f"spark-bench-{job}", jvm_log=log,
                          config={"spark.sql.shuffle.partitions": str(max(4, partitions * 2))})
    with tempfile.TemporaryDirectory() as out:
        started = time.perf_counter()
        if job == "audit":
            from openroute.spark.audit import audit

            result = audit(spark, url, partitions=partitions)
            written = result.write(Path(out) / "audit")
            rows = sum(c.count for c in result.checks)
            # kept for docs/spark-audit.md's chart
            keep = Path(tempfile.gettempdir()) / f"spark-bench-audit-summary-{size}.json"
            keep.write_text((written / "summary.json").read_text())
        else:
            from openroute.spark.reprocess import ReprocessFilter, write_plan

            plan = write_plan(spark, url, Path(out) / "plan", "bench", ReprocessFilter(), partitions=partitions)
            rows = sum(n for _, _, n in plan.summary)
        wall = time.perf_counter() - started
    jvm = _jvm_peak_kib() / 1024
    spark.stop()
    return {"wall_s": wall, "rows": rows, "py_peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "jvm_peak_mib": jvm}


def _spread(values: list[float]) -> str:
    return f"{min(values):.2f} / {statistics.median(values):.2f} / {max(values):.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="100000,1000000")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--jobs", default="audit,plan", help="which Spark jobs: audit, plan")
    parser.add_argument("--one", nargs=2, metavar=("JOB", "SIZE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(run_one(args.one[0], int(args.one[1]), args.partitions, args.master)))
        return
    sizes = [int(s) for s in args.sizes.split(",")]
    jobs = [j.strip() for j in args.jobs.split(",")]
    for size in sizes:
        ensure_store(size)
    results: dict[tuple[str, int], list[dict[str, float]]] = {}
    for repeat in range(args.repeat):
        for size in sizes:
            for job in jobs:
                for name in (job, f"floor_{job}"):  # interleaved: each job next to its floor
                    child = subprocess.run(
                        [sys.executable, __file__, "--one", name, str(size), "--partitions", str(args.partitions),
                         "--master", args.master], capture_output=True, text=True, check=False)
                    if child.returncode != 0:
                        sys.exit(f"{name} on {size}: {child.stderr.strip().splitlines()[-1:]}")
                    measured = json.loads(child.stdout.strip().splitlines()[-1])
                    results.setdefault((name, size), []).append(measured)
                    print(f"run {repeat + 1}: {name:<12} {size:>9,}: {measured['wall_s']:.2f} s", flush=True)
    print(f"\nmaster {args.master}, {args.partitions} JDBC partitions, {args.repeat} runs each "
          f"(min / median / max)")
    print(f"{'job':<8} {'messages':>10} {'Spark s':>22} {'SQL floor s':>22} {'Spark / floor':>22} "
          f"{'msgs/s (median)':>16} {'py peak MiB':>12} {'JVM peak MiB':>13}")
    for job in jobs:
        for size in sizes:
            spark_runs, floor_runs = results[(job, size)], results[(f"floor_{job}", size)]
            walls = [r["wall_s"] for r in spark_runs]
            floors = [r["wall_s"] for r in floor_runs]
            ratios = [s / f for s, f in zip(walls, floors, strict=True)]
            print(f"{job:<8} {size:>10,} {_spread(walls):>22} {_spread(floors):>22} {_spread(ratios):>22} "
                  f"{size / statistics.median(walls):>16,.0f} "
                  f"{max(r['py_peak_mib'] for r in spark_runs):>12.0f} "
                  f"{max(r['jvm_peak_mib'] for r in spark_runs):>13.0f}")
        if len(sizes) > 1:
            small, big = sizes[0], sizes[-1]
            grow = statistics.median(r["wall_s"] for r in results[(job, big)]) / statistics.median(
                r["wall_s"] for r in results[(job, small)])
            floor_grow = statistics.median(r["wall_s"] for r in results[(f"floor_{job}", big)]) / statistics.median(
                r["wall_s"] for r in results[(f"floor_{job}", small)])
            print(f"{job}: {small:,} -> {big:,} messages ({big / small:.0f}x): Spark time x{grow:.2f}, "
                  f"SQL floor x{floor_grow:.2f}")


if __name__ == "__main__":
    main()
