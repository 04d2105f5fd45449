"""The nodes of a cluster (``store.nodes``, a ``StorePart``): who runs, since when, its heartbeat and the state
an operator gave it."""

from __future__ import annotations

import os
import socket
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from openroute.persistence.database import StorePart
from openroute.persistence.models import NodeState, node_table

__all__ = ["NodeStore"]


class NodeStore(StorePart):
    """The ``node`` table of ``database``."""

    def register(self, node_id: str, now: datetime, connection: sa.Connection | None = None) -> None:
        """Record that ``node_id`` (re)started now on this host and process."""
        values = {"host": socket.gethostname(), "pid": os.getpid(), "started_at": now, "heartbeat_at": now}
        statement = self.database.upsert(node_table).values(id=node_id, stopped_at=None, **values)
        statement = statement.on_conflict_do_update(index_elements=["id"], set_={**values, "stopped_at": None})
        self.database.run(lambda conn: conn.execute(statement), connection)

    def heartbeat(self, node_id: str, now: datetime, connection: sa.Connection | None = None) -> NodeState | None:
        """Refresh the heartbeat of ``node_id``; returns the state an operator gave it (None: no such node)."""
        statement = sa.update(node_table).where(node_table.c.id == node_id).values(heartbeat_at=now)

        def work(conn: sa.Connection) -> NodeState | None:
            conn.execute(statement)
            return self.state_of(node_id, conn)

        return self.database.run(work, connection)

    def state_of(self, node_id: str, connection: sa.Connection | None = None) -> NodeState | None:
        """The state of ``node_id`` (None: no such node)."""
        query = sa.select(node_table.c.state).where(node_table.c.id == node_id)
        state = self.database.run(lambda conn: conn.execute(query).scalar_one_or_none(), connection)
        return None if state is None else NodeState(state)

    def set_state(self, node_id: str, state: NodeState, connection: sa.Connection | None = None) -> bool:
        """Give ``node_id`` the ``state`` (an operator's decision, kept across restarts); False: no such node."""
        statement = sa.update(node_table).where(node_table.c.id == node_id).values(state=NodeState(state))
        return bool(self.database.run(lambda conn: conn.execute(statement).rowcount, connection))

    def all(self, connection: sa.Connection | None = None) -> list[dict[str, Any]]:
        """Every node ever registered (id, host, pid, started_at, heartbeat_at, stopped_at, state), by id."""
        query = sa.select(node_table).order_by(node_table.c.id)
        return self.database.run(lambda conn: [dict(row._mapping) for row in conn.execute(query)], connection)

    def working(self, since: datetime, connection: sa.Connection | None = None) -> list[str]:
        """The ids of the nodes that pick up work (not STOPPED, not stopped) and beat since ``since``, in order."""
        n = node_table.c
        query = (sa.select(n.id)
                 .where(n.heartbeat_at >= since, n.stopped_at.is_(None), n.state != NodeState.STOPPED)
                 .order_by(n.id))
        return self.database.run(lambda conn: list(conn.execute(query).scalars()), connection)

    def stopped(self, node_id: str, now: datetime, connection: sa.Connection | None = None) -> None:
        """Record an orderly stop of ``node_id``."""
        statement = sa.update(node_table).where(node_table.c.id == node_id).values(heartbeat_at=now, stopped_at=now)
        self.database.run(lambda conn: conn.execute(statement), connection)
