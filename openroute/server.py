"""The Starlette application of one node: inbound SOAP/JSON endpoints, admin API, ``/metrics`` and ``/health``.

Finding the application to serve is :mod:`openroute.loading`'s job, the ``openroute run`` command
:mod:`openroute.commands.run`'s.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.routing import Mount

from openroute.admin import AdminApi, MessageCounts, Metrics, health_route
from openroute.admin.headers import RAW_SECURITY_HEADERS, SecurityHeaders
from openroute.admin.payload_indexer import PayloadIndexer
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
from openroute.inbound.app import InboundDispatch
from openroute.inbound.asyncapi import AsyncApiContract
from openroute.loading import checked_mounts
from openroute.retention import RetentionJob, RetentionPolicy

if TYPE_CHECKING:
    from openroute.alerts import AlertEvaluator
    from openroute.confirmation import ConfirmationService
    from openroute.engine.outbox import OutboxPublisher
    from openroute.inbound.channel import ChannelInbound
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
    channels: ChannelInbound | None = None,
    outbox: OutboxPublisher | None = None,
    allowed_origins: Iterable[str] = (),
    metrics_auth: bool = False,
    alerts: AlertEvaluator | None = None,
    throttling: Throttling | None = None,
    counts: MessageCounts | None = None,
    payload_indexer: PayloadIndexer | None = None,
) -> Starlette:
    """The ASGI app serving ``engine``'s routes.

    With ``confirmation`` every final state is confirmed to the source system: the row is written in the
    transaction that makes the message final, sent right after the commit, and the service's retry/repair loop
    runs every ``confirmation_interval`` seconds for as long as the app lives.

    ``bindings`` default to :func:`~openroute.inbound.bindings_for` of every route (an XML and a JSON binding
    with no checks); given bindings are served as they are. With ``manage_engine`` the app's lifespan starts the
    engine and stops it on shutdown, then checkpoints a SQLite store's write-ahead log into the database file.
    ``mounts`` are ``(path, ASGI app)`` pairs served next to them (the reference application's fakes).
    ``app.state`` holds ``engine``, ``inbound``, ``admin``, ``metrics`` and ``confirmation``. The lifespan folds the
    store's message counts every 2 s (``counts``, default a :class:`~openroute.admin.counts.MessageCounts`, shared by
    the admin API and ``/metrics``; ``app.state.counts``) and, on PostgreSQL, copies the stored payloads into the
    payload search's index every 0.5 s (``payload_indexer``, default a
    :class:`~openroute.admin.payload_indexer.PayloadIndexer`; ``app.state.payload_indexer``).
    With ``retention`` the lifespan runs the :class:`~openroute.retention.RetentionJob` (``app.state.retention``),
    with ``alerts`` the :class:`~openroute.alerts.AlertEvaluator`'s loop (``app.state.alerts``).
    With ``channels`` (:class:`~openroute.inbound.channel.ChannelInbound`) the lifespan starts consuming the routes'
    broker channels once the engine runs and stops them before the engine (deliveries in flight are committed and
    acked, or left to the broker for redelivery); ``/health`` reports each channel (``app.state.channels``).
    With ``outbox`` (:class:`~openroute.engine.outbox.OutboxPublisher`) final states write outcome events in their
    own transaction and the lifespan publishes them (``app.state.outbox``).
    ``allowed_origins`` are the sites besides the node's own whose pages may act through the admin API and the
    console; with ``metrics_auth`` ``/metrics`` needs an ``admin_auth`` user (roles ``metrics``, ``web`` or
    ``admin``). Every response carries the :mod:`openroute.admin.headers` security headers.
    With ``throttling`` inbound requests pass its rules first (:mod:`openroute.inbound.throttling`).
    """
    chosen = list(bindings) if bindings is not None else bindings_for(engine.routes)
    counts = counts if counts is not None else MessageCounts(engine.store)
    metrics = Metrics(engine, channel_counters, counts, auth=admin_auth if metrics_auth else None,
                      channel_deliveries=None if channels is None else channels.deliveries)
    if metrics_auth and admin_auth is None:
        raise ConfigurationError("metrics_auth needs admin users (auth.admins): /metrics would refuse everyone")
    inbound = InboundEndpoints(engine, chosen, auth=inbound_auth, settings=settings, observer=metrics.observe_request,
                               throttling=throttling)
    admin = AdminApi(engine, admin_auth, counts=counts, allowed_origins=allowed_origins)
    _hook_final_states(engine, metrics, outbox, confirmation)
    purge = None if retention is None else RetentionJob(engine.store, retention, registry=metrics.registry)
    indexer = payload_indexer if payload_indexer is not None else PayloadIndexer(engine.store)
    services = _NodeServices(engine, manage_engine, channels, outbox, confirmation, confirmation_interval, purge,
                             alerts, counts, indexer)

    health = health_route(engine, channels=None if channels is None else channels.health)
    app = Starlette(
        routes=[*inbound.routes(), *_asyncapi(engine, inbound, channels), *admin.routes(), *metrics.routes(), health,
                Mount("/console", app=Console(engine, admin_auth, allowed_origins=allowed_origins,
                                              channels=channels).app()),
                *(Mount(path, app=mounted) for path, mounted in checked_mounts(mounts))],
        lifespan=services.lifespan,
        # the inbound POSTs skip the security headers' middleware: the dispatch puts the same headers in their answers
        middleware=[Middleware(InboundDispatch, endpoints=inbound, headers=RAW_SECURITY_HEADERS),
                    Middleware(SecurityHeaders)],
    )
    for name, part in (("engine", engine), ("inbound", inbound), ("admin", admin), ("metrics", metrics),
                       ("confirmation", confirmation), ("retention", purge), ("channels", channels), ("outbox", outbox),
                       ("alerts", alerts), ("counts", counts), ("payload_indexer", indexer)):
        setattr(app.state, name, part)
    return app


def _asyncapi(engine: Engine, inbound: InboundEndpoints, channels: ChannelInbound | None) -> list[Any]:
    """``GET {json_prefix}/asyncapi.json``: the AsyncAPI document of the channels this node consumes (none: a
    document without channels)."""
    described = (lambda: []) if channels is None else channels.described
    return AsyncApiContract(described, engine.routes, prefix=inbound.settings.json_prefix).routes()


def _hook_final_states(
    engine: Engine, metrics: Metrics, outbox: OutboxPublisher | None, confirmation: ConfirmationService | None
) -> None:
    """What a final state sets off: the metrics' counters; the outbox's events and the confirmation's row written in
    the transaction that makes the message final, each sent after its commit."""
    engine.on_final_state(metrics.on_final_state)
    if outbox is not None:
        engine.on_final_state_in_transaction(outbox.writer())
        engine.on_final_state(outbox.on_final_state)
    if confirmation is not None:
        engine.on_final_state_in_transaction(confirmation.on_final_state_tx)
        engine.on_final_state(confirmation.on_final_state)


@dataclass
class _Running:
    """The background tasks of one run of the app's lifespan, and the event that stops them."""

    stop: asyncio.Event
    outbox: asyncio.Task[None] | None = None
    confirmations: asyncio.Task[None] | None = None
    retention: asyncio.Task[None] | None = None
    alerts: asyncio.Task[None] | None = None
    counts: asyncio.Task[None] | None = None
    payload_index: asyncio.Task[None] | None = None


