"""``openroute run`` loading an application with extra mounts and start-up notes (the reference app's fakes)."""

from __future__ import annotations

import sys
import types
from typing import Any

import httpx
import pytest
from openroute.persistence import MessageStore
from starlette.responses import PlainTextResponse

from openroute.definitions.errors import ConfigurationError
from openroute.definitions.route import Route, RouteRegistry
from openroute.dsl import Application, route
from openroute.engine import Engine, EngineSettings
from openroute.loading import load_application, load_routes
from openroute.server import create_app


async def _hello(scope: Any, receive: Any, send: Any) -> None:
    await PlainTextResponse(f"hello from {scope['path']}")(scope, receive, send)


def _registry() -> RouteRegistry:
    return RouteRegistry([Route("shop", "order", [lambda exchange: None])])


class _App:
    def __init__(self, mounts: Any = (), notes: Any = ()) -> None:
        self.routes, self.bindings, self.mounts, self.notes = _registry(), None, mounts, notes


@pytest.fixture
def module(monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    module = types.ModuleType("loading_example")
    monkeypatch.setitem(sys.modules, "loading_example", module)
    return module


def test_mounts_and_notes_are_read(module: types.ModuleType) -> None:
    module.app = lambda: _App([("/fakes/x/", _hello)], ["fake x in use"])  # type: ignore[attr-defined]
    loaded = load_application("loading_example:app")
    assert loaded.mounts == (("/fakes/x", _hello),) and loaded.notes == ("fake x in use",)
    assert loaded.bindings is None and len(loaded.routes) == 1
    module.plain = _registry()  # type: ignore[attr-defined]
    plain = load_application("loading_example:plain")
    assert (plain.mounts, plain.notes) == ((), ())
    routes, bindings = load_routes("loading_example:plain")
    assert routes is module.plain and bindings is None  # type: ignore[attr-defined]


@pytest.mark.parametrize("mounts", [[("fakes", _hello)], [("/", _hello)], [("/x", "not an app")], [("/x",)],
                                    ["/x"]])
def test_a_bad_mount_is_a_configuration_error(module: types.ModuleType, mounts: Any) -> None:
    module.app = _App(mounts)  # type: ignore[attr-defined]
    with pytest.raises(ConfigurationError, match="a mount must be a"):
        load_application("loading_example:app")


@pytest.mark.parametrize("notes", ["one string", [1, 2]])
def test_bad_notes_are_a_configuration_error(module: types.ModuleType, notes: Any) -> None:
    module.app = _App(notes=notes)  # type: ignore[attr-defined]
    with pytest.raises(ConfigurationError, match="notes must be a list of strings"):
        load_application("loading_example:app")


def _dsl_app(**extra: Any) -> Application:
    return Application(route("shop", "order").json().process(lambda exchange: None), **extra)


@pytest.mark.parametrize("shape", ["registry", "application", "object", "callable registry", "callable application",
                                   "callable object"])
def test_load_application_returns_an_application_for_every_shape(module: types.ModuleType, shape: str) -> None:
    targets: dict[str, Any] = {"registry": _registry(), "application": _dsl_app(notes=["n"]),
                               "object": _App([("/x", _hello)], ["n"])}
    base = shape.removeprefix("callable ")
    module.app = (lambda: targets[base]) if shape.startswith("callable") else targets[base]  # type: ignore[attr-defined]
    loaded = load_application("loading_example:app")
    assert isinstance(loaded, Application) and len(loaded.routes) == 1
    if base == "application":
        assert loaded is targets[base] and loaded.notes == ("n",) and loaded.bindings
    else:
        assert loaded.bindings is None
        assert loaded.notes == (() if base == "registry" else ("n",))


def test_an_application_keeps_mounts_and_notes_as_tuples() -> None:
    app = _dsl_app(mounts=[("/fakes/x/", _hello)], notes=["fake x in use"])
    assert app.mounts == (("/fakes/x", _hello),) and app.notes == ("fake x in use",)
    assert (_dsl_app().mounts, _dsl_app().notes) == ((), ())
    with pytest.raises(AttributeError):
        app.notes = ("other",)  # type: ignore[misc]
    with pytest.raises(ConfigurationError, match="a mount must be a"):
        _dsl_app(mounts=[("/", _hello)])
    with pytest.raises(ConfigurationError, match="notes must be a list of strings"):
        _dsl_app(notes="one string")
    wrapped = Application.of(_registry(), None, notes=["n"])
    assert wrapped.bindings is None and wrapped.notes == ("n",) and len(wrapped.routes) == 1


def test_the_reference_application_is_an_application() -> None:
    from openroute_reference import registry

    loaded = load_application("openroute_reference:registry")
    assert isinstance(loaded, Application) and isinstance(registry(), Application)
    assert len(loaded.routes) == 5 and loaded.bindings


async def test_create_app_serves_the_mounts_next_to_the_endpoints(sqlite_url: str) -> None:
    store = MessageStore(sqlite_url)
    store.upgrade()
    engine = Engine(store, _registry(), EngineSettings(repoll_interval=None, node_id="mounts"))
    app = create_app(engine, mounts=[("/fakes/x", _hello)], manage_engine=False)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://node") as client:
        answer = await client.get("/fakes/x/anything")
        assert (answer.status_code, answer.text) == (200, "hello from /fakes/x/anything")
        assert (await client.get("/health")).status_code in (200, 503)
    with pytest.raises(ConfigurationError, match="a mount must be a"):
        create_app(engine, mounts=[("no-slash", _hello)], manage_engine=False)
    store.dispose()
