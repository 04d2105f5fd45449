"""``create_app(..., confirmation=...)``: final states are confirmed, the retry loop lives with the app."""

from __future__ import annotations

import asyncio
import logging

import httpx
import pytest
import sqlalchemy as sa
from openroute.confirmation import (
    ConfirmationRequest,
    ConfirmationService,
    DefaultConfirmationCallback,
    DelegateConfirmationCallback,
    ExternalSystemConfirmation,
)
from openroute.persistence import MessageStore, StoredMessage

from openroute import Exchange, Route, RouteRegistry
from openroute.config import load_config
from openroute.definitions.errors import BusinessError, ConfigurationError
from openroute.engine import Engine, EngineSettings
from openroute.server import create_app


def _refuse_odd(exchange: Exchange) -> None:
    if exchange.payload.endswith('1}'):
        raise BusinessError("ODD", "odd orders are refused")


class Recorded(ExternalSystemConfirmation):
    """A configured source system that takes every confirmation (it keeps rows, as a remote system's do)."""

    def __init__(self, source_system: str) -> None:
        super().__init__(source_system)
        self.received: list[tuple[str, str]] = []

    async def confirm(self, request: ConfirmationRequest) -> None:
        self.received.append((request.correlation_id, request.state))


async def _serve(store: MessageStore, service: ConfirmationService,
                 orders: list[tuple[str, str]]) -> None:
    """The app of ``create_app`` confirming through ``service``: each ``(source system, correlation id)`` posted as an
    order, returned once every one is final and its final-state hooks (the confirmation's first) have run."""
    engine = Engine(store, RouteRegistry([Route("shop", "order", [_refuse_odd])]),
                    EngineSettings(repoll_interval=None, node_id="app-test"))
    app = create_app(engine, confirmation=service, confirmation_interval=3600)
    finals: set[int] = set()
    every_final = asyncio.Event()

    async def on_final(message: StoredMessage) -> None:  # registered after the node's hooks: they ran first
        finals.add(message.id)
        if len(finals) == len(orders):
            every_final.set()

    engine.on_final_state(on_final)
    async with app.router.lifespan_context(app), httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://node") as client:
        for n, (system, correlation) in enumerate(orders, 1):
            answer = await client.post("/api/shop/order", json={"n": n},
                                       headers={"X-Source-System": system, "X-Correlation-Id": correlation})
            assert answer.status_code == 202, answer.text
        await asyncio.wait_for(every_final.wait(), 20)
    assert app.state.confirmation is service


def _rows(store: MessageStore) -> list[tuple[object, ...]]:
    with store.engine.connect() as connection:
        return [tuple(r) for r in connection.execute(sa.text(
            "select m.correlation_id, c.outcome_state, c.status, c.attempts from confirmation c "
            "join message m on m.id = c.message_id order by m.correlation_id"))]


async def test_the_log_default_confirms_each_outcome_in_one_line_and_keeps_no_row(
    store: MessageStore, caplog: pytest.LogCaptureFixture,
) -> None:
    service = load_config().confirmations.service(store)  # no [confirmations.systems]: the log
    assert service.durable is False
    caplog.set_level(logging.DEBUG, logger="openroute.confirmation")
    await _serve(store, service, [("SHOP", "o-1"), ("SHOP", "o-2"), ("ERP", "o-3")])
    assert _rows(store) == []
    lines = sorted(r.getMessage() for r in caplog.records if r.name == "openroute.confirmation")
    assert [line.split(" from ")[1] for line in lines] == [
        "SHOP ended FAILED error ODD: odd orders are refused business errors [ODD]", "SHOP ended OK", "ERP ended OK"]
    assert [line.split(" (correlation ")[1].split(")")[0] for line in lines] == ["o-1", "o-2", "o-3"]
    assert await service.sweep_missing() == 0  # the repair sweep makes no rows for it either


async def test_configured_systems_keep_their_rows_and_the_others_are_not_confirmed(
    store: MessageStore, caplog: pytest.LogCaptureFixture,
) -> None:
    shop = Recorded("SHOP")
    service = ConfirmationService(store, DelegateConfirmationCallback([shop]))
    assert service.durable is True
    caplog.set_level(logging.DEBUG, logger="openroute.confirmation")
    await _serve(store, service, [("SHOP", "o-1"), ("SHOP", "o-2"), ("ERP", "o-3"), ("ERP", "o-4")])
    assert _rows(store) == [("o-1", "FAILED", "SENT", 1), ("o-2", "OK", "SENT", 1)]
    assert sorted(shop.received) == [("o-1", "FAILED"), ("o-2", "OK")]
    sent = [r for r in caplog.records if r.getMessage().startswith("confirmation of message")]
    assert [(r.levelno, r.getMessage().split(") ")[1]) for r in sent] == [(logging.INFO, "sent (attempt 1)")] * 2
    assert await service.sweep_missing() == 0  # ERP's messages are not confirmed: no row to repair


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
