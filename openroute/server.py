"""The Starlette application of one node: inbound SOAP/JSON endpoints, admin API, ``/metrics`` and ``/health``.

The node is put together in one place, :class:`openroute.node.Node`; :func:`create_app` is its ASGI app for the
callers that hand over ready parts. Finding the application to serve is :mod:`openroute.loading`'s job, the
``openroute run`` command :mod:`openroute.commands.run`'s.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

from starlette.applications import Starlette
from starlette.types import ASGIApp

from openroute.admin import MessageCounts
from openroute.admin.payload_indexer import PayloadIndexer
from openroute.engine import Engine
from openroute.inbound import AdminAuth, InboundBinding, InboundSettings, SourceSystemAuth
from openroute.node import Node
from openroute.node_parts import channel_inbound, checkpoint_wal, inbound_throttling
from openroute.retention import RetentionPolicy

if TYPE_CHECKING:
    from openroute.alerts import AlertEvaluator
    from openroute.confirmation import ConfirmationService
    from openroute.engine.outbox import OutboxPublisher
    from openroute.inbound.channel import ChannelInbound
    from openroute.inbound.throttling import Throttling

__all__ = ["channel_inbound", "checkpoint_wal", "create_app", "inbound_throttling"]


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
) -> Starlette:
    """The ASGI app serving ``engine``'s routes with the parts given: ``Node(engine, bindings, ...).app`` (the
    parameters, ``app.state`` and the lifespan are :class:`~openroute.node.Node`'s)."""
    return Node(engine, bindings, inbound_auth=inbound_auth, admin_auth=admin_auth, settings=settings,
                channel_counters=channel_counters, manage_engine=manage_engine, confirmation=confirmation,
                confirmation_interval=confirmation_interval, mounts=mounts, retention=retention, channels=channels,
                outbox=outbox, allowed_origins=allowed_origins, metrics_auth=metrics_auth, alerts=alerts,
                throttling=throttling, counts=counts, payload_indexer=payload_indexer).app
