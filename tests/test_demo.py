"""``openroute demo`` shows every state, and the store agrees with what it printed."""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

from persistence import MessageState
from routes.demo import run_demo

S = MessageState


async def test_demo_drives_messages_through_every_state() -> None:
    out = io.StringIO()
    report = await run_demo(out)
    assert report.states_seen == set(MessageState)
    # the final states were read back from the store at the end of the run
    assert sorted(report.final_states.values()) == sorted(
        [S.OK] * 9 + [S.FAILED, S.SKIPPED, S.CANCEL]
    )
    paths = {report.labels.get(i, ""): path for i, path in report.paths.items()}
    assert paths["setCustomer C-200"] == [S.NEW, S.PROCESSING, S.PARTLY_FAILED, S.PROCESSING, S.OK]
    assert paths["setCustomer C-400 MSG2"][-1] is S.SKIPPED
    assert S.POSTPONED in paths["changeTariff C-300 (newer)"]
    assert paths["createOrder O-700"] == [S.NEW, S.PROCESSING, S.WAITING_FOR_CHILDREN, S.OK]
    assert "every state" in out.getvalue()


def test_demo_command_exits_zero(tmp_path: Path) -> None:
    result = subprocess.run([sys.executable, "-m", "openroute", "demo"], cwd=tmp_path, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "states seen: 9 of 9 - every state" in result.stdout
    assert list(tmp_path.iterdir()) == []  # the temporary store is gone
