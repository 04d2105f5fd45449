"""the outbox: outcome events written in the transaction of a state change, published to a channel after it

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-25 19:50:00
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from openroute.persistence.migrations._columns import BIG_ID

revision = "0010"
down_revision = "0009"


def upgrade() -> None:
    op.create_table(
        "outbox",
        sa.Column("id", BIG_ID, primary_key=True, autoincrement=True),
        sa.Column("event_id", sa.String(36), nullable=False),
        sa.Column("channel", sa.String(255), nullable=False),
        sa.Column("message_id", BIG_ID, nullable=False),
        sa.Column("payload", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("next_attempt_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("lease_node", sa.String(100), nullable=True),
        sa.Column("lease_until", sa.DateTime(timezone=True), nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.UniqueConstraint("event_id", name="uq_outbox_event_id"),
    )
    op.create_index("ix_outbox_next_attempt", "outbox", ["next_attempt_at"])
    op.create_index("ix_outbox_message", "outbox", ["message_id", "id"])


def downgrade() -> None:
    op.drop_index("ix_outbox_message", table_name="outbox")
    op.drop_index("ix_outbox_next_attempt", table_name="outbox")
    op.drop_table("outbox")
