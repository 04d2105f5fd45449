"""The shared message search on each real database: keyset pages, capped and estimated counts, bad input."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import pytest
from openroute.persistence import MessageState, MessageStore

from benchmarks.store_fill import START, analyze, fill
from openroute.queries import InvalidQueryError, parse_filters, search_messages
from openroute.queries.filters import COUNT_CAP, SearchFilters
from tests.queries.conftest import FILLED_ROWS

ROWS = FILLED_ROWS  # the ``filled`` store's messages


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


def test_lists_of_states_and_codes_page_like_one_ordered_scan(filled: MessageStore) -> None:
    """A list is searched one value at a time and merged: pages stay newest first, each match exactly once."""
    params = {"state": ["FAILED", "PARTLY_FAILED"], "error_code": ["HLR_DOWN", "TIMEOUT", "NONE_SUCH"]}
    seen: list[tuple[object, int]] = []
    cursor = None
    with filled.engine.connect() as connection:
        while True:
            page = search_messages(connection, parse_filters(params), cursor, limit=7)
            seen.extend((m.receive_ts, m.id) for m in page.items)
            assert page.total == 45 and not page.total_estimated
            cursor = page.next_cursor
            if cursor is None:
                break
    assert len(seen) == 45 and seen == sorted(seen, reverse=True) and len(set(seen)) == 45
    with filled.engine.connect() as connection:
        states = search_messages(connection, parse_filters({"state": ["PARTLY_FAILED", "FAILED", "OK"]}), None, 50)
    assert [m.id for m in states.items] == sorted((m.id for m in states.items), reverse=True)
    assert states.next_cursor is not None


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


def test_lists_are_one_statement_that_finds_what_one_in_list_finds(filled: MessageStore) -> None:
    """A list of error codes or states is one page statement (on PostgreSQL an array joined to one LATERAL scan,
    planned once; on SQLite one UNION ALL): its pages hold exactly the matches of the plain ``IN`` lists, newest
    first; on PostgreSQL the UNION ALL of one branch per value finds the same rows."""
    import sqlalchemy as sa
    from openroute.persistence import message_table

    from openroute.queries.search import page_statement, search_summaries

    rare = [f"E{n:02d}" for n in range(1, 13)]
    m = message_table.c
    with filled.engine.begin() as connection:  # 12 rare codes, as the aged bench store has them
        for n, code in enumerate(rare):
            connection.execute(sa.update(message_table).where(m.id % 97 == n).values(last_error_code=code))
    cases: list[dict[str, object]] = [
        {"error_code": rare},
        {"error_code": rare, "state": ["FAILED", "OK"]},
        {"error_code": [*rare, "HLR_DOWN"], "service": "svc1"},
        {"state": ["PARTLY_FAILED", "FAILED"], "error_code": ["TIMEOUT"]},
        {"error_code": ["E03", "NONE_SUCH"], "state": ["OK"]},
    ]
    with filled.engine.connect() as connection:
        for params in cases:
            filters = parse_filters(params)
            order = (m.receive_ts.desc(), m.id.desc())
            expected = connection.execute(sa.select(m.id).where(*filters.conditions()).order_by(*order)).scalars().all()
            found: list[int] = []
            cursor = None
            while True:
                page = search_summaries(connection, filters, cursor, limit=7)
                found.extend(row.id for row in page.rows)
                assert page.total == len(expected) and not page.total_estimated
                if filled.dialect == "postgresql":
                    for lateral in (False, True):
                        statement = page_statement(filters, cursor, 7, ["id", "receive_ts"], lateral=lateral)
                        assert connection.execute(statement).scalars().all()[:7] == [row.id for row in page.rows]
                    text = str(page_statement(filters, cursor, 7, lateral=True).compile(dialect=connection.dialect))
                    assert "LATERAL" in text and "UNION" not in text
                cursor = page.next_cursor
                if cursor is None:
                    break
            assert found == expected and expected, params


def test_summary_rows_give_the_api_items_of_the_messages(filled: MessageStore) -> None:
    """The admin API's items, built in one pass from rows of the summary columns, are those of the messages."""
    from openroute.queries.messages import message_summary, summaries
    from openroute.queries.search import search_summaries

    with filled.engine.connect() as connection:
        for params in ({}, {"state": ["FAILED", "PARTLY_FAILED"]}, {"error_text": "down"}):
            filters = parse_filters(params)
            messages = search_messages(connection, filters, None, 50)
            rows = search_summaries(connection, filters, None, 50)
            assert summaries(rows.rows) == [message_summary(message) for message in messages.items]
            assert (rows.next_cursor, rows.total, rows.total_estimated) == (
                messages.next_cursor, messages.total, messages.total_estimated)


