"""Failed logins are limited per (user, address) and per address: 429 with Retry-After, one log line without the
password, the right password from another address still works (admin API, console, inbound endpoints)."""

from __future__ import annotations

import base64
import logging
from collections.abc import AsyncIterator

import httpx
import pytest
from openroute.persistence import MessageStore

from openroute.auth import (
    AdminAuth,
    AdminUser,
    BasicCredentials,
    LoginLimiter,
    SourceSystemAuth,
    TooManyFailedLoginsError,
)
from openroute.definitions.errors import ConfigurationError
from openroute.engine import Engine, EngineSettings
from openroute.server import create_app
from tests.inbound.conftest import BINDINGS, routes


def basic(user: str, password: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


WRONG = "Wr0ngGuess"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_limiter_counts_per_user_and_address_in_a_sliding_window() -> None:
    clock = Clock()
    limiter = LoginLimiter(max_failures=3, max_failures_per_address=5, window=60, clock=clock)
    for _ in range(3):
        limiter.check("ops", "10.0.0.1")
        limiter.failed("ops", "10.0.0.1")
        clock.now += 1
    with pytest.raises(TooManyFailedLoginsError) as refused:
        limiter.check("ops", "10.0.0.1")
    assert refused.value.retry_after == 57  # now 1003: the first failure (1000) leaves the window at 1060
    limiter.check("ops", "10.0.0.2")  # another address: the real user is not locked out
    limiter.check("other", "10.0.0.1")  # another user from the address: below the address limit
    limiter.failed("a", "10.0.0.1")
    limiter.failed("b", "10.0.0.1")
    with pytest.raises(TooManyFailedLoginsError, match="address"):
        limiter.check("c", "10.0.0.1")  # five failures from one address, any user names
    clock.now += 61
    limiter.check("ops", "10.0.0.1")
    limiter.failed("ops", "10.0.0.2")
    limiter.succeeded("ops", "10.0.0.2")  # a right password clears the pair
    assert limiter._failures.get(("user", "ops", "10.0.0.2")) is None
    with pytest.raises(ConfigurationError):
        LoginLimiter(max_failures=0)
    with pytest.raises(ConfigurationError):
        LoginLimiter(window=0)


def _client(app: object, address: str) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app, client=(address, 40000)),  # type: ignore[arg-type]
                             base_url="http://node")


@pytest.fixture
async def engine(sqlite_url: str) -> AsyncIterator[Engine]:
    store = MessageStore(sqlite_url)
    store.create_schema()
    node = Engine(store, routes(), EngineSettings(repoll_interval=None, node_id="limit-test"))
    yield node
    store.dispose()


async def test_admin_logins_are_limited_per_user_and_address(
    engine: Engine, caplog: pytest.LogCaptureFixture
) -> None:
    limiter = LoginLimiter(max_failures=10, max_failures_per_address=50, window=60)
    app = create_app(engine, BINDINGS, manage_engine=False,
                     admin_auth=AdminAuth([AdminUser("ops", "ops-secret")], limiter=limiter))
    caplog.set_level(logging.INFO)
    async with _client(app, "10.1.1.1") as attacker, _client(app, "10.2.2.2") as operator:
        for _ in range(10):
            assert (await attacker.get("/admin/counts", headers=basic("ops", WRONG))).status_code == 401
        locked = await attacker.get("/admin/counts", headers=basic("ops", "ops-secret"))  # even the right one
        assert locked.status_code == 429, locked.text
        assert locked.json()["error"] == "TOO_MANY_FAILED_LOGINS"
        assert 1 <= int(locked.headers["retry-after"]) <= 60
        console = await attacker.get("/console/", headers=basic("ops", "ops-secret"))
        assert console.status_code == 429 and "retry-after" in console.headers
        assert (await operator.get("/admin/counts", headers=basic("ops", "ops-secret"))).status_code == 200
    lines = [r.getMessage() for r in caplog.records if "login refused" in r.getMessage()]
    assert len(lines) == 1 and "'ops'" in lines[0] and "10.1.1.1" in lines[0], lines
    assert WRONG not in caplog.text and "ops-secret" not in caplog.text


async def test_inbound_logins_are_limited_too(engine: Engine) -> None:
    auth = SourceSystemAuth({"CRM": BasicCredentials("crm", "crm-secret")},
                            limiter=LoginLimiter(max_failures=3, window=60))
    app = create_app(engine, BINDINGS, manage_engine=False, inbound_auth=auth)
    headers = {"Content-Type": "application/json"}
    async with _client(app, "10.3.3.3") as attacker, _client(app, "10.4.4.4") as crm:
        for _ in range(3):
            refused = await attacker.post("/api/orders/create", json={}, headers={**headers, **basic("crm", WRONG)})
            assert refused.status_code == 401
        locked = await attacker.post("/api/orders/create", json={}, headers={**headers, **basic("crm", "crm-secret")})
        assert (locked.status_code, locked.json()["error"]) == (429, "TOO_MANY_FAILED_LOGINS")
        assert "retry-after" in locked.headers
        soap = await attacker.post("/soap/orders", content=b"<x/>",
                                   headers={"Content-Type": "text/xml", **basic("crm", "crm-secret")})
        assert soap.status_code == 429 and "TOO_MANY_FAILED_LOGINS" in soap.text
        ok = await crm.post("/api/orders/create", json={"orderId": "O-1", "customer": {"id": "C"}},
                            headers={**headers, **basic("crm", "crm-secret")})
        assert ok.status_code == 202, ok.text
