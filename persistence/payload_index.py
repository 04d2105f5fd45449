"""The payload search's index, written behind the commit (``store.payload_index``; PostgreSQL, migration 0018).

A trigram index costs its writer about 0.16 ms of database CPU per kB of text (docs/performance.md): written in the
transaction that stores a message, it capped how fast a node accepts (2.8 kB SOAP requests: 1,300 against 2,500 per
second without it). So the index covers a copy of each payload, ``message_payload_text``, and the storing
transaction only adds the message's id to ``message_payload_pending`` (a trigger on ``message``, so every way of
storing a message does). :meth:`PayloadIndex.move` copies pending messages into the indexed table a batch at a
time, in a session of its own; every node runs it (``openroute run``,
:class:`openroute.jobs.payload_indexer.PayloadIndexer`) and several may at once: each takes the pending rows it
deletes with ``FOR UPDATE SKIP LOCKED``, and the copy and the delete commit together, so a node killed mid-move
leaves the batch pending. A payload search asks the copy's index
and checks the payloads of the messages still pending (``openroute.queries.search``): it finds a message from the
moment it is stored.

SQLite has no trigram index: nothing is pending there and both tables stay empty::

    moved = store.payload_index.move()      # messages copied and indexed now (0: none was pending)
    behind = store.payload_index.pending()  # messages stored and not yet copied
"""

from __future__ import annotations

import sqlalchemy as sa
from openroute.persistence.database import Database, StorePart
from openroute.persistence.models import message_payload_pending_table

__all__ = ["MOVE_BATCH", "PayloadIndex"]

#: pending messages one :meth:`PayloadIndex.move` copies at most by default (one transaction)
MOVE_BATCH = 2000

# one statement: the batch's pending rows deleted (locked, skipping those another mover holds) and their messages'
# payloads copied; a pending id whose message is gone copies nothing; a copy already there is kept. Each payload is
# read by its message's primary key (a LATERAL subquery, OFFSET 0 keeps it one): as a join, a store whose message
# table was never analyzed (a fresh one, or one that grew since) had the planner hash the whole table for every
# batch (20,000 messages: 308 estimated, every pass of the indexer a sequential scan of all of them)
_MOVE = sa.text(
    "WITH taken AS (DELETE FROM message_payload_pending WHERE message_id IN ("
    "SELECT message_id FROM message_payload_pending ORDER BY message_id LIMIT :batch FOR UPDATE SKIP LOCKED) "
    "RETURNING message_id), "
    "copied AS (INSERT INTO message_payload_text (message_id, payload) "
    "SELECT m.id, m.payload FROM taken t CROSS JOIN LATERAL ("
    "SELECT message.id, message.payload FROM message WHERE message.id = t.message_id OFFSET 0) m "
    "ON CONFLICT DO NOTHING) "
    "SELECT count(*) FROM taken"
)


class PayloadIndex(StorePart):
    """The copies of the payloads that the payload search's trigram index covers (see the module docstring)."""

    def __init__(self, database: Database, batch: int = MOVE_BATCH) -> None:
        if batch < 1:
            raise ValueError(f"batch must be >= 1, got {batch}")
        super().__init__(database)
        #: pending messages one :meth:`move` copies at most
        self.batch = batch
        #: whether the store has the index (PostgreSQL); on SQLite nothing is ever pending
        self.postgresql = database.engine.dialect.name == "postgresql"

    def move(self, connection: sa.Connection | None = None) -> int:
        """Copy up to :attr:`batch` pending messages' payloads into ``message_payload_text``, in one transaction;
        how many pending rows were taken (a full batch: more may be waiting). 0 on SQLite."""
        if not self.postgresql:
            return 0
        return self.database.run(lambda conn: int(conn.execute(_MOVE, {"batch": self.batch}).scalar_one()),
                                 connection)

    def pending(self, connection: sa.Connection | None = None) -> int:
        """How many stored messages are not copied yet (0 on SQLite)."""
        if not self.postgresql:
            return 0
        count = sa.select(sa.func.count()).select_from(message_payload_pending_table)
        return self.database.run(lambda conn: int(conn.execute(count).scalar_one()), connection)
