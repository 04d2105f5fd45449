"""benchmarks/peers_bench.py end to end, tiny: one repetition of 50 messages per system, every run checked against
its database by the benchmark itself. The peers are the optional ``bench`` extra (not in ``dev``): without them the
test is skipped, in CI too; without PostgreSQL it is skipped, except in CI (``tests/services.py``)."""

from __future__ import annotations

import pytest

from benchmarks import peers_bench
from tests.services import POSTGRES_ADMIN_URL, postgres_problem, require


@pytest.mark.postgres
@pytest.mark.slow
def test_the_peers_benchmark_runs_the_three_systems(capsys: pytest.CaptureFixture[str]) -> None:
    missing = peers_bench.missing_peers(list(peers_bench.SYSTEMS))
    if missing:
        pytest.skip(f"the peers are not installed ({', '.join(missing)}): {peers_bench.INSTALL}")
    require("PostgreSQL", postgres_problem)
    peers_bench.main(["--count", "50", "--repeat", "1", "--senders", "8", "--pool", "4",
                      "--admin-url", POSTGRES_ADMIN_URL])
    out = capsys.readouterr().out
    for name in ("openroute", "PgQueuer", "procrastinate"):
        assert f"rep 1 {name}" in out
    assert "openroute / PgQueuer per repetition" in out
    assert "openroute / procrastinate per repetition" in out
    assert "goal (issue #45)" in out


def test_without_the_peers_it_says_how_to_install_them(monkeypatch: pytest.MonkeyPatch,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(peers_bench, "missing_peers", lambda systems: ["pgqueuer"])
    with pytest.raises(SystemExit) as exit_:
        peers_bench.main(["--count", "50", "--repeat", "1"])
    assert exit_.value.code == 2
    assert "pip install" in capsys.readouterr().err
