"""Fixtures of the lifecycle tests: a migrated store on each real database, a manual clock, engines."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime
from typing import Any

import pytest
from openroute.persistence import MessageStore

from openroute.definitions.clock import ManualClock
from openroute.definitions.message import InboundMessage
from openroute.definitions.route import Route, RouteRegistry
from openroute.engine import Engine, EngineSettings

START = datetime(2024, 3, 1, 12, 0, tzinfo=UTC)


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(START)


def inbound(correlation_id: str = "c-1", **overrides: Any) -> InboundMessage:
    """An inbound message of the test route ``orders/create``."""
    values: dict[str, Any] = {
        "service": "orders",
        "operation": "create",
        "payload": '{"order": 1}',
        "content_type": "application/json",
        "correlation_id": correlation_id,
        "source_system": "crm",
    }
    values.update(overrides)
    return InboundMessage(**values)


EngineFactory = Callable[..., Engine]


@pytest.fixture
async def make_engine(store: MessageStore, clock: ManualClock) -> AsyncIterator[EngineFactory]:
    """Build engines on ``store`` with the manual clock and no repoll scheduler; all stopped afterwards."""
    engines: list[Engine] = []

    def factory(*routes: Route, **settings: Any) -> Engine:
        settings.setdefault("repoll_interval", None)
        settings.setdefault("node_id", f"node-{len(engines) + 1}")
        engine = Engine(store, RouteRegistry(list(routes)), EngineSettings(**settings), clock=clock)
        engines.append(engine)
        return engine

    yield factory
    for engine in engines:
        await engine.stop()
