"""The nodes of a cluster (``persistence/nodes.py``, ``store.nodes``): registration, heartbeat, an operator's state
and an orderly stop, as rows of the ``node`` table on each real database."""

from __future__ import annotations

import os
import socket
from datetime import timedelta

import sqlalchemy as sa
from openroute.persistence import MessageStore, NodeState, node_table

from tests.persistence.conftest import START, rows


def test_nodes_are_registered(store: MessageStore) -> None:
    store.nodes.register("n1", START)
    store.nodes.heartbeat("n1", START + timedelta(seconds=5))
    store.nodes.stopped("n1", START + timedelta(seconds=9))
    store.nodes.register("n1", START + timedelta(seconds=10))
    with store.begin() as connection:
        row = connection.execute(sa.text("select heartbeat_at, stopped_at from node where id = 'n1'")).one()
    assert row.stopped_at is None


def test_a_node_s_row_follows_its_start_heartbeat_and_stop(store: MessageStore) -> None:
    store.nodes.register("n1", START)
    assert rows(store, node_table) == [{
        "id": "n1", "host": socket.gethostname(), "pid": os.getpid(), "started_at": START, "heartbeat_at": START,
        "stopped_at": None, "state": NodeState.RUN}]

    assert store.nodes.heartbeat("n1", START + timedelta(seconds=5)) is NodeState.RUN
    assert store.nodes.heartbeat("unknown", START) is None
    store.nodes.stopped("n1", START + timedelta(seconds=9))
    [stopped] = rows(store, node_table)
    assert (stopped["heartbeat_at"], stopped["stopped_at"]) == (START + timedelta(seconds=9),) * 2

    store.nodes.register("n1", START + timedelta(seconds=10))  # restarted: the same row, running again
    [again] = rows(store, node_table)
    assert (again["started_at"], again["heartbeat_at"], again["stopped_at"]) == (
        START + timedelta(seconds=10), START + timedelta(seconds=10), None)
    assert store.nodes.all() == [again]


def test_an_operator_s_state_is_kept_across_a_restart_and_decides_who_works(store: MessageStore) -> None:
    for node_id in ("n1", "n2", "n3"):
        store.nodes.register(node_id, START)
    assert store.nodes.set_state("n2", NodeState.STOPPED)
    assert store.nodes.set_state("n3", NodeState.HANDLES_EXISTING_MESSAGES)
    assert not store.nodes.set_state("unknown", NodeState.STOPPED)
    store.nodes.register("n2", START + timedelta(seconds=1))

    assert [(row["id"], row["state"]) for row in rows(store, node_table, node_table.c.id)] == [
        ("n1", NodeState.RUN), ("n2", NodeState.STOPPED), ("n3", NodeState.HANDLES_EXISTING_MESSAGES)]
    assert store.nodes.state_of("n2") is NodeState.STOPPED
    assert store.nodes.working(START) == ["n1", "n3"]
    store.nodes.stopped("n3", START + timedelta(seconds=2))
    store.nodes.heartbeat("n1", START + timedelta(seconds=2))
    assert store.nodes.working(START + timedelta(seconds=1)) == ["n1"]
