"""A long-lived Spark Connect server for the store: the jobs start in about a second instead of a JVM each time.

PySpark 4 ships the Connect server (its jar and ``sbin/start-connect-server.sh``); ``openroute spark connect
start`` runs it in the background with the JDBC drivers on its class path, and every ``openroute spark`` job
given ``--remote sc://host:port`` (or ``$SPARK_REMOTE``) runs on it::

    openroute spark connect start                 # sc://127.0.0.1:15002, local[*], logs in the state folder
    openroute spark audit --remote sc://127.0.0.1:15002 --out audit-today
    openroute spark connect status                # running (pid 4242) on sc://127.0.0.1:15002
    openroute spark connect stop

The client side needs ``pip install 'openroute[spark-connect]'`` (pandas, pyarrow, grpcio...). The server
reads the store and writes the jobs' output folders itself: paths are paths on its machine (the same one for
``start``). Errors raise :class:`~openroute.spark.session.SparkSetupError` with one line.
"""

from __future__ import annotations

import os
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from openroute.spark.session import SparkSetupError, driver_jars, java_problem

#: the Connect server's default port (Spark's own default)
DEFAULT_PORT = 15002

#: environment variable for the folder holding the server's pid file and logs
STATE_ENV = "OPENROUTE_SPARK_CONNECT_DIR"


@dataclass(frozen=True)
class ConnectServer:
    """Where a Connect server of this machine listens and keeps its pid file and logs."""

    port: int = DEFAULT_PORT
    host: str = "127.0.0.1"
    state_dir: Path | None = None

    @property
    def remote(self) -> str:
        """The ``sc://`` URL the jobs take as ``--remote``."""
        return f"sc://{self.host}:{self.port}"

    @property
    def folder(self) -> Path:
        """The folder of the pid file and the server's log (``$OPENROUTE_SPARK_CONNECT_DIR`` or the temp folder)."""
        given = self.state_dir or os.environ.get(STATE_ENV)
        base = Path(given) if given else Path(tempfile.gettempdir()) / f"openroute-spark-connect-{os.getuid()}"
        return base / str(self.port)

    def listening(self) -> bool:
        """True when something accepts connections on the port."""
        try:
            with socket.create_connection((self.host, self.port), timeout=0.5):
                return True
        except OSError:
            return False

    def pid(self) -> int | None:
        """The server's process id from its pid file, or None when it is not running."""
        files = sorted(self.folder.glob("*.pid"))
        if not files:
            return None
        try:
            pid = int(files[0].read_text().strip())
            os.kill(pid, 0)
        except (ValueError, ProcessLookupError, PermissionError):
            return None
        return pid

    def _environment(self) -> dict[str, str]:
        home = _spark_home()
        folder = self.folder
        folder.mkdir(parents=True, exist_ok=True)
        from openroute.spark.session import _conf_dir

        return {**os.environ, "SPARK_HOME": str(home), "SPARK_PID_DIR": str(folder), "SPARK_LOG_DIR": str(folder),
                "SPARK_IDENT_STRING": "openroute", "SPARK_CONF_DIR": str(_conf_dir("warn"))}

    def start(self, master: str = "local[*]", config: dict[str, str] | None = None, wait: float = 120.0) -> int:
        """Start the server in the background and wait until it listens; return its pid.

        Raises :class:`SparkSetupError` when Java or the server is missing, the port is taken by another
        process, or the server does not listen within ``wait`` seconds (its log is named)."""
        problem = java_problem()
        if problem:
            raise SparkSetupError(problem)
        running = self.pid()
        if running is not None and self.listening():
            return running
        if self.listening():
            raise SparkSetupError(f"port {self.port} is taken by another process: give another --port")
        settings = {"spark.connect.grpc.binding.port": str(self.port), "spark.sql.session.timeZone": "UTC",
                    "spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "8", **(config or {})}
        command = [str(_spark_home() / "sbin" / "start-connect-server.sh"), "--master", master]
        jars = driver_jars()
        if jars:
            command += ["--jars", ",".join(str(j) for j in jars)]
        for key, value in settings.items():
            command += ["--conf", f"{key}={value}"]
        done = subprocess.run(command, env=self._environment(), capture_output=True, text=True, check=False)  # noqa: S603  our own script, arguments from settings
        if done.returncode != 0:
            raise SparkSetupError(f"the Connect server did not start: {(done.stderr or done.stdout).strip()[:300]}")
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            pid = self.pid()
            if pid is not None and self.listening():
                return pid
            if pid is None and time.monotonic() > deadline - wait + 5:
                break  # the daemon wrote no pid (or died) within 5 s
            time.sleep(0.25)  # polling a port another process opens: there is no event to wait for
        raise SparkSetupError(f"the Connect server is not listening on {self.remote}: see {self.log() or self.folder}")

    def stop(self) -> bool:
        """Stop the server started by :meth:`start`; False when none was running."""
        if self.pid() is None:
            return False
        subprocess.run([str(_spark_home() / "sbin" / "stop-connect-server.sh")], env=self._environment(),  # noqa: S603  our own script
                       capture_output=True, check=False)
        deadline = time.monotonic() + 30
        while self.listening() and time.monotonic() < deadline:
            time.sleep(0.25)  # the JVM closes its port as it exits: no event to wait for
        return True

    def log(self) -> Path | None:
        """The server's log file, when there is one."""
        logs = sorted(self.folder.glob("*.out"))
        return logs[-1] if logs else None

    def status(self) -> str:
        """One line: running (pid, URL) or not running."""
        pid = self.pid()
        if pid is not None and self.listening():
            return f"running (pid {pid}) on {self.remote}; log {self.log()}"
        return f"not running on {self.remote}"


def _spark_home() -> Path:
    try:
        import pyspark
    except ImportError:
        raise SparkSetupError("PySpark is not installed: pip install 'openroute[spark-connect]'") from None
    home = Path(pyspark.__file__).parent
    if not (home / "sbin" / "start-connect-server.sh").is_file():
        raise SparkSetupError(f"no Spark Connect server in {home}: install PySpark 4 (openroute[spark-connect])")
    return home
