"""The Spark commands unchanged on a real Spark standalone cluster (a master and a worker started from the installed
PySpark's ``spark-class``), against PostgreSQL: audit, reprocess plan + apply, archive, each ``openroute spark``
as a child process given ``--master spark://...``. In CI a missing Java, driver or PostgreSQL is a failure."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import sqlalchemy as sa
from openroute.persistence import MessageState, MessageStore
from openroute.persistence.models import message_transition_table

from tests.spark.processes import ROOT, child_env
from tests.spark.stores import reprocess_store

S = MessageState

#: how long the master and the worker may take to start and register, and one job to run, on a busy 2-core machine
START_TIMEOUT = 120.0
JOB_TIMEOUT = 600.0


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def spark_class() -> Path:
    """The installed PySpark's ``bin/spark-class`` (what ``start-master.sh`` / ``start-worker.sh`` run)."""
    import pyspark

    return Path(pyspark.__file__).parent / "bin" / "spark-class"


@dataclass
class StandaloneCluster:
    """A running Spark standalone master with one registered worker."""

    url: str
    status_url: str
    processes: list[subprocess.Popen[bytes]]

    def alive_workers(self) -> int:
        try:
            status = httpx.get(self.status_url, timeout=2.0).json()
        except (httpx.HTTPError, ValueError):  # not serving yet
            return 0
        return sum(1 for w in status.get("workers", []) if w.get("state") == "ALIVE")


def _start(argv: list[str], log: Path) -> subprocess.Popen[bytes]:
    env = child_env({"SPARK_LOCAL_IP": "127.0.0.1", "SPARK_NO_DAEMONIZE": "1"})
    with log.open("wb") as out:
        return subprocess.Popen([str(spark_class()), *argv], cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)


@pytest.fixture(scope="module")
def cluster(spark_installed: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandaloneCluster]:
    """Master + one worker (2 cores, 1 GiB) on loopback for this module's tests; both stopped after."""
    folder = tmp_path_factory.mktemp("standalone")
    port, ui, worker_ui = _free_port(), _free_port(), _free_port()
    master = _start(["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", str(port),
                     "--webui-port", str(ui)], folder / "master.log")
    worker = _start(["org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1", "--cores", "2", "--memory",
                     "1g", "--webui-port", str(worker_ui), "--work-dir", str(folder / "work"),
                     f"spark://127.0.0.1:{port}"], folder / "worker.log")
    running = StandaloneCluster(f"spark://127.0.0.1:{port}", f"http://127.0.0.1:{ui}/json/", [master, worker])
    try:
        deadline = time.monotonic() + START_TIMEOUT
        while running.alive_workers() < 1:  # bounded: the master's own status page says when the worker is in
            for process, name in ((master, "master"), (worker, "worker")):
                if process.poll() is not None:
                    raise AssertionError(f"the Spark {name} ended ({process.returncode}): "
                                         f"{(folder / f'{name}.log').read_text()[-2000:]}")
            if time.monotonic() > deadline:
                raise AssertionError(f"no worker registered with the master within {START_TIMEOUT} s: "
                                     f"{(folder / 'worker.log').read_text()[-2000:]}")
            time.sleep(0.5)
        yield running
    finally:
        for process in (worker, master):
            try:
                os.killpg(process.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        for process in (worker, master):
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(30)


def _spark(argv: list[str], folder: Path, ok: tuple[int, ...] = (0,)) -> subprocess.CompletedProcess[str]:
    """``openroute spark <argv>`` as a child; fails with its output when its exit status is not in ``ok``."""
    command = [sys.executable, "-m", "openroute.cli", "spark", *argv, "--spark-log", str(folder / "spark.log")]
    done = subprocess.run(command, cwd=ROOT, env=child_env(), capture_output=True, text=True, timeout=JOB_TIMEOUT,
                          check=False)
    assert done.returncode in ok, f"openroute spark {argv[0]} exited {done.returncode}: {done.stderr[-3000:]}"
    return done


@pytest.mark.slow
@pytest.mark.timeout(1500)  # three JVM jobs through a cluster; about a minute each on a quiet 2-core machine
def test_audit_reprocess_and_archive_run_unchanged_on_a_standalone_cluster(
    cluster: StandaloneCluster, postgres_url: str, tmp_path: Path
) -> None:
    ids = reprocess_store(postgres_url)
    common = ["--database-url", postgres_url, "--master", cluster.url, "--partitions", "2"]

    audit = tmp_path / "audit"
    # exit 1: a consistency check found something (this store has a FAILED parent of a FAILED child, on purpose)
    _spark(["audit", *common, "--out", str(audit)], tmp_path, ok=(0, 1))
    totals = json.loads((audit / "summary.json").read_text())["totals"]
    assert totals["messages"] == len(ids) and totals["by_state"] == {"CANCEL": 1, "FAILED": 8, "OK": 2,
                                                                     "PARTLY_FAILED": 1}, totals
    assert (audit / "report.html").is_file()

    plan = tmp_path / "plan"
    _spark(["reprocess", *common, "--out", str(plan), "--job-id", "cluster", "--apply"], tmp_path)
    store = MessageStore(postgres_url)
    for name in ("f_restart", "f_plain", "f_business", "parent", "f_old", "f_other_source"):
        assert store.get(ids[name]).state is S.PARTLY_FAILED, name
    assert store.get(ids["f_obsolete"]).state is S.SKIPPED
    t = message_transition_table.c
    with store.engine.connect() as connection:
        written = connection.execute(sa.select(sa.func.count()).where(t.cause == "reprocess:cluster")).scalar_one()
    assert written == 7, "each planned message changed once, through the cluster's executors' plan"

    to = tmp_path / "archive"
    _spark(["archive", *common, "--keep", "OK=1h,FAILED=1h,SKIPPED=1h", "--to", str(to)], tmp_path)
    for name in ("ok_newer", "ok_older"):  # final since 2024
        assert store.get(ids[name]) is None, f"{name} was archived and deleted"
    assert store.get(ids["child"]) is not None, "a FAILED child stays while its restarted parent is not final"
    assert any((to / "message").rglob("*.parquet")), "the archive holds Parquet files"
    assert store.get(ids["f_obsolete"]) is not None, "SKIPPED by the job a moment ago: younger than 1 h, kept"
    assert store.get(ids["f_plain"]) is not None, "PARTLY_FAILED is not final: it stays"
    store.dispose()
