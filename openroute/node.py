"""The composition root of one node: :class:`Node` builds every part of a server and owns their lifespan.

Where a part comes together with the others: :meth:`Node.from_config` builds the parts a configuration asks for
(store, engine, the guard of external calls, confirmations, outbox, alerts, throttling, retention, channels) from
plain settings values; :class:`Node` builds the node's own (metrics, message counts, payload index, inbound
endpoints, admin API, console, the ASGI app), registers their engine hooks by method, and lists the lifespan's
parts in start order (:mod:`openroute.node_parts`). Adding a part touches this module only: a parameter of
:class:`Node` and its key in :class:`NodeOptions` (and its line in :meth:`Node.from_config` when the configuration
builds it), its hooks in :meth:`Node._hook_final_states`, its place in :meth:`Node._lifespan_parts`.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, TypedDict

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.routing import BaseRoute, Mount
from starlette.types import ASGIApp

from openroute.admin import AdminApi, Metrics, health_route
from openroute.auth import AdminAuth, SourceSystemAuth
from openroute.auth.headers import RAW_SECURITY_HEADERS, SecurityHeaders
from openroute.console import Console
from openroute.definitions.errors import ConfigurationError
from openroute.engine import Engine
from openroute.inbound import InboundBinding, InboundEndpoints, InboundSettings, bindings_for
from openroute.inbound.app import InboundDispatch
from openroute.inbound.asyncapi import AsyncApiContract
from openroute.jobs import MessageCounts, PayloadIndexer
from openroute.loading import checked_mounts
from openroute.node_parts import Loop, NodePart, Step, channel_inbound, checkpoint_wal, inbound_throttling
from openroute.persistence import MessageStore
from openroute.runtime.retention import RetentionJob, RetentionPolicy

if TYPE_CHECKING:
    from openroute.alerts import AlertEvaluator
    from openroute.config import ServerConfig
    from openroute.confirmation import ConfirmationService
    from openroute.dsl import Application
    from openroute.engine.outbox import OutboxPublisher
    from openroute.inbound.channel import ChannelInbound
    from openroute.inbound.throttling import Throttling

__all__ = ["Node", "NodeOptions"]

log = logging.getLogger("openroute.server")


class NodeOptions(TypedDict, total=False):
    """The keyword parameters of :class:`Node` (each documented there), for the callers that pass them on
    (:func:`openroute.server.create_app`): a new part is added here and to :class:`Node` side by side."""

    inbound_auth: SourceSystemAuth | None
    admin_auth: AdminAuth | None
    settings: InboundSettings | None
    channel_counters: Callable[[], Mapping[str, int]] | None
    manage_engine: bool
    owns_store: bool
    confirmation: ConfirmationService | None
    confirmation_interval: float
    mounts: Sequence[tuple[str, ASGIApp]]
    retention: RetentionPolicy | None
    channels: ChannelInbound | None
    outbox: OutboxPublisher | None
    allowed_origins: Iterable[str]
    metrics_auth: bool
    alerts: AlertEvaluator | None
    throttling: Throttling | None
    counts: MessageCounts | None
    payload_indexer: PayloadIndexer | None


class Node:
    """One node: its engine, the parts around it, the ASGI app serving them (``app``) and their lifespan.

    ``bindings`` default to :func:`~openroute.inbound.bindings_for` of every route (an XML and a JSON binding with
    no checks); given bindings are served as they are. With ``manage_engine`` the lifespan starts the engine and
    stops it, then checkpoints a SQLite store's write-ahead log into the database file; with ``owns_store`` it
    disposes of the store last. ``mounts`` are ``(path, ASGI app)`` pairs served next to them (the reference
    application's fakes). ``app.state`` holds ``node`` and each part by name (``engine``, ``inbound``, ``admin``,
    ``metrics``, ``confirmation``, ``retention``, ``channels``, ``outbox``, ``alerts``, ``counts``,
    ``payload_indexer``).

    With ``confirmation`` every final state is confirmed to the source system: for a durable callback (configured
    systems) the row is written in the transaction that makes the message final, sent right after the commit, and the
    service's retry/repair loop runs every ``confirmation_interval`` seconds; the log's callback (no systems) keeps
    no row and logs once right after the commit. The lifespan folds the store's message counts every 2 s (``counts``,
    default a :class:`~openroute.jobs.counts.MessageCounts`, shared by the admin API and ``/metrics``) and, on
    PostgreSQL, copies the stored payloads into the payload search's index every 0.5 s (``payload_indexer``).
    With ``retention`` the lifespan runs the :class:`~openroute.runtime.retention.RetentionJob`, with ``alerts`` the
    :class:`~openroute.alerts.AlertEvaluator`'s loop. With ``channels``
    (:class:`~openroute.inbound.channel.ChannelInbound`) the routes' broker channels are consumed once the engine
    runs and stopped before it (deliveries in flight are committed and acked, or left to the broker for
    redelivery); ``/health`` reports each channel. With ``outbox`` (:class:`~openroute.engine.outbox.OutboxPublisher`)
    final states write outcome events in their own transaction and the lifespan publishes them, a last round after
    the engine stopped. ``allowed_origins`` are the sites besides the node's own whose pages may act through the
    admin API and the console; with ``metrics_auth`` ``/metrics`` needs an ``admin_auth`` user. Every response carries
    the :mod:`openroute.auth.headers` security headers. With ``throttling`` inbound requests pass its rules first.
    """

    def __init__(
        self,
        engine: Engine,
        bindings: Iterable[InboundBinding] | None = None,
        *,
        inbound_auth: SourceSystemAuth | None = None,
        admin_auth: AdminAuth | None = None,
        settings: InboundSettings | None = None,
        channel_counters: Callable[[], Mapping[str, int]] | None = None,
        manage_engine: bool = True,
        owns_store: bool = False,
        confirmation: ConfirmationService | None = None,
        confirmation_interval: float = 10.0,
        mounts: Sequence[tuple[str, ASGIApp]] = (),
        retention: RetentionPolicy | None = None,
        channels: ChannelInbound | None = None,
        outbox: OutboxPublisher | None = None,
        allowed_origins: Iterable[str] = (),
        metrics_auth: bool = False,
        alerts: AlertEvaluator | None = None,
        throttling: Throttling | None = None,
        counts: MessageCounts | None = None,
        payload_indexer: PayloadIndexer | None = None,
    ) -> None:
        if metrics_auth and admin_auth is None:
            raise ConfigurationError("metrics_auth needs admin users (auth.admins): /metrics would refuse everyone")
        self.engine = engine
        self.store: MessageStore = engine.store
        self.confirmation = confirmation
        self.channels = channels
        self.outbox = outbox
        self.alerts = alerts
        self.counts = counts if counts is not None else MessageCounts(engine.store)
        self.metrics = Metrics(engine, channel_counters, self.counts, auth=admin_auth if metrics_auth else None,
                               channel_deliveries=None if channels is None else channels.deliveries)
        chosen = list(bindings) if bindings is not None else bindings_for(engine.routes)
        self.inbound = InboundEndpoints(engine, chosen, auth=inbound_auth, settings=settings,
                                        observer=self.metrics.observe_request, throttling=throttling)
        self.admin = AdminApi(engine, admin_auth, counts=self.counts, allowed_origins=allowed_origins)
        self.retention = None if retention is None else RetentionJob(engine.store, retention,
                                                                     registry=self.metrics.registry)
        self.payload_indexer = payload_indexer if payload_indexer is not None else PayloadIndexer(engine.store)
        self._hook_final_states()
        #: the lifespan's parts in start order; they stop in the reverse order
        self.parts: tuple[NodePart, ...] = self._lifespan_parts(manage_engine, owns_store, confirmation_interval)
        self._started: list[NodePart] = []
        self._stopping = asyncio.Event()
        self.app = self._asgi_app(admin_auth, allowed_origins, mounts)

    @classmethod
    def from_config(cls, config: ServerConfig, application: Application, store: MessageStore | None = None) -> Node:
        """The node ``openroute run`` serves: ``application``'s routes with every part ``config`` asks for.

        ``store`` is the node's store, opened (and checked) by the caller; without it the node opens the store at
        ``config``'s database URL and disposes of it when it stops. Raises ConfigurationError for settings that
        cannot work, DeploymentError for channels the configuration cannot serve."""
        from openroute.engine.outbox import OutboxPublisher, outcome_rules
        from openroute.runtime.logs import AttemptFailureLog, log_transition

        owns_store = store is None
        store = store if store is not None else MessageStore(config.resolved_database_url())
        messaging = config.messaging_config()
        engine = Engine(store, application.routes, config.engine.settings(), interceptors=[AttemptFailureLog()],
                        external_calls=config.external_calls(store))
        engine.on_transition(log_transition)
        inbound_auth, admin_auth = config.auth.build()
        rules = outcome_rules(messaging)
        return cls(
            engine, application.bindings, inbound_auth=inbound_auth, admin_auth=admin_auth,
            settings=config.inbound.settings(), owns_store=owns_store,
            confirmation=config.confirmations.service(store, node_id=engine.node_id, messaging=messaging),
            confirmation_interval=config.confirmations.interval.total_seconds(), mounts=application.mounts,
            retention=config.retention.policy(), allowed_origins=config.admin.allowed_origins,
            metrics_auth=config.admin.metrics_auth,
            channels=channel_inbound(engine, application.channels, messaging, config.inbound.settings()),
            outbox=OutboxPublisher(store, rules, messaging, node_id=engine.node_id) if rules else None,
            alerts=config.alerts.evaluator(store, engine.node_id),
            throttling=inbound_throttling(config.throttling_rules(), store),
        )

    # -- lifespan ------------------------------------------------------------------------------------
    @property
    def started(self) -> tuple[str, ...]:
        """The names of the parts running now, in start order."""
        return tuple(part.name for part in self._started)

    async def start(self) -> None:
        """Start every part in order; when one fails, stop those already started (reverse order) and raise its
        error."""
        self._stopping = asyncio.Event()
        for part in self.parts:
            try:
                await part.start(self._stopping)
            except BaseException:
                await self._stop_started()
                raise
            self._started.append(part)

    async def stop(self) -> None:
        """Tell the loops to stop, then stop the started parts in the reverse order of their start (each even when
        an earlier one failed to stop; the first such error is raised at the end)."""
        failure = await self._stop_started()
        if failure is not None:
            raise failure

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[Node]:
        """``async with node.running():`` the node started, stopped on the way out."""
        await self.start()
        try:
            yield self
        finally:
            await self.stop()

    async def _stop_started(self) -> Exception | None:
        self._stopping.set()  # every loop ends its round in flight at once, not only when its turn to stop comes
        failure: Exception | None = None
        while self._started:
            part = self._started.pop()
            try:
                await part.stop()
            except Exception as error:
                log.exception("%s did not stop cleanly", part.name)
                failure = failure or error
        return failure

    def _lifespan_parts(self, manage_engine: bool, owns_store: bool,
                        confirmation_interval: float) -> tuple[NodePart, ...]:
        """The parts in start order. What must stop after the engine starts before it: the store's disposal and
        the WAL checkpoint last, the outbox's last round right after the engine; the channels start last, so they
        stop first (no new delivery while the rest stops)."""
        engine, store, outbox = self.engine, self.store, self.outbox
        parts: list[NodePart] = []
        if owns_store:
            parts.append(Step("store", end=functools.partial(asyncio.to_thread, store.dispose)))
        if manage_engine:
            # a clean stop leaves a SQLite store in one file: openroute.db alone is a complete copy
            parts.append(Step("wal-checkpoint", end=functools.partial(asyncio.to_thread, checkpoint_wal, store)))
        if outbox is not None:
            parts.append(Step("outbox", begin=outbox.start, end=functools.partial(_last_outbox_round, outbox)))
        if manage_engine:
            parts.append(Step("engine", begin=engine.start, end=engine.stop))
        if outbox is not None:
            parts.append(Loop("outbox-publisher", outbox.run, timeout=30.0))
        if self.confirmation is not None:
            confirmations = functools.partial(self.confirmation.run, confirmation_interval,
                                              paused=lambda: not engine.node_state.picks_up_work)
            parts.append(Loop("confirmations", confirmations, timeout=30.0))
        if self.retention is not None:
            parts.append(Loop("retention", self.retention.run))
        if self.alerts is not None:
            parts.append(Loop("alerts", self.alerts.run))
        parts.append(Loop("message-counts", self.counts.run))
        parts.append(Loop("payload-index", self.payload_indexer.run))
        if self.channels is not None:
            parts.append(Step("channels", begin=self.channels.start, end=self.channels.stop))
        return tuple(parts)

    @contextlib.asynccontextmanager
    async def _lifespan(self, _app: Starlette) -> AsyncIterator[None]:
        async with self.running():
            yield

    # -- hooks and the ASGI app ----------------------------------------------------------------------
    def _hook_final_states(self) -> None:
        """What a final state sets off: the metrics' counters; the outbox's events and the confirmation's row written
        in the transaction that makes the message final, each sent after its commit."""
        engine = self.engine
        engine.on_final_state(self.metrics.on_final_state)
        if self.outbox is not None:
            engine.on_final_state_in_transaction(self.outbox.writer())
            engine.on_final_state(self.outbox.on_final_state)
        if self.confirmation is not None:
            engine.on_final_states_in_transaction(self.confirmation.on_final_states_tx)
            engine.on_final_state(self.confirmation.on_final_state)
            # the claims and records of the sends that follow a final commit: in the engine's group commit (a service
            # given on another database keeps transactions of its own)
            if self.confirmation.engine.url == engine.store.engine.url:
                self.confirmation.write_through(engine.transact)

    def _asgi_app(self, admin_auth: AdminAuth | None, allowed_origins: Iterable[str],
                  mounts: Sequence[tuple[str, ASGIApp]]) -> Starlette:
        engine, channels = self.engine, self.channels
        console = Console(engine, admin_auth, allowed_origins=allowed_origins, channels=channels)
        routes: list[BaseRoute] = [
            *self.inbound.routes(), *self._asyncapi(), *self.admin.routes(), *self.metrics.routes(),
            health_route(engine, channels=None if channels is None else channels.health),
            Mount("/console", app=console.app()),
            *(Mount(path, app=mounted) for path, mounted in checked_mounts(mounts)),
        ]
        app = Starlette(
            routes=routes, lifespan=self._lifespan,
            # the inbound POSTs skip the security headers' middleware: the dispatch puts the same headers in their
            # answers
            middleware=[Middleware(InboundDispatch, endpoints=self.inbound, headers=RAW_SECURITY_HEADERS),
                        Middleware(SecurityHeaders)],
        )
        app.state.node = self
        for name in ("engine", "inbound", "admin", "metrics", "confirmation", "retention", "channels", "outbox",
                     "alerts", "counts", "payload_indexer"):
            setattr(app.state, name, getattr(self, name))
        return app

    def _asyncapi(self) -> list[BaseRoute]:
        """``GET {json_prefix}/asyncapi.json``: the AsyncAPI document of the channels this node consumes (none: a
        document without channels)."""
        channels = self.channels
        described = (lambda: []) if channels is None else channels.described
        return [*AsyncApiContract(described, self.engine.routes, prefix=self.inbound.settings.json_prefix).routes()]


async def _last_outbox_round(outbox: OutboxPublisher) -> None:
    """After the engine stopped: the final states of its last messages are published too (or left in the outbox
    for the next start), then the channels are closed."""
    try:
        await asyncio.wait_for(outbox.publish_once(), 10)
    except (TimeoutError, Exception):  # what is not confirmed stays in the outbox for the next start
        log.warning("outbox: events left unpublished at stop are published after the next start")
    await outbox.stop()
