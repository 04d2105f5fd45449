"""message counts kept by the store: ``message_count`` (per route and state, as of a mark) and its mark

Revision ID: 0014
Revises: 0013
Create Date: 2026-11-27 12:00:00

``/admin/counts`` and the console's dashboard counted the whole ``message`` table (85-136 ms at 1,000,000 rows,
about 1 s for the dashboard's two groupings). They now read ``message_count`` plus the transitions after its mark
(``persistence/counts.py``). The upgrade counts the table once, under a SHARE lock on ``message`` (writers wait
for about a second per million messages), and adds the delete trigger that takes a deleted message out of the
counts by appending a row to ``message_count_delta`` (a table without a key: concurrent deleters never wait for
each other), and, on PostgreSQL, the TRUNCATE triggers that reset the counts; on SQLite, the trigger that lowers
the mark when the highest transitions are deleted, because SQLite may then give their ids again.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from openroute.persistence.counts import recount

revision = "0014"
down_revision = "0013"

_STATE_AT_MARK = (  # the state a deleted message has in message_count: the one its first transition after the mark
    # left (NULL: stored after the mark, not in the table), or its state when it has no transition after the mark
    "CASE WHEN EXISTS (SELECT 1 FROM message_transition t WHERE t.message_id = OLD.id AND t.id > {mark}) "
    "THEN (SELECT t.from_state FROM message_transition t WHERE t.message_id = OLD.id AND t.id > {mark} "
    "ORDER BY t.id LIMIT 1) ELSE OLD.state END"
)

POSTGRES_UP = [
    """CREATE FUNCTION message_count_on_delete() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    mark bigint;
    counted varchar(32);
BEGIN
    -- shared: a fold (FOR UPDATE) waits until this transaction ends, so the mark stays the one used here
    SELECT transition_id INTO mark FROM message_count_mark WHERE id = 1 FOR SHARE;
    IF NOT FOUND THEN
        RETURN OLD;
    END IF;
    counted := """
    + _STATE_AT_MARK.format(mark="mark")
    + """;
    IF counted IS NOT NULL THEN  -- appended, never updated: concurrent deleters lock no common row
        INSERT INTO message_count_delta (service, operation, state, n) VALUES (OLD.service, OLD.operation, counted, -1);
    END IF;
    RETURN OLD;
END $$""",
    # BEFORE: the message's transitions are still there (the cascade deletes them after the row)
    "CREATE TRIGGER message_count_delete BEFORE DELETE ON message FOR EACH ROW "
    "EXECUTE FUNCTION message_count_on_delete()",
    """CREATE FUNCTION message_count_on_truncate() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_TABLE_NAME = 'message' THEN
        DELETE FROM message_count;
        DELETE FROM message_count_delta;
    END IF;
    UPDATE message_count_mark SET transition_id = 0, pending_id = NULL, pending_xmax = NULL;
    RETURN NULL;
END $$""",
    "CREATE TRIGGER message_count_truncate AFTER TRUNCATE ON message FOR EACH STATEMENT "
    "EXECUTE FUNCTION message_count_on_truncate()",
    "CREATE TRIGGER message_count_truncate AFTER TRUNCATE ON message_transition FOR EACH STATEMENT "
    "EXECUTE FUNCTION message_count_on_truncate()",
]
POSTGRES_DOWN = [
    "DROP TRIGGER message_count_truncate ON message_transition",
    "DROP TRIGGER message_count_truncate ON message",
    "DROP TRIGGER message_count_delete ON message",
    "DROP FUNCTION message_count_on_truncate()",
    "DROP FUNCTION message_count_on_delete()",
]

_SQLITE_MARK = "(SELECT transition_id FROM message_count_mark WHERE id = 1)"
_SQLITE_STATE = _STATE_AT_MARK.format(mark=_SQLITE_MARK)
_SQLITE_TOP = "(SELECT coalesce(max(id), 0) FROM message_transition)"
SQLITE_UP = [
    f"""CREATE TRIGGER message_count_delete BEFORE DELETE ON message FOR EACH ROW BEGIN
    INSERT INTO message_count_delta (service, operation, state, n)
        SELECT OLD.service, OLD.operation, s, -1 FROM (SELECT {_SQLITE_STATE} AS s) WHERE s IS NOT NULL;
END""",
    # SQLite gives a new row the highest id + 1: once the highest transitions are gone, their ids come again
    f"""CREATE TRIGGER message_count_transition_delete AFTER DELETE ON message_transition FOR EACH ROW
WHEN OLD.id <= {_SQLITE_MARK} BEGIN
    UPDATE message_count_mark SET transition_id = {_SQLITE_TOP} WHERE id = 1 AND transition_id > {_SQLITE_TOP};
END""",
]
SQLITE_DOWN = ["DROP TRIGGER message_count_transition_delete", "DROP TRIGGER message_count_delete"]


def upgrade() -> None:
    op.create_table(
        "message_count",
        sa.Column("service", sa.String(100), primary_key=True),
        sa.Column("operation", sa.String(100), primary_key=True),
        sa.Column("state", sa.String(32), primary_key=True),
        sa.Column("n", sa.BigInteger, nullable=False),
    )
    op.create_table(
        "message_count_mark",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("transition_id", sa.BigInteger, nullable=False),
        sa.Column("pending_id", sa.BigInteger),
        sa.Column("pending_xmax", sa.BigInteger),
        sa.Column("folded_at", sa.DateTime(timezone=True)),
    )
    op.create_table(  # no key: the delete trigger only appends to it (see persistence/counts.py)
        "message_count_delta",
        sa.Column("service", sa.String(100), nullable=False),
        sa.Column("operation", sa.String(100), nullable=False),
        sa.Column("state", sa.String(32), nullable=False),
        sa.Column("n", sa.BigInteger, nullable=False),
    )
    bind = op.get_bind()
    for statement in POSTGRES_UP if bind.dialect.name == "postgresql" else SQLITE_UP:
        op.execute(statement)
    recount(bind)


def downgrade() -> None:
    for statement in POSTGRES_DOWN if op.get_bind().dialect.name == "postgresql" else SQLITE_DOWN:
        op.execute(statement)
    op.drop_table("message_count_delta")
    op.drop_table("message_count_mark")
    op.drop_table("message_count")
