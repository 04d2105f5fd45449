"""Column types and steps the migrations share, written out here rather than imported from ``models``, so that a
later change of the models never rewrites a migration that has already run."""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

#: a 64-bit id; INTEGER on SQLite, where only an INTEGER PRIMARY KEY is the autoincrementing rowid
BIG_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def drop_columns(table: str, *columns: str) -> None:
    """Drop ``columns`` of ``table``, in this order (one batch: SQLite copies the table once)."""
    with op.batch_alter_table(table, schema=None) as batch_op:
        for column in columns:
            batch_op.drop_column(column)
