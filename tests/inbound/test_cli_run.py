"""``openroute run`` in a real process: serves the given routes, with credentials from the auth config."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import sqlalchemy as sa

from tests.inbound.test_uvicorn import free_port

ROOT = Path(__file__).resolve().parents[2]


def test_run_serves_routes_with_auth(tmp_path: Path) -> None:
    config = tmp_path / "auth.json"
    config.write_text(json.dumps({
        "sourceSystems": {"CRM": {"basic": {"username": "crm", "password": "crm-secret"}}},
        "admins": [{"username": "ops", "password": "ops-secret"}],
    }))
    database = tmp_path / "run.db"
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "openroute", "run", "--port", str(port), "--database-url", f"sqlite:///{database}",
         "--routes", "tests.inbound.sample_routes:registry", "--auth-config", str(config)],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env={**os.environ},
    )
    lines: queue.Queue[str] = queue.Queue()
    reader = threading.Thread(target=lambda: [lines.put(line) for line in process.stdout], daemon=True)
    reader.start()
    output = []
    try:
        while True:
            line = lines.get(timeout=30)
            output.append(line)
            if "Uvicorn running" in line:
                break
        assert "serving 1 routes of tests.inbound.sample_routes:registry" in "".join(output)
        base = f"http://127.0.0.1:{port}"
        denied = httpx.post(f"{base}/api/orders/create", json={"a": 1})
        assert denied.status_code == 401
        accepted = httpx.post(f"{base}/api/orders/create", json={"a": 1}, auth=("crm", "crm-secret"))
        assert accepted.status_code == 202, accepted.text
        soap = httpx.post(
            f"{base}/soap/orders", auth=("crm", "crm-secret"), headers={"Content-Type": "text/xml"},
            content=('<e:Envelope xmlns:e="http://schemas.xmlsoap.org/soap/envelope/"><e:Body>'
                     '<o:create xmlns:o="urn:openroute:service:orders"/></e:Body></e:Envelope>'),
        )
        assert soap.status_code == 200, soap.text
        counts = httpx.get(f"{base}/admin/counts", auth=("ops", "ops-secret")).json()
        assert counts["total"] == 2
    finally:
        process.send_signal(signal.SIGINT)
        process.wait(30)
    reader.join(10)
    while not lines.empty():
        output.append(lines.get_nowait())
    assert "Shutting down" in "".join(output) and "crm-secret" not in "".join(output)
    engine = sa.create_engine(f"sqlite:///{database}")
    with engine.connect() as connection:
        assert connection.execute(sa.text("select count(*) from message")).scalar_one() == 2
    engine.dispose()


def test_run_without_routes_module_is_a_clear_error(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "openroute", "run", "--routes", "no_such_module:registry"],
        cwd=tmp_path, capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 2 and "cannot import routes module 'no_such_module'" in result.stderr
