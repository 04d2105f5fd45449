"""The shared message search on each real database: keyset pages, capped and estimated counts, bad input."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import pytest
from openroute.persistence import MessageState, MessageStore

from benchmarks.store_fill import START, analyze, fill
from openroute.admin import InvalidQueryError, parse_filters, search_messages
from openroute.admin.search import COUNT_CAP

ROWS = 1500  # above COUNT_CAP, so the unfiltered count is estimated


@pytest.fixture
def filled(database_url: str) -> Iterator[MessageStore]:
    store = MessageStore(database_url)
    store.create_schema()
    with store.engine.begin() as connection:
        fill(connection, ROWS, "mixed", "s")
    with store.engine.begin() as connection:
        analyze(connection)
    yield store
    store.dispose()


def test_cursor_pages_visit_every_match_once_newest_first(filled: MessageStore) -> None:
    seen: list[tuple[object, int]] = []
    cursor = None
    with filled.engine.connect() as connection:
        while True:
            page = search_messages(connection, parse_filters({}), cursor, limit=400)
            seen.extend((m.receive_ts, m.id) for m in page.items)
            cursor = page.next_cursor
            if cursor is None:
                break
    assert len(seen) == ROWS and seen == sorted(seen, reverse=True)


def test_count_is_exact_up_to_the_cap_and_estimated_above(filled: MessageStore) -> None:
    with filled.engine.connect() as connection:
        everything = search_messages(connection, parse_filters({}), limit=1)
        failed = search_messages(connection, parse_filters({"state": ["FAILED"]}), limit=1)
        window = parse_filters({"received_from": (START + timedelta(seconds=101)).isoformat(),
                                "received_to": (START + timedelta(seconds=201)).isoformat()})
        hundred = search_messages(connection, window, limit=500)
    assert everything.total_estimated and everything.total > COUNT_CAP
    if filled.dialect == "postgresql":
        assert abs(everything.total - ROWS) < ROWS * 0.2  # the planner's estimate after ANALYZE
    assert not failed.total_estimated and failed.total == 30  # g % 100 in (1, 2)
    assert {m.state for m in failed.items} == {MessageState.FAILED}
    assert not hundred.total_estimated and hundred.total == len(hundred.items) == 100
    assert hundred.next_cursor is None


def test_bad_limit_and_foreign_cursor_are_refused(filled: MessageStore) -> None:
    with filled.engine.connect() as connection:
        for limit in (0, 501):
            with pytest.raises(InvalidQueryError, match=r"limit must be in 1\.\.500"):
                search_messages(connection, parse_filters({}), limit=limit)
        with pytest.raises(InvalidQueryError, match="not one this search returned"):
            search_messages(connection, parse_filters({}), cursor="eyJpZCI6IDF9")  # {"id": 1}
    with pytest.raises(InvalidQueryError, match="unknown state"):
        parse_filters({"state": "LOST"})
