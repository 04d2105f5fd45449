"""The payload search's index behind the commit (``persistence/payload_index.py``, ``store.payload_index``;
PostgreSQL, migration 0018): moves from several sessions copy each message once, and a mover killed mid-move leaves
its batch pending. The search over the index and the node's indexer are tests/admin/test_payload_index.py."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from datetime import timedelta
from typing import Any

import sqlalchemy as sa
from openroute.persistence import MessageStore, NewMessage, payload_index

from tests.persistence.conftest import START


def _new(n: int) -> NewMessage:
    return NewMessage(service="crm", operation="order", payload=f'<order id="{n}"><line>plain</line></order>',
                      content_type="text/xml", correlation_id=f"c-{n}", source_system="shop",
                      receive_ts=START + timedelta(seconds=n))


def _copies(store: MessageStore) -> dict[int, str]:
    with store.engine.connect() as connection:
        return dict(connection.execute(sa.text("SELECT message_id, payload FROM message_payload_text")).all())


def test_moves_from_several_sessions_copy_each_message_once(postgres_store: MessageStore) -> None:
    """Four threads move 5,000 pending messages at once: none waits for another's batch (SKIP LOCKED), every
    message is copied exactly once, nothing stays pending."""
    store = postgres_store
    store.insert_messages([_new(n) for n in range(5000)])
    taken: list[int] = []
    lock = threading.Lock()

    def mover() -> None:
        while moved := store.payload_index.move():
            with lock:
                taken.append(moved)

    threads = [threading.Thread(target=mover) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert sum(taken) == 5000 and store.payload_index.pending() == 0
    with store.engine.connect() as connection:
        rows = connection.execute(sa.text(
            "SELECT count(*), count(DISTINCT t.message_id), count(*) FILTER (WHERE t.payload = m.payload) "
            "FROM message_payload_text t JOIN message m ON m.id = t.message_id")).one()
    assert tuple(rows) == (5000, 5000, 5000)


_MOVE_THEN_HANG = """
import sys, time
from openroute.persistence import MessageStore
store = MessageStore(sys.argv[1])
with store.engine.begin() as connection:
    print(store.payload_index.move(connection), flush=True)
    time.sleep(60)
"""


def _open_transactions(store: MessageStore) -> int:
    """Other sessions of the store's database in an open transaction."""
    with store.engine.connect() as connection:
        return int(connection.execute(sa.text(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid() "
            "AND state LIKE 'idle in transaction%'")).scalar_one())


def test_a_mover_killed_mid_move_leaves_its_batch_pending(postgres_store: MessageStore) -> None:
    """A process that moved a batch and is killed (SIGKILL) before its commit: the batch is pending again, no copy
    is left, and the next move copies it."""
    store = postgres_store
    store.insert_messages([_new(n) for n in range(300)])
    child = subprocess.Popen([sys.executable, "-c", _MOVE_THEN_HANG, store.url], stdout=subprocess.PIPE, text=True,
                             env={**os.environ, "PYTHONPATH": os.getcwd()})
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "300"  # moved in its open transaction
        with store.engine.connect() as connection:  # not visible to others: still pending, nothing copied
            assert connection.execute(sa.text("SELECT count(*) FROM message_payload_text")).scalar_one() == 0
        child.send_signal(signal.SIGKILL)
        child.wait(10)
    finally:
        if child.poll() is None:
            child.kill()
    # the server ends the killed session's transaction once it sees the socket closed; until then its batch is
    # locked (another mover skips it) and still pending for a search
    assert store.payload_index.pending() == 300 and _copies(store) == {}
    deadline = time.monotonic() + 10
    while _open_transactions(store) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _open_transactions(store) == 0
    assert store.payload_index.pending() == 300 and _copies(store) == {}
    assert store.payload_index.move() == 300 and len(_copies(store)) == 300


def test_a_move_reads_each_payload_by_its_primary_key_on_a_never_analyzed_store(postgres_store: MessageStore) -> None:
    """A move reads the payloads of its batch by the messages' primary key, however many messages the store holds:
    as a join, a message table never analyzed (a fresh store) was hashed whole for every batch, a sequential scan of
    every message every pass of the indexer."""
    store = postgres_store
    ids = [outcome.message.id for outcome in store.insert_messages([_new(n) for n in range(3000)])]
    with store.engine.begin() as connection:  # the older ones moved already, as with an indexer keeping up
        connection.execute(sa.text("DELETE FROM message_payload_pending WHERE message_id <= :last"),
                           {"last": ids[-101]})
    statement = payload_index._MOVE.text.replace(":batch", str(store.payload_index.batch))
    with store.engine.connect() as connection:
        plan = connection.exec_driver_sql(f"EXPLAIN (ANALYZE, FORMAT JSON) {statement}").scalar_one()
        connection.rollback()

    def nodes(node: dict[str, Any]) -> list[dict[str, Any]]:
        return [node, *(below for child in node.get("Plans", []) for below in nodes(child))]

    reads = [node for node in nodes(plan[0]["Plan"]) if node.get("Relation Name") == "message"]
    assert [node["Node Type"] for node in reads] == ["Index Scan"], plan
    assert reads[0]["Actual Loops"] * reads[0]["Actual Rows"] == 100, plan
    assert store.payload_index.move() == 100 and len(_copies(store)) == 100