def test_the_capped_count_and_its_estimate_are_one_statement_on_postgresql(filled: MessageStore) -> None:
    """EXPLAIN (ANALYZE) of the LIMITed select gives what the count statement counts and what a plain EXPLAIN
    estimates."""
    if filled.dialect != "postgresql":
        pytest.skip("SQLite has no row estimate")
    import sqlalchemy as sa
    from openroute.persistence import message_table

    from openroute.queries.search import count_statement, counted_with_estimate

    with filled.engine.connect() as connection:
        for params in ({}, {"state": ["FAILED"]}, {"error_code": ["HLR_DOWN", "TIMEOUT"], "service": "svc1"}):
            filters = parse_filters(params)
            query = sa.select(sa.literal(1)).select_from(message_table).where(*filters.conditions())
            compiled = query.compile(dialect=connection.dialect, compile_kwargs={"literal_binds": True})
            plan = connection.exec_driver_sql(f"EXPLAIN (FORMAT JSON) {compiled}").scalar_one()
            counted = connection.execute(count_statement(filters)).scalar_one()
            assert counted_with_estimate(connection, filters) == (counted, plan[0]["Plan"]["Plan Rows"]), params


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


def test_a_text_with_a_common_word_asks_the_index_for_its_rare_words(filled: MessageStore) -> None:
    """Every payload holds ``order`` and ``id``: on PostgreSQL the trigram index is asked for the text's other words
    only (a common word's list of rows is read whole) and the whole text is checked on what it finds; the pages
    hold exactly the matches of a plain ILIKE, on every page; when the first try saw every candidate no index
    statement follows."""
    import sqlalchemy as sa
    from openroute.persistence import message_table

    from openroute.queries.search import narrowed, page_statement, search_summaries

    m = message_table.c
    cases: list[dict[str, object]] = [
        {"payload_text": 'order id="77'},
        {"payload_text": 'id="777"'},
        {"payload_text": 'id="777"', "service": "svc2"},
        {"payload_text": "ORDER ID", "state": ["OK"]},
        {"error_text": "hlr 102 is", "payload_text": '"102"'},
        {"payload_text": 'id="nothing"'},
    ]
    with filled.engine.connect() as connection:
        narrow = narrowed(connection, parse_filters({"payload_text": 'order id="77'}), None, 5)
        postgresql = filled.dialect == "postgresql"
        assert narrow is not None and narrow.index_words == ()
        if postgresql:  # "order" and "id" are common, "77" is too short to look up alone: no narrowing
            assert narrow is not None and narrow.index_words == () and narrow.payload_index
            rare = narrowed(connection, parse_filters({"payload_text": 'order id="777"'}), None, 5)
            assert rare is not None and rare.index_words == ("777",) and rare.payload_index
            # the copies' index asked for the rare word, the whole text compared on the copies it finds; the
            # payloads of the messages still pending read in the message table
            text = str(page_statement(rare, None, 5).compile(dialect=connection.dialect))
            assert "(message_payload_text.payload || " in text and "FROM message_payload_pending" in text, text
        seen_all = narrowed(connection, parse_filters({"payload_text": 'id="777"', "correlation_id": "s-777"}),
                            None, 5)
        assert (seen_all is None) == postgresql
        for params in cases:
            filters = parse_filters(params)
            plain = sa.select(m.id).where(*filters.conditions()).order_by(m.receive_ts.desc(), m.id.desc())
            expected = connection.execute(plain).scalars().all()
            found: list[int] = []
            cursor = None
            while True:
                page = search_summaries(connection, filters, cursor, limit=5)
                found.extend(row.id for row in page.rows)
                assert page.total == len(expected) or page.total_estimated, params
                cursor = page.next_cursor
                if cursor is None:
                    break
            assert found == expected, params
            connection.rollback()


