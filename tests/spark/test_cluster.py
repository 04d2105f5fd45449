"""The Spark commands unchanged on a real Spark standalone cluster (a master and a worker started from the installed
PySpark's ``spark-class``), against PostgreSQL: audit, reprocess plan + apply, archive, each ``openroute spark``
command given ``--master spark://...``, run one after the other in one child process that holds one Spark
application on the cluster (:mod:`tests.spark.cluster_driver`). In CI a missing Java, driver or PostgreSQL is a
failure."""

from __future__ import annotations

import json
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
from openroute.persistence import MessageState, MessageStore
from openroute.persistence.models import message_transition_table

from tests.spark.cluster_driver import ANSWER
from tests.spark.processes import JVM_OPTIONS, ROOT, child_env
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
    """A running Spark standalone master and its worker (started; :meth:`wait_until` says when it registered)."""

    url: str
    status_url: str
    folder: Path
    processes: dict[str, subprocess.Popen[bytes]]

    def alive_workers(self) -> int | None:
        """How many workers the master counts alive (None while its status page does not answer yet)."""
        try:
            status = httpx.get(self.status_url, timeout=2.0).json()
        except (httpx.HTTPError, ValueError):  # not serving yet
            return None
        return sum(1 for w in status.get("workers", []) if w.get("state") == "ALIVE")

    def wait_until(self, ready: Callable[[int | None], bool], what: str, deadline: float) -> None:
        """Poll the master's status page until ``ready(alive_workers())`` (bounded by ``deadline``, a monotonic
        time; fails at once when the master or the worker ends)."""
        while not ready(self.alive_workers()):  # the master's own status page: no event to await from outside
            for name, process in self.processes.items():
                if process.poll() is not None:
                    raise AssertionError(f"the Spark {name} ended ({process.returncode}): "
                                         f"{(self.folder / f'{name}.log').read_text()[-2000:]}")
            if time.monotonic() > deadline:
                raise AssertionError(f"{what} within {START_TIMEOUT} s: "
                                     f"{(self.folder / 'worker.log').read_text()[-2000:]}")
            time.sleep(0.5)


def _start(argv: list[str], log: Path) -> subprocess.Popen[bytes]:
    # the master's and the worker's JVMs (spark-class reads $SPARK_DAEMON_JAVA_OPTS for them, not $SPARK_SUBMIT_OPTS)
    # only route a few small jobs: the first JIT tier, like the children's drivers
    daemon_options = f"{os.environ.get('SPARK_DAEMON_JAVA_OPTS', '')} {JVM_OPTIONS}".strip()
    env = child_env({"SPARK_LOCAL_IP": "127.0.0.1", "SPARK_NO_DAEMONIZE": "1",
                     "SPARK_DAEMON_JAVA_OPTS": daemon_options})
    with log.open("wb") as out:
        return subprocess.Popen([str(spark_class()), *argv], cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)


@pytest.fixture(scope="module")
def cluster(spark_installed: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandaloneCluster]:
    """Master + one worker (2 cores, 1 GiB) on loopback for this module's tests, given once the master serves (the
    worker registers while the application's driver starts: see :func:`application`); both stopped after."""
    folder = tmp_path_factory.mktemp("standalone")
    port, ui, worker_ui = _free_port(), _free_port(), _free_port()
    master = _start(["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", str(port),
                     "--webui-port", str(ui)], folder / "master.log")
    worker = _start(["org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1", "--cores", "2", "--memory",
                     "1g", "--webui-port", str(worker_ui), "--work-dir", str(folder / "work"),
                     f"spark://127.0.0.1:{port}"], folder / "worker.log")
    running = StandaloneCluster(f"spark://127.0.0.1:{port}", f"http://127.0.0.1:{ui}/json/", folder,
                                {"master": master, "worker": worker})
    try:
        running.wait_until(lambda alive: alive is not None, "the master did not serve its status page",
                           time.monotonic() + START_TIMEOUT)
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


