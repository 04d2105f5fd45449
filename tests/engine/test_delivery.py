"""deliver runs an unintercepted route's steps in the call itself until one waits; the rest is the awaitable it
returns, with the same order, results and business-error handling."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from openroute.definitions.errors import BusinessError
from openroute.definitions.route import Route
from openroute.engine.delivery import deliver
from openroute.engine.exchange import Exchange


def _exchange() -> Exchange:
    return Exchange(message=None, payload="p", headers={}, custom_data={})  # type: ignore[arg-type]  # no snapshot needed


def test_sync_steps_run_in_the_call_and_nothing_is_left_to_await() -> None:
    ran: list[str] = []
    route = Route("s", "o", [lambda e: ran.append("a"), lambda e: ran.append("b") or "last"])
    exchange = _exchange()
    assert deliver(route, exchange, ()) is None
    assert ran == ["a", "b"] and exchange.result == "last"


def test_after_a_step_that_waits_the_rest_runs_when_awaited_in_order() -> None:
    ran: list[str] = []

    async def waits(exchange: Exchange) -> str:
        await asyncio.sleep(0)
        ran.append("waited")
        return "w"

    def after(exchange: Exchange) -> Any:
        ran.append(f"after {exchange.result}")
        return waits(exchange)

    route = Route("s", "o", [lambda e: ran.append("first"), waits, after, lambda e: ran.append("sync") or "end"])
    exchange = _exchange()
    rest = deliver(route, exchange, ())
    assert rest is not None and ran == ["first"]
    asyncio.run(_await(rest))
    assert ran == ["first", "waited", "after w", "waited", "sync"] and exchange.result == "end"


async def _await(awaitable: Any) -> None:
    await awaitable


@pytest.mark.parametrize("waits", [False, True])
def test_a_business_error_is_recorded_or_raised_wherever_the_step_fails(waits: bool) -> None:
    async def fails_later(exchange: Exchange) -> None:
        raise BusinessError("B1", "refused")

    def fails_now(exchange: Exchange) -> None:
        raise BusinessError("B1", "refused")

    step = fails_later if waits else fails_now
    tail: list[str] = []
    continuing = Route("s", "o", [step, lambda e: tail.append("ran")], continue_on_business_error=True)
    exchange = _exchange()
    rest = deliver(continuing, exchange, ())
    if waits:
        assert rest is not None
        asyncio.run(_await(rest))
    else:
        assert rest is None
    assert exchange.business_errors == [{"code": "B1", "text": "refused"}] and tail == ["ran"]

    stopping = Route("s", "o", [step, lambda e: tail.append("not run")])
    with pytest.raises(BusinessError):
        rest = deliver(stopping, _exchange(), ())
        if rest is not None:
            asyncio.run(_await(rest))
    assert tail == ["ran"]
