"""Bare ``openroute run`` in a fresh directory serves the reference routes end to end on SQLite."""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
import sqlalchemy as sa

from tests._support.servers import free_port

SAMPLES = Path(__file__).resolve().parents[2] / "samples"


def _states(database: Path) -> dict[str, str]:
    engine = sa.create_engine(f"sqlite:///{database}")
    try:
        with engine.connect() as connection:
            rows = connection.execute(sa.text("select correlation_id, state from message")).all()
    finally:
        engine.dispose()
    return {correlation: state for correlation, state in rows}


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_bare_run_serves_the_reference_routes_and_stops_on_a_signal(tmp_path: Path, stop: signal.Signals) -> None:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("OPENROUTE_BILLING_URL", "OPENROUTE_MNO_URL")}
    process = subprocess.Popen(
        [sys.executable, "-m", "openroute", "run", "--port", str(port)],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
    )
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in process.stdout], daemon=True).start()
    output: list[str] = []
    try:
        while "Application startup complete" not in "".join(output):
            output.append(lines.get(timeout=60))
        assert "serving 5 routes of openroute_reference:registry" in "".join(output)
        assert "OPENROUTE_BILLING_URL is not set: the routes call the in-process fake billing, mounted at " \
               "/fakes/billing" in "".join(output)
        base = f"http://127.0.0.1:{port}"
        soap = httpx.post(f"{base}/soap/crm", content=(SAMPLES / "setCustomer.soap.xml").read_bytes(),
                          headers={"Content-Type": "text/xml; charset=utf-8", "SOAPAction": '""'})
        assert soap.status_code == 200, soap.text
        order = httpx.post(f"{base}/api/shop/createOrder", content=(SAMPLES / "createOrder.json").read_bytes(),
                           headers={"X-Correlation-Id": "run-2", "X-Source-System": "SHOP",
                                    "Content-Type": "application/json"})
        assert order.status_code == 202, order.text
        deadline = time.monotonic() + 30  # bounded poll of the store the server writes (no event crosses processes)
        while _states(tmp_path / "openroute.db").get("run-2") != "OK" or \
                _states(tmp_path / "openroute.db").get("sample-1") != "OK":
            assert time.monotonic() < deadline, _states(tmp_path / "openroute.db")
            time.sleep(0.05)
        assert _states(tmp_path / "openroute.db") == {"sample-1": "OK", "run-2": "OK", "run-2:1": "OK",
                                                       "run-2:2": "OK"}
        assert httpx.get(f"{base}/health").status_code == 200
        # the fakes the routes called are mounted on the same app
        assert httpx.get(f"{base}/fakes/billing/calls").json()["calls"] == {"C-1": 1}
        assert httpx.get(f"{base}/fakes/mno/calls").json()["calls"] == {"C-1": 1}
        assert httpx.post(f"{base}/fakes/mno/fail", params={"count": "1"}).json()["failures_left"] == 1
    finally:
        process.send_signal(stop)
        code = process.wait(30)
    while not lines.empty():
        output.append(lines.get_nowait())
    # uvicorn shuts down gracefully, then re-raises the signal it caught (exit by the signal, the Unix convention;
    # SIGINT surfaces as KeyboardInterrupt, which the CLI reports as exit code 130)
    assert "Application shutdown complete" in "".join(output) and "Traceback" not in "".join(output)
    assert code in (0, -stop, 128 + stop), "".join(output)
