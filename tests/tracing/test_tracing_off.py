"""Tracing off (the default) makes no spans, stores no trace context and imports nothing of OpenTelemetry; tracing
asked for without the otel extra is a configuration error; the ``[tracing]`` section of openroute.toml."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from openroute.persistence import MessageState, MessageStore
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from openroute.config import TracingConfig, load_config
from openroute.definitions.errors import ConfigurationError
from openroute.runtime import tracing
from tests.tracing.conftest import SENDER_TRACEPARENT, Node, Remote

ROOT = Path(__file__).resolve().parents[2]


def run_python(code: str, tmp_path: Path) -> str:
    """Run ``code`` in a fresh interpreter of this venv (the checkout's packages); its stdout."""
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr
    return done.stdout


async def test_off_no_span_is_made_and_no_traceparent_stored_or_sent(
    node: Node, remote: Remote, store: MessageStore
) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.enable(provider)
    tracing.disable()  # on, then off again: nothing of it stays
    answer = await node.http.post("/api/crm/order", json={"orderId": "off-1"}, headers={
        "X-Source-System": "CRM", "X-Correlation-Id": "off-1", "traceparent": SENDER_TRACEPARENT})
    assert answer.status_code == 202
    await node.engine.wait_idle(10)
    row = store.get(answer.json()["messageId"])
    assert row is not None and row.state is MessageState.OK and row.traceparent is None
    assert exporter.get_finished_spans() == ()
    assert [headers.get("traceparent") for _, headers in remote.seen] == [None, None]  # the call, the confirmation
    provider.shutdown()


def test_off_a_message_goes_through_without_importing_opentelemetry(tmp_path: Path) -> None:
    out = run_python(f"""
        import asyncio, json, sys
        import httpx
        from openroute.persistence import MessageStore
        from openroute.engine import Engine, EngineSettings
        from openroute.definitions.route import Route, RouteRegistry
        from openroute.server import create_app

        async def main():
            store = MessageStore("sqlite:///{tmp_path / 'off.db'}")
            store.create_schema()
            engine = Engine(store, RouteRegistry([Route("crm", "order", [lambda exchange: None])]),
                            EngineSettings(repoll_interval=None))
            app = create_app(engine, manage_engine=False)
            await engine.start()
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as http:
                answer = await http.post("/api/crm/order", json={{}}, headers={{
                    "X-Source-System": "CRM", "traceparent": "{SENDER_TRACEPARENT}"}})
            await engine.wait_idle(10)
            await engine.stop()
            row = store.get(answer.json()["messageId"])
            loaded = sorted(name for name in sys.modules if name.startswith("opentelemetry"))
            print(json.dumps({{"state": row.state.value, "traceparent": row.traceparent, "loaded": loaded}}))

        asyncio.run(main())
    """, tmp_path)
    assert json.loads(out) == {"state": "OK", "traceparent": None, "loaded": []}


def test_tracing_asked_for_without_the_extra_is_a_configuration_error(tmp_path: Path) -> None:
    out = run_python("""
        import json, sys
        sys.modules["opentelemetry"] = None  # the otel extra is not installed
        from openroute.runtime import tracing
        from openroute.config import TracingConfig
        from openroute.definitions.errors import ConfigurationError

        result = {"off": TracingConfig().start()}
        for name, start in (("configure", lambda: TracingConfig(enabled=True).start()), ("enable", tracing.enable)):
            try:
                start()
            except ConfigurationError as error:
                result[name] = str(error)
        result["enabled"] = tracing.ENABLED
        print(json.dumps(result))
    """, tmp_path)
    result = json.loads(out)
    assert result["off"] is False and result["enabled"] is False
    assert result["configure"] == result["enable"] == tracing.MISSING_EXTRA
    assert "pip install -e '.[otel]'" in tracing.MISSING_EXTRA


def test_the_tracing_section_of_the_configuration(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("OPENROUTE_"):
            monkeypatch.delenv(name)
    path = tmp_path / "openroute.toml"
    path.write_text('[tracing]\nenabled = true\nservice_name = "orders-node"\n'
                    'endpoint = "http://127.0.0.1:4318/v1/traces"\nexport_timeout = "3s"\n', encoding="utf-8")
    config = load_config(path).tracing
    assert (config.enabled, config.service_name, config.endpoint) == (True, "orders-node",
                                                                      "http://127.0.0.1:4318/v1/traces")
    assert config.export_timeout.total_seconds() == 3
    assert load_config().tracing == TracingConfig()  # off by default
    monkeypatch.setenv("OPENROUTE_TRACING__ENABLED", "false")
    assert load_config(path).tracing.enabled is False  # the environment over the file
    path.write_text('[tracing]\nenabled = true\nendpoint = "collector:4318"\n', encoding="utf-8")
    with pytest.raises(ConfigurationError, match="endpoint must be an http"):
        load_config(path)
    try:
        assert TracingConfig(enabled=True, endpoint="http://127.0.0.1:9/v1/traces").start() is True
        assert tracing.ENABLED
    finally:
        tracing.disable()  # nothing was traced: the exporter has nothing to send
    assert not tracing.ENABLED
