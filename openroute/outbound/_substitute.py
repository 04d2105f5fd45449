"""The HTTP client that reaches a faked external system: an ``httpx.AsyncClient`` on the ``transport`` of an
:class:`~openroute.outbound.ExternalSystem`, used by the shipped clients in place of the network."""

from __future__ import annotations

import httpx

from openroute.outbound.systems import ExternalSystem
from openroute.runtime import tracing

__all__ = ["substitute_client"]


def substitute_client(system: ExternalSystem | None) -> httpx.AsyncClient | None:
    """A client on ``system``'s transport; None when it has none (the network is used).

    A new client per call: it holds no connection of its own and is never closed, because closing it would close
    the transport, which outlives it (a fake serves every call of its test). No proxies from the environment: a
    proxy would take the request away from the fake."""
    if system is None or system.transport is None:
        return None
    return tracing.propagate_from(httpx.AsyncClient(transport=system.transport, trust_env=False))