class ClusterApplication:
    """A :mod:`tests.spark.cluster_driver` child: one Spark application on the cluster running ``openroute spark``
    commands one after the other."""

    def __init__(self, master: str, folder: Path) -> None:
        self.folder = folder
        command = [sys.executable, "-m", "tests.spark.cluster_driver", master, str(folder / "spark.log")]
        with (folder / "driver.err").open("wb") as err:
            self.process = subprocess.Popen(command, cwd=ROOT, env=child_env(), stdin=subprocess.PIPE,
                                            stdout=subprocess.PIPE, stderr=err, text=True, start_new_session=True)
        self._answers: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            if line.startswith(ANSWER):
                self._answers.put(line[len(ANSWER):])
        self._answers.put(None)  # stdout closed: the child ended

    def spark(self, argv: list[str], ok: tuple[int, ...] = (0,)) -> dict[str, Any]:
        """Run ``openroute spark <argv>`` in the application; fails with its output when its exit status is not in
        ``ok`` (or the child ends or is silent for :data:`JOB_TIMEOUT` s). Returns its status, stdout and stderr."""
        assert self.process.stdin is not None
        command = ["spark", *argv, "--spark-log", str(self.folder / "spark.log")]
        self.process.stdin.write(json.dumps(command) + "\n")
        self.process.stdin.flush()
        try:
            line = self._answers.get(timeout=JOB_TIMEOUT)
        except queue.Empty:
            raise AssertionError(f"openroute spark {argv[0]} did not end within {JOB_TIMEOUT} s") from None
        if line is None:
            raise AssertionError(f"the cluster application ended ({self.process.wait()}) during openroute spark "
                                 f"{argv[0]}: {(self.folder / 'driver.err').read_text()[-3000:]}")
        done: dict[str, Any] = json.loads(line)
        assert done["status"] in ok, f"openroute spark {argv[0]} exited {done['status']}: {done['stderr'][-3000:]}"
        return done

    def stop(self) -> None:
        """End the child: stdin closed, it stops the session and exits; killed when it does not in 60 s."""
        assert self.process.stdin is not None
        self.process.stdin.close()
        try:
            self.process.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(30)


@pytest.fixture
def application(cluster: StandaloneCluster, tmp_path: Path) -> Iterator[ClusterApplication]:
    """One Spark application on the cluster for the test's jobs, given once the worker is registered (the driver's
    JVM starts meanwhile: the two start-ups overlap); stopped after."""
    started = time.monotonic()
    running = ClusterApplication(cluster.url, tmp_path)
    try:
        cluster.wait_until(lambda alive: bool(alive), "no worker registered with the master", started + START_TIMEOUT)
        yield running
    finally:
        running.stop()


@pytest.mark.slow
@pytest.mark.timeout(1500)  # three jobs through a cluster, one driver JVM and its executors started once
def test_audit_reprocess_and_archive_run_unchanged_on_a_standalone_cluster(
    cluster: StandaloneCluster, application: ClusterApplication, postgres_url: str, tmp_path: Path
) -> None:
    ids = reprocess_store(postgres_url)
    common = ["--database-url", postgres_url, "--master", cluster.url, "--partitions", "2"]

    audit = tmp_path / "audit"
    # exit 1: a consistency check found something (this store has a FAILED parent of a FAILED child, on purpose)
    application.spark(["audit", *common, "--out", str(audit)], ok=(0, 1))
    totals = json.loads((audit / "summary.json").read_text())["totals"]
    assert totals["messages"] == len(ids) and totals["by_state"] == {"CANCEL": 1, "FAILED": 8, "OK": 2,
                                                                     "PARTLY_FAILED": 1}, totals
    assert (audit / "report.html").is_file()

    plan = tmp_path / "plan"
    application.spark(["reprocess", *common, "--out", str(plan), "--job-id", "cluster", "--apply"])
    store = MessageStore(postgres_url)
    for name in ("f_restart", "f_plain", "f_business", "parent", "f_old", "f_other_source"):
        assert store.get(ids[name]).state is S.PARTLY_FAILED, name
    assert store.get(ids["f_obsolete"]).state is S.SKIPPED
    t = message_transition_table.c
    with store.engine.connect() as connection:
        written = connection.execute(sa.select(sa.func.count()).where(t.cause == "reprocess:cluster")).scalar_one()
    assert written == 7, "each planned message changed once, through the cluster's executors' plan"

    to = tmp_path / "archive"
    application.spark(["archive", *common, "--keep", "OK=1h,FAILED=1h,SKIPPED=1h", "--to", str(to)])
    for name in ("ok_newer", "ok_older"):  # final since 2024
        assert store.get(ids[name]) is None, f"{name} was archived and deleted"
    assert store.get(ids["child"]) is not None, "a FAILED child stays while its restarted parent is not final"
    assert any((to / "message").rglob("*.parquet")), "the archive holds Parquet files"
    assert store.get(ids["f_obsolete"]) is not None, "SKIPPED by the job a moment ago: younger than 1 h, kept"
    assert store.get(ids["f_plain"]) is not None, "PARTLY_FAILED is not final: it stays"
    store.dispose()
