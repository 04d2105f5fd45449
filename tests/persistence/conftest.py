"""Helpers of the store's own tests: ``tests/persistence/`` holds one test module per module of ``persistence/``
(``test_<module>.py``). The ``store`` fixture (a migrated store on SQLite and on PostgreSQL, each test on both) and
``sqlite_url`` / ``postgres_url`` are the suite's, in ``tests/conftest.py``."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from openroute.persistence import MessageStore, NewMessage

#: the time the store's tests start at
START = datetime(2024, 3, 1, 12, 0, tzinfo=UTC)


def new_message(key: str = "c-1", source: str = "crm", **extra: Any) -> NewMessage:
    """A message of the route ``s/o`` received at :data:`START`, with source system ``source`` and correlation id
    ``key``."""
    values: dict[str, Any] = {"service": "s", "operation": "o", "payload": "<p/>", "content_type": "text/xml",
                              "correlation_id": key, "source_system": source, "receive_ts": START}
    return NewMessage(**{**values, **extra})


def rows(store: MessageStore, table: sa.Table, *order_by: sa.ColumnElement[Any]) -> list[dict[str, Any]]:
    """Every row of ``table`` as the database holds it, read with a query of its own (not through the part under
    test)."""
    with store.engine.connect() as connection:
        return [dict(row._mapping) for row in connection.execute(sa.select(table).order_by(*order_by))]
