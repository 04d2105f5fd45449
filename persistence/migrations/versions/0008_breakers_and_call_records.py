"""circuit breaker state per external system, records of external calls, alert rule state

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-25 20:00:00
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

from openroute.persistence.migrations._columns import BIG_ID

revision = "0008"
down_revision = "0007"

Json = sa.JSON().with_variant(JSONB(), "postgresql")


def upgrade() -> None:
    op.create_table(
        "circuit_breaker",
        sa.Column("system", sa.String(100), primary_key=True),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("changed_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("open_until", sa.DateTime(timezone=True), nullable=True),
        sa.Column("trials", Json, nullable=False),
        sa.Column("trial_successes", sa.Integer(), nullable=False),
        sa.Column("forced", sa.Boolean(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("version", sa.Integer(), nullable=False),
    )
    op.create_table(
        "call_record",
        sa.Column("id", BIG_ID, primary_key=True, autoincrement=True),
        sa.Column("message_id", BIG_ID, sa.ForeignKey("message.id", ondelete="CASCADE"), nullable=False),
        sa.Column("system", sa.String(100), nullable=False),
        sa.Column("call_key", sa.String(255), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("duration_ms", sa.Integer(), nullable=False),
        sa.Column("outcome", sa.String(32), nullable=False),
        sa.Column("request", sa.Text(), nullable=True),
        sa.Column("response", sa.Text(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
    )
    op.create_index("ix_call_record_message", "call_record", ["message_id", "id"])
    op.create_index("ix_call_record_started", "call_record", ["started_at"])
    op.create_table(
        "alert_state",
        sa.Column("rule", sa.String(100), primary_key=True),
        sa.Column("firing", sa.Boolean(), nullable=False),
        sa.Column("value", sa.BigInteger(), nullable=True),
        sa.Column("fired_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("notified_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("resolved_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("evaluated_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("lease_owner", sa.String(100), nullable=True),
        sa.Column("lease_until", sa.DateTime(timezone=True), nullable=True),
    )


def downgrade() -> None:
    op.drop_table("alert_state")
    op.drop_index("ix_call_record_started", table_name="call_record")
    op.drop_index("ix_call_record_message", table_name="call_record")
    op.drop_table("call_record")
    op.drop_table("circuit_breaker")
