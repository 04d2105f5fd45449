"""The column types of the store: timestamps stored as UTC and read back timezone-aware, 64-bit ids, JSON."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import JSONB

__all__ = ["BigId", "Json", "UTCDateTime"]


class UTCDateTime(sa.TypeDecorator[datetime]):
    """A timestamp stored as UTC and always read back timezone-aware.

    SQLite has no timezone-aware type, so values are normalised to naive UTC on the way in and
    tagged UTC on the way out; PostgreSQL gets ``timestamp with time zone``.
    """

    impl = sa.DateTime
    cache_ok = True

    def load_dialect_impl(self, dialect: sa.Dialect) -> sa.types.TypeEngine[Any]:
        """``timestamp with time zone`` on PostgreSQL, a naive ``DATETIME`` elsewhere."""
        if dialect.name == "postgresql":
            return dialect.type_descriptor(sa.DateTime(timezone=True))
        return dialect.type_descriptor(sa.DateTime())

    def process_bind_param(self, value: datetime | None, dialect: sa.Dialect) -> datetime | None:
        """The value to store: converted to UTC, naive except on PostgreSQL; raises ValueError for a naive datetime."""
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError(f"naive datetime {value!r}: the store only takes timezone-aware timestamps")
        value = value.astimezone(UTC)
        return value if dialect.name == "postgresql" else value.replace(tzinfo=None)

    def process_result_value(self, value: datetime | None, dialect: sa.Dialect) -> datetime | None:
        """The stored value read back timezone-aware, in UTC."""
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


# SQLite only auto-increments an INTEGER PRIMARY KEY, PostgreSQL gets a 64-bit identity.
BigId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
Json = sa.JSON().with_variant(JSONB(), "postgresql")
