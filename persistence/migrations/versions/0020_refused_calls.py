"""the calls a circuit breaker refused, counted apart from the calls made

Revision ID: 0020
Revises: 0019
Create Date: 2026-11-30 10:00:00

- ``external_call.refused`` and ``entity_call.refused``: how many times the system's circuit breaker refused the
  call (not made: the message was parked), 0 for the rows before. ``attempts`` counts the calls made from now on
  (a refused call used to count there too: rows of older refusals keep them in ``attempts``).

Numbered 0020 beside issue 41's 0019, written at the same time: when both are merged, this one revises 0019.
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from openroute.persistence.migrations._columns import drop_columns

revision = "0020"
down_revision = "0019"


def upgrade() -> None:
    for table in ("external_call", "entity_call"):
        with op.batch_alter_table(table, schema=None) as batch_op:
            batch_op.add_column(sa.Column("refused", sa.Integer(), nullable=False, server_default="0"))


def downgrade() -> None:
    for table in ("external_call", "entity_call"):
        drop_columns(table, "refused")
