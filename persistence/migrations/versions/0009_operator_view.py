"""current error apart from history; search by error code, error text and payload text; step tracebacks

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-25 20:00:00

- ``message.last_error_trace``: the traceback of the unexpected error of the current state (truncated).
- ``message_transition.error_text`` / ``error_trace``: each change keeps its own error (the history), so the
  message row holds the current state's error only. Messages that ended OK lose the error of an earlier failed
  attempt (it stays in their transition rows from now on; older rows keep its code there).
- ``ix_message_error_code``: search by error code, newest first.
- PostgreSQL: the ``pg_trgm`` extension and GIN trigram indexes on ``payload`` and ``last_error_text`` (search by
  text inside them with ``ILIKE '%...%'``). SQLite has no such index: its text search scans (docs/console.md).
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from openroute.persistence.migrations._columns import drop_columns

revision = "0009"
down_revision = "0008"


def upgrade() -> None:
    with op.batch_alter_table("message", schema=None) as batch_op:
        batch_op.add_column(sa.Column("last_error_trace", sa.Text(), nullable=True))
        batch_op.create_index("ix_message_error_code", ["last_error_code", "receive_ts"], unique=False)
    with op.batch_alter_table("message_transition", schema=None) as batch_op:
        batch_op.add_column(sa.Column("error_text", sa.Text(), nullable=True))
        batch_op.add_column(sa.Column("error_trace", sa.Text(), nullable=True))
    # the current state's error only: an OK message has none (its failed attempts stay in message_transition)
    op.execute("UPDATE message SET last_error_code = NULL, last_error_text = NULL "
               "WHERE state = 'OK' AND (last_error_code IS NOT NULL OR last_error_text IS NOT NULL)")
    if op.get_bind().dialect.name == "postgresql":
        op.execute("CREATE EXTENSION IF NOT EXISTS pg_trgm")
        op.create_index("ix_message_payload_trgm", "message", ["payload"], postgresql_using="gin",
                        postgresql_ops={"payload": "gin_trgm_ops"})
        op.create_index("ix_message_error_text_trgm", "message", ["last_error_text"], postgresql_using="gin",
                        postgresql_ops={"last_error_text": "gin_trgm_ops"})


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.drop_index("ix_message_error_text_trgm", table_name="message")
        op.drop_index("ix_message_payload_trgm", table_name="message")
    drop_columns("message_transition", "error_trace", "error_text")
    with op.batch_alter_table("message", schema=None) as batch_op:
        batch_op.drop_index("ix_message_error_code")
        batch_op.drop_column("last_error_trace")
