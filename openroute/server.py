"""The Starlette application of one node: inbound SOAP/JSON endpoints, admin API, ``/metrics`` and ``/health``.

Finding the application to serve is :mod:`openroute.loading`'s job, the ``openroute run`` command
:mod:`openroute.commands.run`'s.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from starlette.applications import Starlette
from starlette.routing import Mount

from openroute.admin import AdminApi, Metrics, health_route
from openroute.console import Console
from openroute.engine import Engine
from openroute.inbound import (
    AdminAuth,
    InboundBinding,
    InboundEndpoints,
    InboundSettings,
    SourceSystemAuth,
    bindings_for,
)
from openroute.loading import checked_mounts
from openroute.loading import routes_and_bindings as routes_and_bindings  # openroute.testing imports it from here
from openroute.retention import RetentionJob, RetentionPolicy

if TYPE_CHECKING:
    from openroute.confirmation import ConfirmationService
    from openroute.inbound.throttling import Throttling
    from openroute.persistence import MessageStore

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
    throttling: Throttling | None = None,
) -> Starlette:
    """The ASGI app serving ``engine``'s routes.

    With ``confirmation`` every final state is confirmed to the source system: the row is written in the
    transaction that makes the message final, sent right after the commit, and the service's retry/repair loop
    runs every ``confirmation_interval`` seconds for as long as the app lives.

    ``bindings`` default to :func:`~openroute.inbound.bindings_for` of every route (an XML and a JSON binding
    with no checks); given bindings are served as they are. With ``manage_engine`` the app's lifespan starts the
    engine and stops it on shutdown, then checkpoints a SQLite store's write-ahead log into the database file.
    ``mounts`` are ``(path, ASGI app)`` pairs served next to them (the reference application's fakes).
    ``app.state`` holds ``engine``, ``inbound``, ``admin``, ``metrics`` and ``confirmation``.
    With ``retention`` the lifespan runs the :class:`~openroute.retention.RetentionJob` (``app.state.retention``).
    With ``throttling`` inbound requests pass its rules first (:mod:`openroute.inbound.throttling`).
    """
    chosen = list(bindings) if bindings is not None else bindings_for(engine.routes)
    metrics = Metrics(engine, channel_counters)
    inbound = InboundEndpoints(engine, chosen, auth=inbound_auth, settings=settings, observer=metrics.observe_request,
                               throttling=throttling)
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
                # a clean stop leaves a SQLite store in one file: openroute.db alone is a complete copy
                await asyncio.to_thread(checkpoint_wal, engine.store)

    app = Starlette(
        routes=[*inbound.routes(), *admin.routes(), *metrics.routes(), health_route(engine),
                Mount("/console", app=Console(engine, admin_auth).app()),
                *(Mount(path, app=mounted) for path, mounted in checked_mounts(mounts))],
        lifespan=lifespan,
    )
    app.state.engine = engine
    app.state.inbound = inbound
    app.state.admin = admin
    app.state.metrics = metrics
    app.state.confirmation = confirmation
    app.state.retention = purge
    return app




def checkpoint_wal(store: MessageStore) -> bool:
    """Copy a SQLite store's write-ahead log into the database file and empty it (``PRAGMA
    wal_checkpoint(TRUNCATE)``), so the ``.db`` file alone is complete. Returns False for other databases or
    when a reader kept the checkpoint from finishing (logged; the WAL is then folded in at the next open)."""
    if store.engine.dialect.name != "sqlite":
        return False
    store.engine.dispose()  # pooled connections would hold the WAL open
    raw = store.engine.raw_connection()
    try:  # on the driver's connection, outside any transaction (the store's connections BEGIN IMMEDIATE)
        cursor = raw.cursor()
        busy, _, _ = cursor.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
        cursor.close()
    finally:
        raw.close()
    store.engine.dispose()
    if busy:
        log.warning("the SQLite checkpoint at stop was blocked by another connection; the -wal file stays")
    return not busy
