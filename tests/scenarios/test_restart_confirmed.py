"""The restart rule: a restarted FAILED or CANCEL message starts a new attempt history, and its next final state is
confirmed again to the source system with the new outcome (the confirmation row starts over, PENDING)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import httpx
import sqlalchemy as sa
from openroute.confirmation import ConfirmationCallback, ConfirmationRequest, ConfirmationService

from openroute.definitions.errors import BusinessError
from openroute.dsl import Application, route
from openroute.inbound import AdminAuth, AdminUser
from openroute.server import create_app


class Recorder(ConfirmationCallback):
    def __init__(self) -> None:
        self.received: list[tuple[int, str, int]] = []

    async def confirm(self, request: ConfirmationRequest) -> None:
        self.received.append((int(request.message_id), request.state, len(request.business_errors)))


class Stock:
    """Refuses orders while empty; a restart after a delivery succeeds."""

    def __init__(self) -> None:
        self.items = 0
        self.hold = True

    def wait(self, exchange: Any) -> None:
        if self.hold:
            exchange.postpone(timedelta(hours=1))

    def take(self, exchange: Any) -> None:
        if self.items == 0:
            raise BusinessError("OUT_OF_STOCK", "nothing in stock")
        self.items -= 1


def _application(stock: Stock) -> Application:
    return Application(
        route("shop", "order").json().process(stock.take),
        route("shop", "later").json().process(stock.wait),
    )


class Admin:
    """The admin API of the kit's engine, with an operator's credentials."""

    def __init__(self, engine: Any) -> None:
        app = create_app(engine, manage_engine=False, admin_auth=AdminAuth([AdminUser("ops", "ops-secret")]))
        self.client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://admin",
                                        auth=("ops", "ops-secret"))

    async def restart(self, message_id: int) -> httpx.Response:
        return await self.client.post(f"/admin/messages/{message_id}/restart", json={})


async def _kit_with_confirmations(route_test_kit: Any, stock: Stock) -> tuple[Any, Recorder, Admin]:
    kit = await route_test_kit(_application(stock))
    recorder = Recorder()
    service = ConfirmationService(kit.store, recorder, clock=kit.clock)
    kit.engine.on_final_state_in_transaction(service.on_final_state_tx)
    kit.engine.on_final_state(service.on_final_state)
    return kit, recorder, Admin(kit.engine)


def _confirmation(kit: Any, message_id: int) -> tuple[str, str, int]:
    with kit.store.engine.connect() as connection:
        row = connection.execute(sa.text(
            "select outcome_state, status, attempts from confirmation where message_id = :id"), {"id": message_id}
        ).one()
    return row.outcome_state, row.status, row.attempts


async def test_a_restarted_failed_message_is_confirmed_again_with_its_new_outcome(route_test_kit: Any) -> None:
    stock = Stock()
    kit, recorder, admin = await _kit_with_confirmations(route_test_kit, stock)
    sent = await kit.send_json("shop", "order", {"sku": "A"}, source_system="SHOP")
    await kit.settle()
    failed = kit.assert_state(sent.message_id, "FAILED")
    assert failed.business_errors == [{"code": "OUT_OF_STOCK", "text": "nothing in stock"}]
    assert recorder.received == [(sent.message_id, "FAILED", 1)]
    assert _confirmation(kit, sent.message_id) == ("FAILED", "SENT", 1)

    stock.items = 1
    answer = await admin.restart(sent.message_id)
    assert answer.status_code == 200 and answer.json()["state"] == "PARTLY_FAILED"
    restarted = kit.message(sent.message_id)
    assert (restarted.failed_count, restarted.business_errors) == (0, [])  # a new attempt history
    await kit.settle()
    assert kit.assert_state(sent.message_id, "OK").business_errors == []
    assert recorder.received == [(sent.message_id, "FAILED", 1), (sent.message_id, "OK", 0)]
    assert _confirmation(kit, sent.message_id) == ("OK", "SENT", 1)


async def test_a_restart_that_fails_again_stores_its_business_error_once(route_test_kit: Any) -> None:
    kit, recorder, _admin = await _kit_with_confirmations(route_test_kit, Stock())
    sent = await kit.send_json("shop", "order", {"sku": "B"}, source_system="SHOP")
    await kit.settle()
    kit.assert_state(sent.message_id, "FAILED")
    await kit.engine.restart(sent.message_id)
    await kit.settle()
    again = kit.assert_state(sent.message_id, "FAILED")
    assert again.business_errors == [{"code": "OUT_OF_STOCK", "text": "nothing in stock"}]  # once, not twice
    assert recorder.received == [(sent.message_id, "FAILED", 1), (sent.message_id, "FAILED", 1)]
    assert _confirmation(kit, sent.message_id) == ("FAILED", "SENT", 1)


async def test_a_restarted_cancel_message_is_confirmed_with_its_new_outcome(route_test_kit: Any) -> None:
    stock = Stock()
    kit, recorder, admin = await _kit_with_confirmations(route_test_kit, stock)
    sent = await kit.send_json("shop", "later", {}, source_system="SHOP")
    await kit.settle()
    kit.assert_state(sent.message_id, "POSTPONED")
    await kit.engine.cancel(sent.message_id)
    await kit.settle()
    assert _confirmation(kit, sent.message_id) == ("CANCEL", "SENT", 1)
    stock.hold = False
    answer = await admin.restart(sent.message_id)  # 200: a CANCEL message may be restarted too
    assert answer.status_code == 200 and answer.json()["state"] == "PARTLY_FAILED"
    await kit.settle()
    kit.assert_state(sent.message_id, "OK")
    assert [state for _, state, _ in recorder.received] == ["CANCEL", "OK"]
    assert _confirmation(kit, sent.message_id) == ("OK", "SENT", 1)


async def test_restart_of_a_message_that_is_not_final_is_refused(route_test_kit: Any) -> None:
    kit, recorder, admin = await _kit_with_confirmations(route_test_kit, Stock())
    sent = await kit.send_json("shop", "later", {}, source_system="SHOP")
    await kit.settle()
    kit.assert_state(sent.message_id, "POSTPONED")
    answer = await admin.restart(sent.message_id)
    assert answer.status_code == 409, answer.text
    kit.assert_state(sent.message_id, "POSTPONED")
    assert recorder.received == []
