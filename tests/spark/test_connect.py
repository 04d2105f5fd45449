"""A real Spark Connect server (openroute/spark/connect.py): started once for the module, the audit run on it
through ``openroute spark audit --remote sc://...`` gives what the local session gives; stopped at the end."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from openroute.spark.audit import audit
from openroute.spark.connect import ConnectServer
from openroute.spark.session import SparkSetupError, build_session
from tests.spark.processes import JVM_OPTIONS, ROOT, child_env
from tests.spark.test_audit import NOW
from tests.spark.test_audit_cli import small_store


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture(scope="module")
def connect_server(spark_installed: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ConnectServer]:
    """A Spark Connect server on a free port (local[2]) for this module's tests; stopped after them."""
    server = ConnectServer(_free_port(), state_dir=tmp_path_factory.mktemp("connect"))
    # its JVM serves one short audit: the first JIT tier, as every openroute spark child (tests/spark/processes.py)
    server.start("local[2]", {"spark.sql.shuffle.partitions": "4", "spark.driver.extraJavaOptions": JVM_OPTIONS})
    try:
        yield server
    finally:
        assert server.stop()
        assert not server.listening() and server.pid() is None


def _spark_cli(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "openroute.cli", "spark", *argv], cwd=ROOT, env=child_env(),
                          capture_output=True, text=True, timeout=600, check=False)


@pytest.mark.timeout(600)  # its time includes the module's server start (a JVM) and the child's own session
def test_an_audit_on_the_connect_server_finds_what_the_local_session_finds(
    connect_server: ConnectServer, spark: Any, sqlite_url: str, tmp_path: Path
) -> None:
    small_store(stuck=True).write(sqlite_url)
    local = audit(spark, sqlite_url, now=NOW, stuck_after="2h", partitions=2).summary()

    done = _spark_cli("audit", "--remote", connect_server.remote, "--database-url", sqlite_url,
                      "--out", str(tmp_path / "remote"), "--now", NOW.isoformat(), "--stuck-after", "2h",
                      "--partitions", "2")
    assert done.returncode == 1, done.stderr  # the planted stuck message fails its check
    assert "spark session ready in " in done.stdout and f"on {connect_server.remote}" in done.stdout
    assert "FAIL stuck: 1 (2)" in done.stdout
    remote = json.loads((tmp_path / "remote" / "summary.json").read_text())
    assert remote["checks"] == local["checks"]
    assert remote["statistics"] == json.loads(json.dumps(local["statistics"], default=str))
    assert remote["totals"] == local["totals"]


def test_connect_status_and_a_remote_that_is_no_connect_url(connect_server: ConnectServer) -> None:
    status = _spark_cli("connect", "status", "--port", str(connect_server.port))
    # the CLI looks in the default state folder: this module's server keeps its own, so it is "not running" there
    assert status.returncode == 0 and f"on sc://127.0.0.1:{connect_server.port}" in status.stdout
    assert connect_server.status().startswith(f"running (pid {connect_server.pid()}) on {connect_server.remote}")
    with pytest.raises(SparkSetupError, match="--remote takes a Spark Connect URL like sc://"):
        build_session(remote="http://127.0.0.1:15002")