@dataclass
class _NodeServices:
    """The app's lifespan: starts the engine and each optional service of the node, stops them in the order each
    needs (channels first, the engine before the last outbox round, the WAL checkpoint last)."""

    engine: Engine
    manage_engine: bool
    channels: ChannelInbound | None
    outbox: OutboxPublisher | None
    confirmation: ConfirmationService | None
    confirmation_interval: float
    purge: RetentionJob | None
    alerts: AlertEvaluator | None
    counts: MessageCounts
    payload_indexer: PayloadIndexer

    @contextlib.asynccontextmanager
    async def lifespan(self, _app: Starlette) -> AsyncIterator[None]:
        running = await self._start()
        try:
            yield
        finally:
            await self._stop(running)

    async def _start(self) -> _Running:
        if self.manage_engine:
            await self.engine.start()
        if self.channels is not None:
            try:
                await self.channels.start()
            except BaseException:
                if self.manage_engine:
                    await self.engine.stop()
                raise
        running = _Running(asyncio.Event())
        stop = running.stop
        if self.outbox is not None:
            await self.outbox.start()
            running.outbox = asyncio.create_task(self.outbox.run(stop), name="outbox")
        if self.confirmation is not None:
            engine = self.engine
            running.confirmations = asyncio.create_task(
                self.confirmation.run(self.confirmation_interval, stop,
                                      paused=lambda: not engine.node_state.picks_up_work), name="confirmations")
        if self.purge is not None:
            running.retention = asyncio.create_task(self.purge.run(stop), name="retention")
        if self.alerts is not None:
            running.alerts = asyncio.create_task(self.alerts.run(stop), name="alerts")
        running.counts = asyncio.create_task(self.counts.run(stop), name="message-counts")
        running.payload_index = asyncio.create_task(self.payload_indexer.run(stop), name="payload-index")
        return running

    async def _stop(self, running: _Running) -> None:
        running.stop.set()
        if self.channels is not None:
            await self.channels.stop()
        if running.retention is not None:
            await running.retention
        if running.alerts is not None:
            await running.alerts
        if running.counts is not None:
            await running.counts
        if running.payload_index is not None:
            await running.payload_index
        if running.confirmations is not None:
            try:
                await asyncio.wait_for(running.confirmations, 30)
            except (TimeoutError, Exception):  # a hung send must not keep the server from stopping
                log.exception("confirmation loop did not stop cleanly")
        if self.manage_engine:
            await self.engine.stop()
        if running.outbox is not None and self.outbox is not None:
            # after the engine: the final states of its last messages are published too (or left in the outbox)
            try:
                await asyncio.wait_for(running.outbox, 30)  # its round in flight ends (stop is set)
                await asyncio.wait_for(self.outbox.publish_once(), 10)
            except (TimeoutError, Exception):  # what is not confirmed stays in the outbox for the next start
                log.warning("outbox: events left unpublished at stop are published after the next start")
            await self.outbox.stop()
        if self.manage_engine:
            # a clean stop leaves a SQLite store in one file: openroute.db alone is a complete copy
            await asyncio.to_thread(checkpoint_wal, self.engine.store)




def channel_inbound(engine: Engine, channels: Iterable[Any], messaging: Mapping[str, Any],
                    settings: Any = None) -> Any:
    """The :class:`~openroute.inbound.channel.ChannelInbound` serving the routes fed by ``channels``, or None when
    there are none (or only optional channels that the configuration binds to no connector).

    Raises :class:`~openroute.errors.DeploymentError` for channels the configuration cannot serve."""
    channels = list(channels)
    if not channels:
        return None
    from openroute.inbound.channel import ChannelInbound

    inbound = ChannelInbound(engine, channels, messaging, settings=settings)
    return inbound if inbound.channels else None


def inbound_throttling(rules: Sequence[Any], store: MessageStore) -> Throttling | None:
    """The inbound throttling of ``rules`` (``[throttling]``) with counters shared through ``store``; None without
    rules (the default: nothing is counted)."""
    from openroute.inbound.throttling import Throttling
    from openroute.persistence import ThrottleCounters

    return Throttling(list(rules), ThrottleCounters(store)) if rules else None


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
