"""calls in doubt and stable keys: external_call STARTED records (idempotency key, node, start time) and a stable
confirmation id per confirmation

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-25 19:45:00
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from openroute.persistence.migrations._columns import drop_columns

revision = "0006"
down_revision = "0005"

_UTC = sa.DateTime(timezone=True)


def upgrade() -> None:
    # external_call.status gains STARTED (a plain string column: native_enum=False, no CHECK constraint)
    with op.batch_alter_table("external_call", schema=None) as batch_op:
        batch_op.add_column(sa.Column("idempotency_key", sa.String(64), nullable=True))
        batch_op.add_column(sa.Column("node_id", sa.String(100), nullable=True))
        batch_op.add_column(sa.Column("started_at", _UTC, nullable=True))
    with op.batch_alter_table("confirmation", schema=None) as batch_op:
        batch_op.add_column(sa.Column("confirmation_id", sa.String(64), nullable=True))
        batch_op.add_column(sa.Column("claimed_by", sa.String(100), nullable=True))


def downgrade() -> None:
    drop_columns("confirmation", "claimed_by", "confirmation_id")
    drop_columns("external_call", "started_at", "node_id", "idempotency_key")
