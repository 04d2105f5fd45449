"""Stores the search tests share."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from openroute.persistence import MessageStore

from benchmarks.store_fill import analyze, fill

#: messages of the ``filled`` store: above COUNT_CAP, so an unfiltered count is estimated
FILLED_ROWS = 1500


@pytest.fixture
def filled(database_url: str) -> Iterator[MessageStore]:
    """A store of :data:`FILLED_ROWS` mixed messages (``benchmarks/store_fill.py``, correlation ids ``s-<n>``),
    analyzed, once on SQLite and once on PostgreSQL."""
    store = MessageStore(database_url)
    store.create_schema()
    with store.engine.begin() as connection:
        fill(connection, FILLED_ROWS, "mixed", "s")
    with store.engine.begin() as connection:
        analyze(connection)
    yield store
    store.dispose()
