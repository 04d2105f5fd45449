"""the transition history of every message

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-23 10:00:00
"""
from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from alembic import op

from openroute.persistence.migrations._columns import BIG_ID

revision = "0003"
down_revision = "0002"

_STATES = ("NEW", "PROCESSING", "PARTLY_FAILED", "POSTPONED", "WAITING_FOR_CHILDREN", "OK", "FAILED", "SKIPPED",
           "CANCEL")


def _state(column: str, nullable: bool) -> sa.Column[Any]:
    return sa.Column(column, sa.Enum(*_STATES, name="message_state", native_enum=False, length=32),
                     nullable=nullable)


def upgrade() -> None:
    op.create_table(
        "message_transition",
        sa.Column("id", BIG_ID, autoincrement=True, nullable=False),
        sa.Column("message_id", BIG_ID, nullable=False),
        _state("from_state", True),
        _state("to_state", False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("node_id", sa.String(length=100), nullable=True),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("error_code", sa.String(length=100), nullable=True),
        sa.Column("cause", sa.String(length=255), nullable=False),
        sa.ForeignKeyConstraint(["message_id"], ["message.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("message_transition", schema=None) as batch_op:
        batch_op.create_index("ix_message_transition_message", ["message_id", "id"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("message_transition", schema=None) as batch_op:
        batch_op.drop_index("ix_message_transition_message")
    op.drop_table("message_transition")
