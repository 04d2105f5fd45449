"""The shared state of alert rules: one row per rule holding the evaluation lease (exactly one node evaluates a rule
per period) and whether the rule fires, so a notification is sent once however many nodes run."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from openroute.persistence.models import alert_state_table
from openroute.persistence.store import MessageStore

__all__ = ["AlertState", "AlertStateStore"]


@dataclass(frozen=True)
class AlertState:
    """The stored state of one rule (a rule never evaluated is not firing)."""

    rule: str
    firing: bool = False
    value: int | None = None
    fired_at: datetime | None = None
    notified_at: datetime | None = None
    resolved_at: datetime | None = None
    evaluated_at: datetime | None = None

    def values(self) -> dict[str, Any]:
        """The state columns (not the lease)."""
        return {"firing": self.firing, "value": self.value, "fired_at": self.fired_at,
                "notified_at": self.notified_at, "resolved_at": self.resolved_at, "evaluated_at": self.evaluated_at}


class AlertStateStore:
    """The ``alert_state`` table of ``store``."""

    def __init__(self, store: MessageStore) -> None:
        self.store = store

    def take_lease(self, rule: str, node_id: str, now: datetime, until: datetime) -> AlertState | None:
        """Take the evaluation of ``rule`` for this period (until ``until``) if no node holds it now; returns the
        rule's state when this node won, None when another node evaluates it this period."""
        table = alert_state_table
        with self.store.begin() as connection:
            try:
                with connection.begin_nested():
                    connection.execute(sa.insert(table).values(rule=rule, firing=False, lease_owner=node_id,
                                                               lease_until=until))
                won = True
            except sa.exc.IntegrityError:  # the row exists: take the lease only if it ran out
                won = connection.execute(
                    sa.update(table).where(table.c.rule == rule,
                                           sa.or_(table.c.lease_until.is_(None), table.c.lease_until <= now))
                    .values(lease_owner=node_id, lease_until=until)
                ).rowcount == 1
            if not won:
                return None
            row = connection.execute(sa.select(table).where(table.c.rule == rule)).one()
        return AlertState(rule, bool(row.firing), row.value, row.fired_at, row.notified_at, row.resolved_at,
                          row.evaluated_at)

    def save(self, state: AlertState, node_id: str) -> bool:
        """Write ``state`` if this node still holds the rule's lease; False (nothing written) otherwise."""
        table = alert_state_table
        with self.store.begin() as connection:
            return connection.execute(
                sa.update(table).where(table.c.rule == state.rule, table.c.lease_owner == node_id)
                .values(**state.values())
            ).rowcount == 1

    def all(self) -> list[dict[str, Any]]:
        """Every rule's stored row."""
        query = sa.select(alert_state_table).order_by(alert_state_table.c.rule)
        return self.store.run(lambda c: [dict(r._mapping) for r in c.execute(query)])
