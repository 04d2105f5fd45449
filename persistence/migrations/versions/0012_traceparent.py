"""the W3C trace context of a message: its attempts and confirmation join the trace it was accepted in

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-25 23:30:00

- ``message.traceparent``: the W3C ``traceparent`` of the span that accepted the message (version 00, 55
  characters), written only while tracing is on (``openroute.runtime.tracing``); the parent of every later span of the
  message, on any node and after any restart. NULL for messages stored with tracing off and for older rows.
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from openroute.persistence.migrations._columns import drop_columns

revision = "0012"
down_revision = "0011"


def upgrade() -> None:
    with op.batch_alter_table("message", schema=None) as batch_op:
        batch_op.add_column(sa.Column("traceparent", sa.String(55), nullable=True))


def downgrade() -> None:
    drop_columns("message", "traceparent")
