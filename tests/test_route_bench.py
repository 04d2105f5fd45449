"""benchmarks/route_bench.py end to end, tiny: one repetition of 40 messages through the node (`openroute run`) and
through its floor on SQLite, call records on, then the paced load. It checks that the benchmark still runs against
the code it measures and that each side did the whole work (the script itself stops unless every message is OK with
its call OK, its confirmation SENT and its call record written), not how fast."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_the_route_benchmark_runs_node_and_floor_and_the_paced_load() -> None:
    done = subprocess.run(
        [sys.executable, "benchmarks/route_bench.py", "--count", "40", "--repeat", "1", "--databases", "sqlite",
         "--records", "on", "--warm-up", "10", "--paced-count", "20", "--timeout", "120"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    runs = [line for line in done.stdout.splitlines() if line.startswith("  rep 1 ")]
    assert sorted(line.split()[5] for line in runs) == ["floor", "node"], done.stdout
    assert all("0 refused" in line and "paced at" in line for line in runs), done.stdout
    assert "node / floor" in done.stdout and "open loop (20 messages)" in done.stdout, done.stdout
