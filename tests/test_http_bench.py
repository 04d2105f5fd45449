"""benchmarks/http_bench.py end to end, tiny: one repetition of 60 requests to each of its three servers (the floor,
JSON and SOAP, each a uvicorn process of its own) on a fresh database per run. It checks that the benchmark still
runs against the code it measures (a refactoring of the engine had left it reading a writer that had moved) and that
every request was answered, not how fast; without PostgreSQL that half is skipped, except in CI."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.services import POSTGRES_ADMIN_URL, require_database

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
@pytest.mark.parametrize("database", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def test_the_http_benchmark_runs_its_three_servers(database: str) -> None:
    require_database(database)
    done = subprocess.run(
        [sys.executable, "benchmarks/http_bench.py", "--count", "60", "--repeat", "1", "--databases", database],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
        env={**os.environ, "OPENROUTE_TEST_POSTGRES_URL": POSTGRES_ADMIN_URL},
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    runs = [line for line in done.stdout.splitlines() if line.startswith("  rep 1 ")]
    assert [line.split()[3] for line in runs] == ["floor", "json", "soap"], done.stdout
    assert all(line.rstrip().endswith("errors 0") for line in runs), done.stdout
    assert "ratio to floor" in done.stdout
