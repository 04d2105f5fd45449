"""the state an operator gives a node: RUN, HANDLES_EXISTING_MESSAGES (draining), STOPPED

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-23 10:30:00
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from openroute.persistence.migrations._columns import drop_columns

revision = "0005"
down_revision = "0004"

_STATES = ("RUN", "HANDLES_EXISTING_MESSAGES", "STOPPED")


def upgrade() -> None:
    with op.batch_alter_table("node", schema=None) as batch_op:
        batch_op.add_column(sa.Column("state", sa.Enum(*_STATES, name="node_state", native_enum=False, length=32),
                                      nullable=False, server_default="RUN"))


def downgrade() -> None:
    drop_columns("node", "state")
