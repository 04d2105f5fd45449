"""entity-scoped external calls and funnel locks

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-22 23:20:00
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

from openroute.persistence.migrations._columns import BIG_ID

revision = "0002"
down_revision = "0001"


def upgrade() -> None:
    op.create_table(
        "entity_call",
        sa.Column("id", BIG_ID, autoincrement=True, nullable=False),
        sa.Column("entity_type", sa.String(length=100), nullable=False),
        sa.Column("object_id", sa.String(length=255), nullable=False),
        sa.Column("call_key", sa.String(length=255), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("owner_message_id", BIG_ID, nullable=True),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("result", sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
                  nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("entity_type", "object_id", "call_key", name="uq_entity_call_entity_key"),
    )
    op.create_table(
        "funnel_lock",
        sa.Column("funnel_value", sa.String(length=255), nullable=False),
        sa.Column("message_id", BIG_ID, nullable=False),
        sa.Column("acquired_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("funnel_value"),
    )


def downgrade() -> None:
    op.drop_table("funnel_lock")
    op.drop_table("entity_call")