def test_a_text_search_counts_exactly_up_to_the_cap_whatever_its_probe_saw(
    filled: MessageStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With a cap of 10 and a text probe of 22 candidates: texts every candidate holds (the probe stops at 11
    matches), texts the newest candidates lack (the probe reads all 22 and the index counts) and texts with few
    matches are counted exactly up to the cap and estimated above it, as the plain count says."""
    import sqlalchemy as sa
    from openroute.persistence import message_table

    from openroute.queries import search

    monkeypatch.setattr(search, "COUNT_CAP", 10)
    monkeypatch.setattr(search, "TEXT_PROBE", 22)
    cases: list[dict[str, object]] = [
        {"payload_text": "order"}, {"payload_text": 'id="77'}, {"payload_text": 'id="14'},
        {"payload_text": 'order id="1', "state": ["FAILED"]}, {"error_text": "hlr 10"}, {"error_text": "timeout 1"},
        {"error_text": "is down", "error_code": ["HLR_DOWN"]}, {"payload_text": 'id="123'},
    ]
    with filled.engine.connect() as connection:
        for params in cases:
            filters = parse_filters(params)
            expected = connection.execute(
                sa.select(sa.func.count()).select_from(message_table).where(*filters.conditions())).scalar_one()
            page = search.search_summaries(connection, filters, None, limit=1)
            connection.rollback()
            assert expected >= 2, params  # a full first page: the count runs
            if expected <= 10:
                assert (page.total, page.total_estimated) == (expected, False), params
            else:
                assert page.total_estimated and page.total > 10, params


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


@pytest.fixture
def filled_100k(postgres_url: str) -> Iterator[MessageStore]:
    """A PostgreSQL store of 100,000 mixed messages, analyzed: big enough for the planner to choose like at 1M."""
    store = MessageStore(postgres_url)
    store.create_schema()
    with store.engine.begin() as connection:
        fill(connection, 100_000, "mixed", "t")
    with store.engine.begin() as connection:
        analyze(connection)
    yield store
    store.dispose()


def test_text_search_uses_the_trigram_indexes_on_postgresql(filled_100k: MessageStore) -> None:
    """At a modest size (100,000 rows, analyzed) PostgreSQL answers the text searches from the GIN trigram indexes:
    the error text's on ``message`` (migration 0009), the payload's on the copies of ``message_payload_text``
    (migration 0018, asked as the search's trigram page asks it: :func:`narrowed` sets ``payload_index``)
    (benchmarks/admin_bench.py measures 1M rows through HTTP)."""
    from dataclasses import replace

    from openroute.queries.search import page_statement

    store = filled_100k
    with store.engine.connect() as connection:
        for params, index, matches in (
            ({"payload_text": 'id="12345"'}, "ix_message_payload_text_trgm", 1),
            ({"error_text": "hlr 12302 is"}, "ix_message_error_text_trgm", 1),
            # a code with a state none of its messages has: checked in the index (migration 0011)
            ({"error_code": ["HLR_DOWN"], "state": ["OK"]}, "ix_message_error_code_state", 0),
        ):
            filters = parse_filters(params)
            query = page_statement(replace(filters, payload_index=filters.payload_text is not None), None, 50)
            compiled = query.compile(dialect=connection.dialect, compile_kwargs={"literal_binds": True})
            plan = "\n".join(connection.exec_driver_sql(f"EXPLAIN {compiled}").scalars())
            assert index in plan, plan
            assert len(_ids(store, params)) == matches


def test_every_filter_reads_a_bounded_part_of_an_index_on_postgresql(filled_100k: MessageStore) -> None:
    """The plans that keep issue 26's searches bounded at 1M messages (benchmarks/admin_bench.py --plans): an
    operation no message has, an error code with a service, a list of states (one scan per state, merged), a next
    page (its receive time bounds the index range) and a capped count (index entries, not the table)."""
    from openroute.queries.search import count_statement, page_statement, steer_count

    store = filled_100k
    with store.engine.connect() as connection:
        def plan(statement: object) -> str:
            compiled = statement.compile(  # type: ignore[attr-defined]
                dialect=connection.dialect, compile_kwargs={"literal_binds": True})
            return "\n".join(connection.exec_driver_sql(f"EXPLAIN {compiled}").scalars())

        def page(params: dict[str, object], cursor: str | None = None) -> str:
            return plan(page_statement(parse_filters(params), cursor, 50))

        assert "ix_message_operation" in page({"operation": "nope"})
        assert "ix_message_error_service" in page({"error_code": ["TIMEOUT"], "service": "svc2"})
        merged = page({"state": ["FAILED", "PARTLY_FAILED"]})
        assert "Merge Append" in merged and merged.count("ix_message_state_receive") == 2, merged
        lateral = plan(page_statement(parse_filters({"error_code": [f"E{n:02d}" for n in range(12)]}), None, 50,
                                      lateral=True))
        assert "Nested Loop" in lateral and lateral.count("using ix_message_error_code") == 1, lateral
        first = search_messages(connection, parse_filters({"state": ["FAILED"]}), None, 50)
        deep = page({"state": ["FAILED"]}, first.next_cursor)
        bound = f"receive_ts <= '{first.items[-1].receive_ts:%Y-%m-%d %H:%M:%S}"  # from the row comparison
        assert "ix_message_state_receive" in deep and bound in deep, deep
        filters = parse_filters({"service": "svc1", "operation": "op2"})
        assert steer_count(connection, filters)
        counted = plan(count_statement(filters))
        steer_count(connection, filters, on=False)
        assert "Index Only Scan using ix_message_service_op_state" in counted, counted
        # without a filter the table's first rows are the count: not steered, it reads them in a sequential scan
        assert not steer_count(connection, SearchFilters())
        assert "Seq Scan on message" in plan(count_statement(SearchFilters()))
        everything = search_messages(connection, SearchFilters(), None, 50)
        assert (len(everything.items), everything.total_estimated) == (50, True) and everything.total > COUNT_CAP


def test_an_error_text_among_errors_finds_its_first_page_and_count_in_one_statement(
    filled: MessageStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With an error code or only failed states asked for, a text's first page and count come from one read of the
    candidates; with a cap of 10 and 22 candidates: every page holds what a plain ILIKE finds, in order, the count is
    exact up to the cap and estimated above it, and a text the candidates lack is still found (the trigram page)."""
    import sqlalchemy as sa
    from openroute.persistence import message_table

    from openroute.queries import search

    monkeypatch.setattr(search, "COUNT_CAP", 10)
    monkeypatch.setattr(search, "TEXT_PROBE", 22)
    m = message_table.c
    cases: list[dict[str, object]] = [
        {"error_text": "timeout", "state": ["FAILED"]},  # 15 of 30 candidates (all read)
        {"error_text": "IS DOWN", "error_code": ["HLR_DOWN"]},  # 30 of 30: over the cap
        {"error_text": "hlr 1", "state": ["FAILED", "PARTLY_FAILED"]},  # few, among 45
        {"error_text": "hlr 1402", "state": ["FAILED"]},  # one, older than the 22 newest candidates
        {"error_text": "timeout 1", "error_code": ["TIMEOUT", "HLR_DOWN"], "state": ["FAILED"]},
        {"error_text": "nothing like it", "error_code": ["TIMEOUT"]},  # none among 15
    ]
    with filled.engine.connect() as connection:
        for params in cases:
            filters = parse_filters(params)
            assert search._errors_only(filters), params
            plain = sa.select(m.id).where(*filters.conditions()).order_by(m.receive_ts.desc(), m.id.desc())
            expected = connection.execute(plain).scalars().all()
            for limit in (1, 4, 50):
                found: list[int] = []
                cursor = None
                while True:
                    page = search.search_summaries(connection, filters, cursor, limit=limit)
                    if cursor is None:  # a first page that holds every match is its own count
                        if len(expected) <= 10 or page.next_cursor is None:
                            assert (page.total, page.total_estimated) == (len(expected), False), (params, limit)
                        else:
                            assert page.total_estimated and page.total > 10, (params, limit)
                    found.extend(row.id for row in page.rows)
                    cursor = page.next_cursor
                    if cursor is None:
                        break
                assert found == expected, (params, limit)
                connection.rollback()
        statements: list[str] = []
        sa.event.listen(connection, "before_cursor_execute", lambda *args: statements.append(args[2]))
        few = parse_filters({"error_text": "timeout 1", "error_code": ["TIMEOUT"], "state": ["FAILED"]})  # 7 of 15
        page = search.search_summaries(connection, few, None, limit=4)
    assert len([s for s in statements if s.startswith("SELECT")]) == 1 and (page.total, len(page.rows)) == (7, 4)
