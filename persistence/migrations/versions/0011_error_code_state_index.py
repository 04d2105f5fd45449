"""search by error code and state: a partial index (last_error_code, state, receive_ts) of the messages with an error

Without it, an error code combined with a state that none of its messages has (e.g. ``HLR_DOWN`` and ``OK``)
read every message of the code from the heap to find none: 20,000 rows at 1M messages. With it the state is
checked in the index and the capped count is an index-only scan. Partial (``last_error_code IS NOT NULL``), so
the messages without an error, most of a store, cost it nothing on write.

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-25 23:20:00
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"

_WITH_ERROR = sa.text("last_error_code IS NOT NULL")


def upgrade() -> None:
    with op.batch_alter_table("message") as batch_op:
        batch_op.create_index("ix_message_error_code_state", ["last_error_code", "state", "receive_ts"],
                              unique=False, postgresql_where=_WITH_ERROR, sqlite_where=_WITH_ERROR)


def downgrade() -> None:
    with op.batch_alter_table("message") as batch_op:
        batch_op.drop_index("ix_message_error_code_state")
