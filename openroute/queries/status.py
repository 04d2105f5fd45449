"""The read model's view of the nodes and the circuit breakers: the JSON forms the admin API answers with and the
console's nodes page shows, and the node state an operator may set.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

from openroute.definitions.errors import OpenrouteError
from openroute.persistence import NodeState
from openroute.persistence.breaker import BreakerRow
from openroute.queries.filters import InvalidQueryError

__all__ = ["NodeNotFoundError", "breaker_summary", "node_summary", "parse_node_state"]


class NodeNotFoundError(OpenrouteError, LookupError):
    """No node with that id (HTTP 404)."""

    code = "NOT_FOUND"


def node_summary(node: Mapping[str, Any], now: datetime, heartbeat_interval: timedelta) -> dict[str, Any]:
    """The JSON form of a node row; ``alive`` when not stopped and heard from within three heartbeats."""
    heartbeat = node["heartbeat_at"]
    alive = node["stopped_at"] is None and heartbeat is not None and now - heartbeat <= 3 * heartbeat_interval
    return {
        "id": node["id"],
        "host": node["host"],
        "pid": node["pid"],
        "state": str(node["state"]),
        "alive": alive,
        "startedAt": _iso(node["started_at"]),
        "heartbeatAt": _iso(heartbeat),
        "stoppedAt": _iso(node["stopped_at"]),
    }


def breaker_summary(row: BreakerRow, now: datetime, declared: bool = True) -> dict[str, Any]:
    """The JSON form of one breaker."""
    return {
        "system": row.system,
        "state": row.state.value,
        "since": row.changed_at.isoformat(),
        "openUntil": None if row.open_until is None else row.open_until.isoformat(),
        "forced": row.forced,
        "reason": row.reason,
        "trialsInFlight": len(row.trials),
        "trialSuccesses": row.trial_successes,
        "declared": declared,
    }


def parse_node_state(value: Any) -> NodeState:
    """The :class:`NodeState` named by ``value``; InvalidQueryError for anything else."""
    try:
        return NodeState(str(value).upper()) if isinstance(value, str) else NodeState(value)
    except ValueError:
        raise InvalidQueryError(
            f"state must be one of {[s.value for s in NodeState]}, got {str(value)[:60]!r}"
        ) from None


def _iso(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()
