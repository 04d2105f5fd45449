"""Column types the migrations share, written out here rather than imported from ``models``, so that a later change
of the models never rewrites a migration that has already run."""

from __future__ import annotations

import sqlalchemy as sa

#: a 64-bit id; INTEGER on SQLite, where only an INTEGER PRIMARY KEY is the autoincrementing rowid
BIG_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
