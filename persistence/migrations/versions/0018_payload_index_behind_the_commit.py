"""the payload search's trigram index behind the commit: ``message_payload_text`` (a copy of each payload, which the
index covers) filled from ``message_payload_pending`` (the messages stored since), in place of the index on
``message.payload``

Revision ID: 0018
Revises: 0017
Create Date: 2026-11-28 08:30:00

The trigram index on ``message.payload`` (migration 0009) was written in the transaction that stores the message,
by the group-commit writer's one database session: its cost grows with the payload's distinct trigrams (about
0.16 ms of database CPU per kB on the machine of docs/performance.md) and capped how fast a node accepts (a 2.8 kB
SOAP request: 1,300 against 2,500 accepted per second without it; 12 kB: 420 against 1,300). Now, on PostgreSQL,
a trigger on ``message`` adds each stored message's id to ``message_payload_pending`` in the storing transaction
(a primary-key entry, no text), and the nodes move the pending messages into ``message_payload_text`` a batch at a
time in their own sessions (``openroute.persistence.payload_index``). A payload search asks the index of
``message_payload_text`` and checks the payloads of the messages still pending (``openroute.queries.search``), so it
finds a message from the moment it is stored, as before.

The upgrade creates the trigger first (its lock holds the writers off until the upgrade commits, so no message is
stored between the copy and the trigger), copies every stored payload, builds the index on the copy and drops the
old one: on a large store this takes as long as building the old index did (run it in a quiet hour). Deleting a
message deletes its copy (``ON DELETE CASCADE``); a pending id whose message is gone is dropped by the next move.
SQLite has no trigram index: it gets both tables, left empty, and its search keeps reading ``message.payload``.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from openroute.persistence.migrations._columns import BIG_ID

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None

#: kB of new entries the trigram index keeps apart before merging them in (migration 0013's value)
PENDING_LIST_KB = 128

POSTGRES_UP = [
    """CREATE FUNCTION message_payload_queue() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    -- a stale id (left by a TRUNCATE ... RESTART IDENTITY, the pending table having no key to message) is kept
    INSERT INTO message_payload_pending (message_id) VALUES (NEW.id) ON CONFLICT DO NOTHING;
    RETURN NULL;
END $$""",
    "CREATE TRIGGER message_payload_queue AFTER INSERT ON message FOR EACH ROW "
    "EXECUTE FUNCTION message_payload_queue()",
    "INSERT INTO message_payload_text (message_id, payload) SELECT id, payload FROM message",
]
POSTGRES_DOWN = [
    "DROP TRIGGER message_payload_queue ON message",
    "DROP FUNCTION message_payload_queue()",
]


def upgrade() -> None:
    op.create_table(
        "message_payload_pending",
        sa.Column("message_id", BIG_ID, autoincrement=False, nullable=False),
        sa.PrimaryKeyConstraint("message_id"),
    )
    op.create_table(
        "message_payload_text",
        sa.Column("message_id", BIG_ID, autoincrement=False, nullable=False),
        sa.Column("payload", sa.Text(), nullable=False),
        sa.ForeignKeyConstraint(["message_id"], ["message.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("message_id"),
    )
    if op.get_bind().dialect.name != "postgresql":
        return
    for statement in POSTGRES_UP:
        op.execute(statement)
    op.create_index("ix_message_payload_text_trgm", "message_payload_text", ["payload"], postgresql_using="gin",
                    postgresql_ops={"payload": "gin_trgm_ops"},
                    postgresql_with={"gin_pending_list_limit": PENDING_LIST_KB})
    op.drop_index("ix_message_payload_trgm", table_name="message")
    op.execute("ANALYZE message_payload_text")  # the planner's statistics of the copy, before the first search


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.create_index("ix_message_payload_trgm", "message", ["payload"], postgresql_using="gin",
                        postgresql_ops={"payload": "gin_trgm_ops"},
                        postgresql_with={"gin_pending_list_limit": PENDING_LIST_KB})
        for statement in POSTGRES_DOWN:
            op.execute(statement)
        op.drop_index("ix_message_payload_text_trgm", table_name="message_payload_text")
    op.drop_table("message_payload_text")
    op.drop_table("message_payload_pending")
