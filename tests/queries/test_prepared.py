"""Search statements built once per shape (``openroute/queries/_prepared.py``), on each real database: a search of a
kept shape finds what a statement built for it finds, with its own values, and a builder that decides by a value is
built every time."""

from __future__ import annotations

from typing import Any

import pytest
import sqlalchemy as sa
from openroute.persistence import MessageStore, message_table

from benchmarks.store_fill import START
from openroute.queries import _prepared, parse_filters, search
from openroute.queries._prepared import Search, prepared
from openroute.queries.search import search_messages
from tests.queries.conftest import FILLED_ROWS

ROWS = FILLED_ROWS  # the ``filled`` store's messages


def _built_each_time(kind: str, build: Any, search_values: Search, arguments: Any = ()) -> tuple[Any, dict[str, Any]]:
    return build(search_values), {}


def _pages(store: MessageStore, params: dict[str, object], limit: int = 20) -> list[tuple[list[int], int, bool]]:
    """The ids, total and estimate flag of the first two pages of a search."""
    pages = []
    cursor = None
    with store.engine.connect() as connection:
        for _ in range(2):
            page = search_messages(connection, parse_filters(params), cursor, limit)
            pages.append(([m.id for m in page.items], page.total, page.total_estimated))
            cursor = page.next_cursor
            if cursor is None:
                break
    return pages


DAY = {"received_from": START.isoformat(), "received_to": (START.replace(hour=1)).isoformat()}
SEARCHES: list[dict[str, object]] = [
    {},
    {"state": ["FAILED"]},
    {"state": ["FAILED", "PARTLY_FAILED"], "service": "svc1"},
    {"error_code": ["HLR_DOWN", "TIMEOUT"]},
    {"error_code": ["TIMEOUT", "HLR_DOWN", "NONE"], "state": ["FAILED", "PARTLY_FAILED"]},
    {"error_code": "HLR_DOWN", "error_text": "is down"},
    {"error_text": "timeout", "state": ["FAILED"], **DAY},
    {"error_text": "hlr 102 is"},
    {"payload_text": 'id="77', "service": "svc2"},
    {"payload_text": '<order id="777"'},  # words a sample counts: "order" is in every payload
    {"service": "svc3", "operation": "op1", "source_system": "src1", **DAY},
    {"correlation_id": "s-5"},
    {"error_code": "NONE_SUCH", "error_text": "anything"},
]


@pytest.mark.parametrize("params", SEARCHES, ids=lambda params: ",".join(params) or "no filter")
def test_a_kept_shape_finds_what_a_statement_built_for_the_search_finds(
    filled: MessageStore, params: dict[str, object], monkeypatch: pytest.MonkeyPatch
) -> None:
    kept = _pages(filled, params)
    again = _pages(filled, params)  # from the kept statements
    monkeypatch.setattr(search, "prepared", _built_each_time)
    assert kept == again == _pages(filled, params)


def test_searches_of_one_shape_share_a_statement_and_keep_their_own_values(
    filled: MessageStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_prepared, "_prepared", {})
    found = {}
    for service in ("svc1", "svc2", "svc1"):
        found[service] = _pages(filled, {"service": service, "state": ["OK"]}, limit=5)
    shape = _prepared._shape(Search(parse_filters({"service": "svc1", "state": ["OK"]})))
    kept = [key for key in _prepared._prepared if key[0] == "page" and key[2] == shape]
    assert len(kept) == 1  # svc1 and svc2 are one shape: one statement for their first pages
    svc1, svc2 = found["svc1"][0][0], found["svc2"][0][0]
    assert svc1 and svc2 and not set(svc1) & set(svc2)
    with filled.engine.connect() as connection:
        services = {filled.get(i).service for i in svc2}  # type: ignore[union-attr]
        states = {row.state for row in connection.execute(sa.select(message_table.c.state)
                                                          .where(message_table.c.id.in_(svc1 + svc2)))}
    assert services == {"svc2"} and states == {"OK"}


def test_a_builder_that_decides_by_a_value_is_built_for_every_search(filled: MessageStore) -> None:
    def by_value(values: Search) -> sa.Select[Any]:  # the service's name into the SQL text, not as a bound value
        name = values.filters.text["service"]
        return sa.select(sa.func.count()).select_from(message_table).where(sa.literal_column(f"'{name}'") == "x")

    one = parse_filters({"service": "x"})
    statement, values = prepared("test-by-value", by_value, Search(one))
    assert values == {} and _prepared._prepared[("test-by-value", (), _prepared._shape(Search(one)))] is None
    with filled.engine.connect() as connection:
        assert connection.execute(statement, values).scalar_one() == ROWS
        statement, values = prepared("test-by-value", by_value, Search(parse_filters({"service": "y"})))
        assert connection.execute(statement, values).scalar_one() == 0


def test_a_code_listed_twice_is_searched_with_a_statement_built_for_it(filled: MessageStore) -> None:
    twice = search.SearchFilters(error_codes=("HLR_DOWN", "TIMEOUT", "HLR_DOWN"))
    assert _prepared._shape(Search(twice)) is None
    with filled.engine.connect() as connection:
        page = search_messages(connection, twice, None, 500)
    assert page.total == 45 and len({m.id for m in page.items}) == 45


def test_the_shapes_kept_are_bounded_and_a_search_of_a_dropped_shape_is_built_again(
    filled: MessageStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_prepared, "_prepared", {})
    monkeypatch.setattr(_prepared, "MAX_SHAPES", 2)
    searches: list[dict[str, object]] = [{"service": "svc1"}, {"state": ["FAILED"]}, {"error_code": "TIMEOUT"}]
    first = [_pages(filled, params) for params in searches]
    assert len(_prepared._prepared) == 2
    assert [_pages(filled, params) for params in searches] == first
    assert len(_prepared._prepared) == 2
    assert [pages[0][1] for pages in first] == [300, 30, 15]  # the totals, each exact
