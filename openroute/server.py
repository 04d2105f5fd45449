"""The Starlette application of one node: inbound SOAP/JSON endpoints, admin API, ``/metrics`` and ``/health``.

The node is put together in one place, :class:`openroute.node.Node`; :func:`create_app` is its ASGI app for the
callers that hand over ready parts. Finding the application to serve is :mod:`openroute.loading`'s job, the
``openroute run`` command :mod:`openroute.commands.run`'s.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Unpack

from starlette.applications import Starlette

from openroute.engine import Engine
from openroute.inbound import InboundBinding
from openroute.node import Node, NodeOptions
from openroute.node_parts import channel_inbound, checkpoint_wal, inbound_throttling

__all__ = ["channel_inbound", "checkpoint_wal", "create_app", "inbound_throttling"]


def create_app(engine: Engine, bindings: Iterable[InboundBinding] | None = None,
               **parts: Unpack[NodeOptions]) -> Starlette:
    """The ASGI app serving ``engine``'s routes with the parts given: ``Node(engine, bindings, **parts).app`` (the
    parameters, :class:`~openroute.node.NodeOptions`, ``app.state`` and the lifespan are
    :class:`~openroute.node.Node`'s)."""
    return Node(engine, bindings, **parts).app
