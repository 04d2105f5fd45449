"""The Starlette application of one node: inbound SOAP/JSON endpoints, admin API, ``/metrics`` and ``/health``."""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import importlib.util
import logging
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from starlette.applications import Starlette
from starlette.routing import Mount

from openroute.admin import AdminApi, Metrics, health_route
from openroute.console import Console
from openroute.engine import Engine
from openroute.errors import ConfigurationError
from openroute.inbound import (
    AdminAuth,
    InboundBinding,
    InboundEndpoints,
    InboundSettings,
    SourceSystemAuth,
    bindings_for,
)
from openroute.retention import RetentionJob, RetentionPolicy
from openroute.route import RouteRegistry

if TYPE_CHECKING:
    from openroute.confirmation import ConfirmationService

log = logging.getLogger("openroute.server")


def create_app(
    engine: Engine,
    bindings: Iterable[InboundBinding] | None = None,
    *,
    inbound_auth: SourceSystemAuth | None = None,
    admin_auth: AdminAuth | None = None,
    settings: InboundSettings | None = None,
    channel_counters: Callable[[], Mapping[str, int]] | None = None,
    manage_engine: bool = True,
    confirmation: ConfirmationService | None = None,
    confirmation_interval: float = 10.0,
    mounts: Sequence[tuple[str, Any]] = (),
    retention: RetentionPolicy | None = None,
) -> Starlette:
    """The ASGI app serving ``engine``'s routes.

    With ``confirmation`` every final state is confirmed to the source system: the row is written in the
    transaction that makes the message final, sent right after the commit, and the service's retry/repair loop
    runs every ``confirmation_interval`` seconds for as long as the app lives.

    ``bindings`` default to :func:`~openroute.inbound.bindings_for` of every route (an XML and a JSON binding
    with no checks); given bindings are served as they are. With ``manage_engine`` the app's lifespan starts the
    engine and stops it on shutdown. ``mounts`` are ``(path, ASGI app)`` pairs served next to them (the reference
    application's fakes). ``app.state`` holds ``engine``, ``inbound``, ``admin``, ``metrics`` and ``confirmation``.
    With ``retention`` the lifespan runs the :class:`~openroute.retention.RetentionJob` (``app.state.retention``).
    """
    chosen = list(bindings) if bindings is not None else bindings_for(engine.routes)
    metrics = Metrics(engine, channel_counters)
    inbound = InboundEndpoints(engine, chosen, auth=inbound_auth, settings=settings, observer=metrics.observe_request)
    admin = AdminApi(engine, admin_auth)
    engine.final_state_hooks.append(metrics.on_final_state)
    purge = None if retention is None else RetentionJob(engine.store, retention, registry=metrics.registry)
    if confirmation is not None:
        engine.final_state_tx_hooks.append(confirmation.on_final_state_tx)
        engine.final_state_hooks.append(confirmation.on_final_state)

    @contextlib.asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        if manage_engine:
            await engine.start()
        stop = asyncio.Event()
        loop_task = None
        if confirmation is not None:
            loop_task = asyncio.create_task(confirmation.run(confirmation_interval, stop), name="confirmations")
        purge_task = None if purge is None else asyncio.create_task(purge.run(stop), name="retention")
        try:
            yield
        finally:
            stop.set()
            if purge_task is not None:
                await purge_task
            if loop_task is not None:
                try:
                    await asyncio.wait_for(loop_task, 30)
                except (TimeoutError, Exception):  # a hung send must not keep the server from stopping
                    log.exception("confirmation loop did not stop cleanly")
            if manage_engine:
                await engine.stop()

    app = Starlette(
        routes=[*inbound.routes(), *admin.routes(), *metrics.routes(), health_route(engine),
                Mount("/console", app=Console(engine, admin_auth).app()),
                *(Mount(path, app=mounted) for path, mounted in _checked_mounts(mounts))],
        lifespan=lifespan,
    )
    app.state.engine = engine
    app.state.inbound = inbound
    app.state.admin = admin
    app.state.metrics = metrics
    app.state.confirmation = confirmation
    app.state.retention = purge
    return app


def _checked_mounts(mounts: Iterable[Any]) -> list[tuple[str, Any]]:
    checked = []
    for item in mounts:
        if not (isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str)
                and item[0].startswith("/") and item[0] != "/" and callable(item[1])):
            raise ConfigurationError(f"a mount must be a ('/path', ASGI app) pair, got {item!r}")
        checked.append((item[0].rstrip("/"), item[1]))
    return checked


@dataclass(frozen=True)
class LoadedApplication:
    """What ``openroute run`` serves from ``module:attr``: routes, bindings (None: the defaults), extra ASGI
    ``mounts`` and start-up ``notes`` (both optional attributes of the loaded object)."""

    routes: RouteRegistry
    bindings: list[InboundBinding] | None
    mounts: tuple[tuple[str, Any], ...] = ()
    notes: tuple[str, ...] = ()


