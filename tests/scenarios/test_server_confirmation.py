"""``create_app(..., confirmation=...)``: final states are confirmed, the retry loop lives with the app."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import httpx
import pytest
import sqlalchemy as sa
from openroute.confirmation import ConfirmationService, DefaultConfirmationCallback, DelegateConfirmationCallback
from openroute.persistence import MessageStore

from openroute import Exchange, Route, RouteRegistry
from openroute.config import load_config
from openroute.definitions.errors import BusinessError, ConfigurationError
from openroute.engine import Engine, EngineSettings
from openroute.server import create_app


def _refuse_odd(exchange: Exchange) -> None:
    if exchange.payload.endswith('1}'):
        raise BusinessError("ODD", "odd orders are refused")


async def test_app_confirms_final_states_once(tmp_path: Path) -> None:
    store = MessageStore(f"sqlite:///{tmp_path / 'app.db'}")
    store.upgrade()
    engine = Engine(store, RouteRegistry([Route("shop", "order", [_refuse_odd])]),
                    EngineSettings(repoll_interval=None, node_id="app-test"))
    service = ConfirmationService(store, DefaultConfirmationCallback())
    app = create_app(engine, confirmation=service, confirmation_interval=0.05)
    async with app.router.lifespan_context(app), httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://node") as client:
        for n in (1, 2):
            answer = await client.post("/api/shop/order", json={"n": n},
                                       headers={"X-Source-System": "SHOP", "X-Correlation-Id": f"o-{n}"})
            assert answer.status_code == 202, answer.text
        deadline = time.monotonic() + 20  # the confirmation loop commits on its own: poll the store, bounded
        while True:
            with store.engine.connect() as connection:
                rows = connection.execute(sa.text(
                    "select m.correlation_id, c.outcome_state, c.status, c.attempts from confirmation c "
                    "join message m on m.id = c.message_id order by m.correlation_id")).all()
            if len(rows) == 2 and all(r.status == "SENT" for r in rows):
                break
            assert time.monotonic() < deadline, rows
            await asyncio.sleep(0.02)
    assert [tuple(r) for r in rows] == [("o-1", "FAILED", "SENT", 1), ("o-2", "OK", "SENT", 1)]
    assert app.state.confirmation is service
    store.dispose()


def test_confirmation_section_of_the_config() -> None:
    assert isinstance(load_config().confirmations.callback(), DefaultConfirmationCallback)
    delegate = load_config(None, {"confirmations": {"systems": {
        "CRM": {"soap": "http://127.0.0.1:9/ws"}, "ERP": {"http": "http://127.0.0.1:9/confirm"}}}}
    ).confirmations.callback()
    assert isinstance(delegate, DelegateConfirmationCallback)
    assert delegate.confirmed_systems() == {"CRM", "ERP"}
    for bad in ({"systems": ["CRM"]}, {"systems": {"CRM": {"ftp": "x"}}}, {"systems": {"CRM": {"http": "not a url"}}}):
        with pytest.raises(ConfigurationError, match="confirmations"):
            load_config(None, {"confirmations": bad})
