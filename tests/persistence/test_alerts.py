"""The shared state of the alert rules (``persistence/alerts.py``, ``AlertStateStore``): one ``alert_state`` row per
rule, its evaluation lease held by one node at a time and its state written only by the lease's holder, on each real
database."""

from __future__ import annotations

from datetime import timedelta

from openroute.persistence import MessageStore
from openroute.persistence.alerts import AlertState, AlertStateStore
from openroute.persistence.models import alert_state_table

from tests.persistence.conftest import START, rows

PERIOD = timedelta(minutes=1)


def test_one_node_at_a_time_holds_a_rule_s_lease(store: MessageStore) -> None:
    alerts = AlertStateStore(store)
    assert alerts.take_lease("backlog", "node-a", START, START + PERIOD) == AlertState("backlog")
    assert alerts.take_lease("backlog", "node-b", START + PERIOD / 2, START + PERIOD * 1.5) is None
    [row] = rows(store, alert_state_table)
    assert (row["rule"], row["firing"], row["lease_owner"], row["lease_until"]) == (
        "backlog", False, "node-a", START + PERIOD)

    # once the lease ran out another node takes it, with the state the first one saved
    fired = AlertState("backlog", firing=True, value=120, fired_at=START, notified_at=START, evaluated_at=START)
    assert alerts.save(fired, "node-a")
    assert alerts.take_lease("backlog", "node-b", START + PERIOD, START + PERIOD * 2) == fired
    [row] = rows(store, alert_state_table)
    assert (row["lease_owner"], row["lease_until"], row["firing"], row["value"]) == (
        "node-b", START + PERIOD * 2, True, 120)


def test_only_the_lease_s_holder_writes_the_rule_s_state(store: MessageStore) -> None:
    alerts = AlertStateStore(store)
    alerts.take_lease("backlog", "node-a", START, START + PERIOD)
    alerts.take_lease("failures", "node-b", START, START + PERIOD)
    assert not alerts.save(AlertState("backlog", firing=True, value=9), "node-b")
    assert alerts.save(AlertState("failures", firing=True, value=3, fired_at=START), "node-b")

    assert [(row["rule"], row["firing"], row["value"], row["fired_at"]) for row in alerts.all()] == [
        ("backlog", False, None, None), ("failures", True, 3, START)]
    assert alerts.all() == rows(store, alert_state_table, alert_state_table.c.rule)
