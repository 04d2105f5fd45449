"""calls in doubt and stable keys: external_call STARTED records (idempotency key, node, start time) and a stable
confirmation id per confirmation

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-25 19:45:00
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

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
    with op.batch_alter_table("confirmation", schema=None) as batch_op:
        batch_op.drop_column("claimed_by")
        batch_op.drop_column("confirmation_id")
    with op.batch_alter_table("external_call", schema=None) as batch_op:
        batch_op.drop_column("started_at")
        batch_op.drop_column("node_id")
        batch_op.drop_column("idempotency_key")
