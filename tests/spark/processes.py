"""``openroute spark ...`` as a real child process: started in a process group of its own (its JVM with it),
waited on through the lines it prints (bounded, with a clear message), killed with SIGKILL."""

from __future__ import annotations

import os
import queue
import re
import select
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

#: the options of every JVM the Spark tests start: added to ``$SPARK_SUBMIT_OPTS`` (the options spark-submit gives
#: the driver JVM it starts) of every child, given to the run's own SparkSession (tests/spark/conftest.py) and to the
#: cluster's and the Connect server's JVMs. Their JIT stops at the first tier (C1): the jobs are small, and the top
#: tier (C2) spends its CPU compiling for long runs that never come (a child's one job: about 2 s; the run's own
#: session, hundreds of small jobs with ever new plans: 573 s of CPU over the Spark tests with C2, 469 s with C1,
#: the code it runs slower but compiled far less; measured on a 2-core machine beside the rest of the suite). The
#: JVM runs the same code either way, only compiled less. Their heap is collected by the serial collector: on 2 cores
#: the JVM would pick G1, whose concurrent threads and write barriers cost more CPU than these small heaps need (the
#: audit and apply tests in one process: 226 -> 190 s of CPU, 163 -> 147 s wall; one ``openroute spark audit``
#: child 63-66 -> 59 s of CPU; on a ~3x slower 2-core machine). Only the pauses change, never what a job computes.
JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of an ``openroute spark`` child: this one, the work tree first on ``PYTHONPATH``, ``extra``,
    and :data:`JVM_OPTIONS` after any ``$SPARK_SUBMIT_OPTS`` already set."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), **(extra or {})}
    env["SPARK_SUBMIT_OPTS"] = f"{env.get('SPARK_SUBMIT_OPTS', '')} {JVM_OPTIONS}".strip()
    return env


class SparkCli:
    """One ``python -m openroute.cli spark <argv>`` child; its stderr is read line by line as it comes."""

    def __init__(self, argv: list[str], folder: Path, env: dict[str, str] | None = None) -> None:
        self.stdout_path = folder / "child-stdout.txt"
        command = [sys.executable, "-m", "openroute.cli", "spark", *argv,
                   "--spark-log", str(folder / "child-spark.log")]
        with self.stdout_path.open("w") as stdout:
            self.process = subprocess.Popen(
                command, cwd=ROOT, start_new_session=True, stdout=stdout, stderr=subprocess.PIPE, text=True,
                env=child_env(env),
            )
        self.seen: list[str] = []
        self._lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            self._lines.put(line.rstrip("\n"))
        self._lines.put(None)  # end of stderr: the process ended

    def wait_for_line(self, pattern: str, timeout: float) -> str:
        """The first stderr line matching ``pattern``; fails when the child ends first or after ``timeout`` s."""
        wanted = re.compile(pattern)
        deadline = time.monotonic() + timeout
        try:
            while True:
                line = self._lines.get(timeout=max(0.0, deadline - time.monotonic()))
                if line is None:
                    raise AssertionError(f"the child ended (status {self.process.wait()}) without printing "
                                         f"{pattern!r}; stderr: {self.seen}; stdout: {self.stdout_path.read_text()!r}")
                self.seen.append(line)
                if wanted.search(line):
                    return line
        except queue.Empty:
            raise AssertionError(f"no stderr line matching {pattern!r} within {timeout} s; "
                                 f"stderr so far: {self.seen}") from None

    def kill(self) -> None:
        """SIGKILL the child and its JVM (kill -9 of the process group), then reap it."""
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:  # the whole group ended already
            pass
        self.process.wait(30)


def run_in_terminal(argv: list[str], folder: Path, timeout: float) -> tuple[int, bytes]:
    """Run ``openroute spark <argv>`` with a pseudo-terminal as its stdin, stdout and stderr; returns (exit
    status, every byte it wrote there). Fails when it runs longer than ``timeout`` s (it is killed then)."""
    main, terminal = os.openpty()
    command = [sys.executable, "-m", "openroute.cli", "spark", *argv, "--spark-log", str(folder / "child-spark.log")]
    process = subprocess.Popen(command, cwd=ROOT, start_new_session=True, stdin=terminal, stdout=terminal,
                               stderr=terminal, env=child_env())
    os.close(terminal)
    shown = bytearray()
    deadline = time.monotonic() + timeout
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"openroute spark {' '.join(argv)} still runs after {timeout} s; "
                                     f"it wrote: {bytes(shown)!r}")
            ready, _, _ = select.select([main], [], [], left)
            if not ready:
                continue
            try:
                chunk = os.read(main, 65536)
            except OSError:  # EIO: every end of the terminal in the child is closed (it ended)
                break
            if not chunk:
                break
            shown += chunk
        return process.wait(max(1.0, deadline - time.monotonic())), bytes(shown)
    finally:
        os.close(main)
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(30)


def run_in_pipe(argv: list[str], folder: Path, timeout: float) -> subprocess.CompletedProcess[str]:
    """Run ``openroute spark <argv>`` with pipes as its stdout and stderr; returns what it wrote on each. Fails
    when it runs longer than ``timeout`` s (it is killed then)."""
    command = [sys.executable, "-m", "openroute.cli", "spark", *argv, "--spark-log", str(folder / "spark.log")]
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=child_env())
