r"""Where a warm Spark command's time goes: SQL executions, Spark jobs, tasks and the executors' CPU of each command.

    flock /work/bench.lock python benchmarks/spark_time.py [--port 15029]

Starts a Spark Connect server (``local[*]``) with its event log on, then runs each command twice against it, warm
(the first run warms the server: classes, the JDBC driver), and reads the lines the second run added to the event
log: ``SparkListenerSQLExecutionStart`` (SQL executions), ``SparkListenerJobStart`` (jobs), ``SparkListenerTaskEnd``
(tasks, and the sum of their ``Executor CPU Time``); the client's CPU is the command's own process's. The commands
are the reprocess plan of the 100k and 1M stores and the audit of the 100k store that ``benchmarks/spark_bench.py``
generates (run it first: ``openroute_spark_bench_<size>`` must exist). Prints one table row per command.
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from openroute.spark.connect import ConnectServer

DATABASE_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/openroute_spark_bench_{}"
#: (label, store size, the ``openroute spark`` arguments; ``{out}`` an empty folder of the run)
COMMANDS = (("reprocess plan, 100k messages", 100_000, ["reprocess", "--out", "{out}", "--job-id", "timing"]),
            ("reprocess plan, 1M messages", 1_000_000, ["reprocess", "--out", "{out}", "--job-id", "timing"]),
            ("audit, 100k messages", 100_000, ["audit", "--out", "{out}"]))


def _events(folder: Path) -> list[str]:
    return [line for path in sorted(folder.iterdir()) if path.is_file() for line in path.read_text().splitlines()]


def _measure(server: ConnectServer, events: Path, size: int, arguments: list[str]) -> dict[str, Any]:
    before = len(_events(events))
    with tempfile.TemporaryDirectory() as out:
        command = [sys.executable, "-m", "openroute", "spark", *(a.format(out=f"{out}/o") for a in arguments),
                   "--database-url", DATABASE_URL.format(size), "--remote", server.remote]
        start_cpu = resource.getrusage(resource.RUSAGE_CHILDREN)
        started = time.perf_counter()
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        wall = time.perf_counter() - started
        end_cpu = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode not in (0, 1):  # the audit exits 1 when a check fails (the generated store has stuck messages)
        raise SystemExit(f"{' '.join(command)} failed: {done.stderr[-500:]}")
    time.sleep(3)  # the event log is written by the server's listener thread: give it its flush (no event to wait on)
    added = [json.loads(line) for line in _events(events)[before:]]
    kinds = [event.get("Event", "") for event in added]
    tasks = [event for event in added if event.get("Event") == "SparkListenerTaskEnd"]
    return {"sql": sum(1 for kind in kinds if kind.endswith("SparkListenerSQLExecutionStart")),
            "jobs": kinds.count("SparkListenerJobStart"), "tasks": len(tasks),
            "executor_cpu": sum((t.get("Task Metrics") or {}).get("Executor CPU Time", 0) for t in tasks) / 1e9,
            "client_cpu": (end_cpu.ru_utime - start_cpu.ru_utime) + (end_cpu.ru_stime - start_cpu.ru_stime),
            "wall": wall}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, default=15029, help="the Connect server's port (default 15029)")
    args = parser.parse_args()
    events = Path(tempfile.mkdtemp(prefix="openroute-spark-events-"))
    server = ConnectServer(port=args.port)
    server.start(config={"spark.eventLog.enabled": "true", "spark.eventLog.dir": f"file://{events}",
                         "spark.eventLog.compress": "false", "spark.eventLog.rolling.enabled": "false"})
    try:
        print("| command (warm) | SQL executions | Spark jobs | tasks | executor CPU | client CPU | wall |")
        for label, size, arguments in COMMANDS:
            _measure(server, events, size, arguments)  # warms the server for this command
            m = _measure(server, events, size, arguments)
            print(f"| {label} | {m['sql']} | {m['jobs']} | {m['tasks']} | {m['executor_cpu']:.1f} s | "
                  f"{m['client_cpu']:.1f} s | {m['wall']:.1f} s |", flush=True)
    finally:
        server.stop()
        shutil.rmtree(events, ignore_errors=True)


if __name__ == "__main__":
    main()
