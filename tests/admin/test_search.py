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


# -- search by what went wrong (issue 26) ------------------------------------------------------------------------
def _ids(store: MessageStore, params: dict[str, object]) -> list[int]:
    with store.engine.connect() as connection:
        page = search_messages(connection, parse_filters(params), limit=500)
    assert not page.total_estimated and page.total == len(page.items)
    return [m.id for m in page.items]


def test_search_by_error_code_error_text_and_payload_text(filled: MessageStore) -> None:
    # fill: g % 100 == 0 PARTLY_FAILED, 1 FAILED TIMEOUT, 2 FAILED HLR_DOWN; even g HLR_DOWN, odd TIMEOUT
    assert len(_ids(filled, {"error_code": "HLR_DOWN"})) == 30
    assert len(_ids(filled, {"error_code": ["HLR_DOWN", "TIMEOUT"]})) == 45
    assert len(_ids(filled, {"error_code": "HLR_DOWN,TIMEOUT"})) == 45
    assert len(_ids(filled, {"error_code": "HLR_DOWN", "state": ["FAILED"]})) == 15
    assert _ids(filled, {"error_code": "HLR"}) == []  # exact, not a prefix
    [hit] = _ids(filled, {"error_text": "HLR 102 IS"})  # any case
    assert filled.get(hit).correlation_id == "s-102"  # type: ignore[union-attr]
    [order] = _ids(filled, {"payload_text": 'id="777"'})
    assert filled.get(order).correlation_id == "s-777"  # type: ignore[union-attr]
    assert _ids(filled, {"payload_text": 'id="777"', "state": ["FAILED"]}) == []  # combined with the others
    assert len(_ids(filled, {"payload_text": 'id="77', "service": "svc2"})) == 3  # 77, 772, 777 of 770..779: svc2


def test_like_wildcards_in_the_users_text_are_plain_characters(store: MessageStore) -> None:
    from openroute.persistence import NewMessage

    for key, payload in (("a", "50%_off"), ("b", "50 percent off"), ("c", "5x0y")):
        store.insert_message(NewMessage(service="s", operation="o", payload=payload, content_type="text/plain",
                                        correlation_id=key, source_system="x", receive_ts=START))
    assert len(_ids(store, {"payload_text": "50%_"})) == 1
    assert _ids(store, {"payload_text": "5%0"}) == [] and _ids(store, {"payload_text": "5_0"}) == []
    assert len(_ids(store, {"payload_text": "%"})) == 1
    with pytest.raises(InvalidQueryError, match="error_code"):
        parse_filters({"error_code": ["C" * 101]})
    with pytest.raises(InvalidQueryError, match="payload_text"):
        parse_filters({"payload_text": ""})


def test_text_search_uses_the_trigram_indexes_on_postgresql(postgres_url: str) -> None:
    """At a modest size (100,000 rows, analyzed) PostgreSQL answers the text searches from the GIN trigram indexes
    of migration 0009 (benchmarks/admin_bench.py measures 1M rows through HTTP)."""
    from openroute.admin.search import page_statement

    store = MessageStore(postgres_url)
    store.create_schema()
    try:
        with store.engine.begin() as connection:
            fill(connection, 100_000, "mixed", "t")
        with store.engine.begin() as connection:
            analyze(connection)
        with store.engine.connect() as connection:
            for params, index, matches in (
                ({"payload_text": 'id="12345"'}, "ix_message_payload_trgm", 1),
                ({"error_text": "hlr 12302 is"}, "ix_message_error_text_trgm", 1),
                # a code with a state none of its messages has: checked in the index (migration 0011)
                ({"error_code": ["HLR_DOWN"], "state": ["OK"]}, "ix_message_error_code_state", 0),
            ):
                query = page_statement(parse_filters(params), None, 50)
                compiled = query.compile(dialect=connection.dialect, compile_kwargs={"literal_binds": True})
                plan = "\n".join(connection.exec_driver_sql(f"EXPLAIN {compiled}").scalars())
                assert index in plan, plan
                assert len(_ids(store, params)) == matches
    finally:
        store.dispose()
