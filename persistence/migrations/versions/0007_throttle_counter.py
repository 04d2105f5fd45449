"""throttling counters shared by all nodes: one row per source system, operation and fixed window

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-25 20:10:00
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"


def upgrade() -> None:
    op.create_table(
        "throttle_counter",
        sa.Column("source_system", sa.String(length=100), nullable=False),
        sa.Column("operation", sa.String(length=100), nullable=False),
        sa.Column("window_start", sa.BigInteger(), nullable=False),
        sa.Column("count", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("source_system", "operation", "window_start"),
    )


def downgrade() -> None:
    op.drop_table("throttle_counter")
