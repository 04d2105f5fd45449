"""benchmarks/http_bench.py end to end, tiny: one repetition of 60 requests to each of its four servers (JSON and SOAP,
and the floor of each, each a uvicorn process of its own) on a fresh database per run. It checks that the benchmark
still runs against the code it measures (a refactoring of the engine had left it reading a writer that had moved),
that every request was answered, not how fast, and that each floor stored its endpoint's row (the benchmark compares
them and stops when they differ); on PostgreSQL with the database's counters per request. Without PostgreSQL that
half is skipped, except in CI."""

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
def test_the_http_benchmark_runs_its_four_servers(database: str) -> None:
    require_database(database)
    done = subprocess.run(
        [sys.executable, "benchmarks/http_bench.py", "--count", "60", "--repeat", "1", "--databases", database,
         "--counters"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
        env={**os.environ, "OPENROUTE_TEST_POSTGRES_URL": POSTGRES_ADMIN_URL},
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    runs = [line for line in done.stdout.splitlines() if line.startswith("  rep 1 ")]
    assert [line.split()[3] for line in runs] == ["json-floor", "json", "soap-floor", "soap"], done.stdout
    assert all(line.rstrip().endswith("errors 0") for line in runs), done.stdout
    assert "each floor stored its endpoint's row" in done.stdout
    assert "ratio to floor" in done.stdout
    if database == "postgres":  # every run's counters: the rows it stored are among them
        counted = [line for line in done.stdout.splitlines() if line.strip().startswith("message ")]
        assert len(counted) == 4, done.stdout
        assert all("n_tup_ins 1 " in line for line in counted), done.stdout