def load_application(spec: str) -> LoadedApplication:
    """Import ``module:attr`` (see :func:`load_routes`); also reads its optional ``mounts`` and ``notes``."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ConfigurationError(f"--routes must be 'module:attribute', got {spec!r}")
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise ConfigurationError(f"cannot import routes module {module_name!r}: {error}") from None
    try:
        target: Any = getattr(module, attr)
    except AttributeError:
        raise ConfigurationError(f"module {module_name!r} has no attribute {attr!r}") from None
    if callable(target) and not isinstance(target, RouteRegistry):
        target = target()
    registry, bindings = routes_and_bindings(target, spec)
    mounts = tuple(_checked_mounts(getattr(target, "mounts", None) or ()))
    notes = getattr(target, "notes", None) or ()
    if isinstance(notes, str) or not all(isinstance(note, str) for note in notes):
        raise ConfigurationError(f"{spec}: notes must be a list of strings")
    return LoadedApplication(registry, bindings, mounts, tuple(notes))


def load_routes(spec: str) -> tuple[RouteRegistry, list[InboundBinding] | None]:
    """Import ``module:attr`` and return its routes and bindings.

    ``attr`` may be a :class:`RouteRegistry` (default bindings for every route), an object with ``routes``
    (a RouteRegistry) and ``bindings`` (InboundBinding list), or a callable returning either.
    """
    loaded = load_application(spec)
    return loaded.routes, loaded.bindings


def routes_and_bindings(target: Any, what: str) -> tuple[RouteRegistry, list[InboundBinding] | None]:
    """The routes and bindings of ``target``: a :class:`RouteRegistry` (bindings None: the defaults), an object
    with ``routes`` and ``bindings`` (an ``openroute.dsl.Application``), or a callable returning either."""
    if callable(target) and not isinstance(target, RouteRegistry):
        target = target()
    if isinstance(target, RouteRegistry):
        return target, None
    routes = getattr(target, "routes", None)
    bindings = getattr(target, "bindings", None)
    if isinstance(routes, RouteRegistry):
        if bindings is not None and not all(isinstance(b, InboundBinding) for b in bindings):
            raise ConfigurationError(f"{what}: bindings must be InboundBinding objects")
        return routes, None if bindings is None else list(bindings)
    raise ConfigurationError(f"{what} is neither a RouteRegistry nor an object with routes and bindings")


DEFAULT_ROUTES = "openroute_reference:registry"


def serve(
    host: str = "127.0.0.1",
    port: int = 8080,
    database_url: str | None = None,
    routes: str | None = None,
    auth_config: str | None = None,
) -> int:
    """``openroute run``: migrate the store, then serve the routes of ``routes`` (``module:attr``) with uvicorn.

    Without ``routes`` the reference application ``openroute_reference:registry`` is served if it can be imported.
    Returns the process exit code (2 for a configuration problem, reported on stderr).
    """
    import json
    import sys

    import uvicorn

    from openroute.inbound import load_auth_config
    from openroute.persistence import MessageStore

    spec = routes or DEFAULT_ROUTES
    try:
        if routes is None and importlib.util.find_spec(DEFAULT_ROUTES.partition(":")[0]) is None:
            raise ConfigurationError(
                "no reference routes module 'openroute_reference' here: pass --routes module:attribute"
            )
        loaded = load_application(spec)
        registry, bindings = loaded.routes, loaded.bindings
        inbound_auth = admin_auth = None
        config: dict[str, Any] = {}
        if auth_config is not None:
            try:
                with open(auth_config, encoding="utf-8") as file:
                    config = json.load(file)
                inbound_auth, admin_auth = load_auth_config(config)
            except (OSError, ValueError) as error:
                raise ConfigurationError(f"cannot read --auth-config {auth_config}: {error}") from None
        confirmation_callback(config)  # a bad "confirmations" section is a configuration error at start
    except ConfigurationError as error:
        print(f"openroute run: {error}", file=sys.stderr)
        return 2
    from openroute.confirmation import ConfirmationService

    store = MessageStore(database_url)
    store.upgrade()
    engine = Engine(store, registry)
    confirmation = ConfirmationService(store, confirmation_callback(config))
    app = create_app(engine, bindings, inbound_auth=inbound_auth, admin_auth=admin_auth, confirmation=confirmation,
                     mounts=loaded.mounts)
    for note in loaded.notes:
        print(f"openroute run: {note}", flush=True)
    print(f"openroute run: serving {len(registry)} routes of {spec} on http://{host}:{port} "
          f"(SOAP /soap/<service>, JSON /api/<service>/<operation>, /admin, /metrics, /health)", flush=True)
    uvicorn.run(app, host=host, port=port, log_level="info")
    return 0


def confirmation_callback(config: Mapping[str, Any]) -> Any:
    """The confirmation callback of ``openroute run``: the ``confirmations`` section of the config file maps a
    source system to ``{"soap": url}`` or ``{"http": url, "headers": {...}}``; without it outcomes are logged
    (:class:`~confirmation.DefaultConfirmationCallback`)."""
    from openroute.confirmation import (
        DefaultConfirmationCallback,
        DelegateConfirmationCallback,
        HttpJsonConfirmation,
        SoapConfirmation,
    )

    section = config.get("confirmations") if isinstance(config, Mapping) else None
    if section is None:
        return DefaultConfirmationCallback()
    if not isinstance(section, Mapping):
        raise ConfigurationError("confirmations must map source systems to {'soap': url} or {'http': url}")
    transports: list[Any] = []
    for system, target in section.items():
        try:
            if isinstance(target, Mapping) and isinstance(target.get("soap"), str):
                transports.append(SoapConfirmation(system, target["soap"]))
            elif isinstance(target, Mapping) and isinstance(target.get("http"), str):
                headers = dict(target.get("headers", {}))
                transports.append(HttpJsonConfirmation(system, target["http"], headers=headers))
            else:
                raise ConfigurationError(f"confirmations.{system} must be {{'soap': url}} or {{'http': url}}")
        except (ValueError, TypeError) as error:  # ConfigurationError and InvalidConfirmationError are ValueErrors
            raise ConfigurationError(f"confirmations.{system}: {error}") from None
    return DelegateConfirmationCallback(transports)
