"""``openroute demo`` shows every state, and the store agrees with what it printed."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import sqlalchemy as sa
from openroute.persistence import MessageState
from openroute_reference.demo import _shown, run_demo

S = MessageState


def _rows(database: Path) -> dict[str, dict[str, object]]:
    engine = sa.create_engine(f"sqlite:///{database}")
    try:
        with engine.connect() as connection:
            rows = connection.execute(sa.text(
                "select id, correlation_id, state, failed_count, last_error_code, business_errors, parent_id "
                "from message")).mappings().all()
    finally:
        engine.dispose()
    return {row["correlation_id"]: dict(row) for row in rows}


async def test_demo_drives_messages_through_every_state(tmp_path: Path) -> None:
    out = io.StringIO()
    report = await run_demo(out, database_url=f"sqlite:///{tmp_path / 'demo.db'}")
    assert report.states_seen == set(MessageState)
    paths = {report.labels.get(i, ""): path for i, path in report.paths.items()}
    assert paths["setCustomer C-200"] == [S.NEW, S.PROCESSING, S.PARTLY_FAILED, S.PROCESSING, S.OK]
    assert paths["setCustomer C-400 MSG2"][-1] is S.SKIPPED
    assert S.POSTPONED in paths["changeTariff C-300 (newer)"]
    assert paths["createOrder O-700"] == [S.NEW, S.PROCESSING, S.WAITING_FOR_CHILDREN, S.OK]
    assert paths["setCustomer C-800"] == [S.NEW] + [S.PROCESSING, S.PARTLY_FAILED] * 4 + [S.PROCESSING, S.FAILED]
    assert "every state" in out.getvalue()
    assert "event on crm-events: crm/setCustomer demo-9 OK" in out.getvalue()  # from a queue, its outcome told

    # the store tells the same story as the transitions that were printed
    rows = _rows(tmp_path / "demo.db")
    assert {c: r["state"] for c, r in rows.items()} == {
        "demo-1": "OK", "demo-2": "OK", "demo-3a": "OK", "demo-3b": "OK", "demo-4a": "OK", "demo-4b": "SKIPPED",
        "demo-4c": "OK", "demo-5": "FAILED", "demo-6": "CANCEL", "demo-8": "FAILED", "demo-7": "OK",
        "demo-7:1": "OK", "demo-7:2": "OK", "demo-9": "OK"}
    assert {report.final_states[int(r["id"])].value for r in rows.values()} == {"OK", "SKIPPED", "FAILED", "CANCEL"}
    assert rows["demo-2"]["failed_count"] == 1  # it was PARTLY_FAILED once before ending OK
    assert rows["demo-4b"]["last_error_code"] == "OBSOLETE"
    assert json.loads(str(rows["demo-5"]["business_errors"]))[0]["code"] == "Client"  # the billing SOAP Fault
    assert (rows["demo-8"]["failed_count"], rows["demo-8"]["last_error_code"]) == (5, "HTTP_503")  # retries spent
    assert rows["demo-7:1"]["parent_id"] == rows["demo-7:2"]["parent_id"] == rows["demo-7"]["id"]


def test_long_retry_paths_are_shortened() -> None:
    assert _shown([S.NEW, S.PROCESSING, S.OK]) == "NEW -> PROCESSING -> OK"
    assert _shown([S.NEW] + [S.PROCESSING, S.POSTPONED] * 3 + [S.PROCESSING, S.OK]) == \
        "NEW -> (PROCESSING -> POSTPONED) x3 -> PROCESSING -> OK"


def test_demo_command_exits_zero(tmp_path: Path) -> None:
    result = subprocess.run([sys.executable, "-m", "openroute", "demo"], cwd=tmp_path, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "states seen: 9 of 9 - every state" in result.stdout
    # issue 42: the demo's own reference app calls its systems through the kit's guard, so nothing warns
    assert "without breaker" not in result.stdout + result.stderr and "WARNING" not in result.stderr
    assert list(tmp_path.iterdir()) == []  # the temporary store is gone


def test_demo_output_piped_into_a_reader_that_leaves_early(tmp_path: Path) -> None:
    demo = subprocess.Popen([sys.executable, "-m", "openroute", "demo"], cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    assert demo.stdout is not None and demo.stderr is not None
    demo.stdout.readline()
    demo.stdout.close()  # like `openroute demo | head -1`
    errors = demo.stderr.read().decode()
    assert demo.wait(120) == 0, errors
    assert "Traceback" not in errors
