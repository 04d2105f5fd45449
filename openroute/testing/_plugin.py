"""The pytest plugin of the kit (the ``pytest11`` entry point ``openroute.testing``): the ``route_test_kit`` fixture
and the hook that runs its ``async def`` tests under pytest-asyncio in any mode."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

from openroute.testing._kit import RouteTestKit

__all__ = ["route_test_kit"]  # and pytest_pycollect_makeitem when pytest is installed


async def _route_test_kit() -> AsyncIterator[Callable[..., Any]]:
    """Factory fixture: ``kit = await route_test_kit(application, database_url=None, ...)``; closed after the test."""
    kits: list[RouteTestKit] = []

    async def make(application: Any, **options: Any) -> RouteTestKit:
        kit = RouteTestKit(application, **options)
        kits.append(kit)
        return await kit.start()

    yield make
    for kit in kits:
        await asyncio.shield(kit.close())


try:  # the kit itself works without pytest (the demo uses it); only the fixture needs it
    import pytest
except ImportError:  # pragma: no cover - pytest is a dev dependency
    route_test_kit: Any = None
else:
    try:  # pytest-asyncio runs the fixture in its strict mode too (no ``asyncio_mode = auto`` needed)
        import pytest_asyncio
    except ImportError:  # pragma: no cover - pytest-asyncio is a dev dependency
        route_test_kit = pytest.fixture(_route_test_kit, name="route_test_kit")
    else:
        route_test_kit = pytest_asyncio.fixture(_route_test_kit, name="route_test_kit")

    @pytest.hookimpl(hookwrapper=True, trylast=True)
    def pytest_pycollect_makeitem(collector: Any, name: str, obj: object) -> Any:
        """Mark ``async def`` tests that use ``route_test_kit`` with ``asyncio``, so pytest-asyncio runs them in
        strict mode too. Trylast: this wrapper sees the collected items before pytest-asyncio's converts them."""
        outcome = yield
        items = outcome.get_result()
        for item in items if isinstance(items, list) else [items]:
            if (isinstance(item, pytest.Function) and "route_test_kit" in item.fixturenames
                    and asyncio.iscoroutinefunction(item.obj) and item.get_closest_marker("asyncio") is None):
                item.add_marker(pytest.mark.asyncio)
