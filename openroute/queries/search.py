"""The message search of the admin API, the console and ``openroute messages``: filters, newest first, keyset pages,
a count that stays cheap.

Both the JSON API (``GET /admin/messages``) and the web console call :func:`search_messages`::

    from openroute.queries import parse_filters, search_messages

    filters = parse_filters({"state": ["FAILED"], "service": "crm", "received_from": "2024-03-01T00:00:00+00:00"})
    with store.engine.connect() as connection:
        page = search_messages(connection, filters, cursor=None, limit=50)
        more = search_messages(connection, filters, cursor=page.next_cursor, limit=50)

Pages are ordered newest first by (receive time, id) and continue after an opaque cursor (keyset pagination: a
deep page costs what the first costs, unlike OFFSET). The count is exact up to :data:`COUNT_CAP` matches;
beyond it the database's estimate is returned and :attr:`Page.total_estimated` is True. A first page that holds
every match is its own count (no count query).

Every filter has an index ordered by receive time after its value (migrations 0004, 0009, 0011, 0013), so each
search reads a bounded number of index entries: a page reads ``limit + 1`` of them per listed state or error
code (the lists are searched one value at a time and merged; on PostgreSQL one ``LATERAL`` scan over an array), the
capped count at most ``COUNT_CAP + 1`` (from a B-tree index, see :func:`steer_count`; on PostgreSQL counted with the
estimate in one statement, :func:`counted_with_estimate`). The admin API reads only the :data:`SUMMARY_COLUMNS`
(:func:`search_summaries`). Text searches first check the newest messages of the other filters
(:func:`probe_statement`), then ask the trigram index, for a payload text without the words that most candidates
hold (:func:`narrowed`); an error text among messages that all carry an error reads its first page and its count
from one read of the candidates (:func:`probe_page_count_statement`); a text whose words are shorter than 3
characters gives the trigram index nothing to look up. Each statement is built once per shape of the search and
executed with the search's values (:mod:`openroute.queries._prepared`): building them cost more CPU than running them.
docs/performance.md has the plans at 1M rows (``benchmarks/admin_bench.py --plans``).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

from openroute.persistence import MessageState, MessageStore, message_table
from openroute.persistence.messages import row_to_message
from openroute.queries._explain import Explain
from openroute.queries._prepared import Search, prepared
from openroute.queries.filters import (
    COUNT_CAP,
    DEFAULT_LIMIT,
    MAX_LIMIT,
    InvalidQueryError,
    Page,
    SearchFilters,
    cursor_after,
    decode_cursor,
    like_pattern,
)

#: the columns of a search result row (:func:`search_summaries`), in the order of the admin API's item
#: (:func:`openroute.queries.messages.message_summary`): no payload, headers, custom data or error text, so a page
#: reads, sends and converts only these
SUMMARY_COLUMNS = ("id", "state", "service", "operation", "source_system", "correlation_id", "process_id",
                   "object_id", "entity_type", "funnel_value", "failed_count", "receive_ts", "last_update_ts",
                   "next_attempt_at", "last_error_code", "parent_id", "parked_on")


def count_statement(filters: SearchFilters) -> sa.Select[Any]:
    """The capped count: how many messages match, counting at most ``COUNT_CAP + 1``."""
    capped = sa.select(sa.literal(1)).select_from(message_table).where(*filters.conditions()).limit(COUNT_CAP + 1)
    return sa.select(sa.func.count()).select_from(capped.subquery())


#: most index scans one page query merges (a list of states times a list of error codes)
MAX_BRANCHES = 64


def _branches(filters: SearchFilters) -> list[SearchFilters]:
    """``filters`` split into one search per listed state and error code (a product at most
    :data:`MAX_BRANCHES` long, else per error code only); one element when no list has several values."""
    # each value once: filters made without parse_filters may list one twice, and a branch each would find its
    # matches twice
    codes = [(code,) for code in dict.fromkeys(filters.error_codes)] if len(filters.error_codes) > 1 else [
        filters.error_codes]
    states = [(state,) for state in dict.fromkeys(filters.states)] if len(filters.states) > 1 else [filters.states]
    if len(codes) * len(states) > MAX_BRANCHES:
        states = [filters.states]
    return [replace(filters, error_codes=code, states=state) for code in codes for state in states]


def _columns(names: Sequence[str] | None, table: Any = message_table) -> list[Any]:
    return list(table.c) if names is None else [table.c[name] for name in names]


def page_statement(
    filters: SearchFilters, cursor: str | None, limit: int, columns: Sequence[str] | None = None, *,
    lateral: bool = False,
) -> sa.Select[Any]:
    """The page query: ``limit + 1`` rows (one more tells whether a next page exists) after ``cursor``, of the
    ``columns`` named (default every column; ``receive_ts`` and ``id`` among them).

    Each index behind a filter is ordered by receive time after its value, so a list of states or error codes
    is searched one value at a time (each reads at most ``limit + 1`` rows in index order) and the results are
    merged: an ``IN`` list would read every match to sort them. By default each value is a branch of a
    ``UNION ALL`` (a ``Merge Append``), which the database plans once per value; with ``lateral`` (PostgreSQL) the
    values are an array joined to one ``LATERAL`` scan, planned once for any number of values (12 codes: a fifth
    of the planning), whose ``(list length) * (limit + 1)`` rows at most are sorted. PostgreSQL bounds the index
    range by the cursor's receive time (from the row comparison), so a deep page costs what the first does.
    """
    c = message_table.c
    after: list[sa.ColumnElement[bool]] = []
    if cursor is not None:
        at, last_id = decode_cursor(cursor)
        after = [sa.tuple_(c.receive_ts, c.id) < sa.tuple_(sa.literal(at, c.receive_ts.type),
                                                           sa.literal(last_id, c.id.type))]
    order = (c.receive_ts.desc(), c.id.desc())
    selected = _columns(columns)
    branches = _branches(filters)
    if len(branches) == 1:
        return sa.select(*selected).where(*filters.conditions(), *after).order_by(*order).limit(limit + 1)
    if lateral:
        return _lateral_page(filters, branches, after, limit, selected)
    parts = [sa.select(sa.select(*selected).where(*branch.conditions(), *after).order_by(*order)
                       .limit(limit + 1).subquery()) for branch in branches]
    merged = sa.union_all(*parts).subquery()
    return sa.select(merged).order_by(merged.c.receive_ts.desc(), merged.c.id.desc()).limit(limit + 1)


def _lateral_page(
    filters: SearchFilters, branches: list[SearchFilters], after: list[sa.ColumnElement[bool]], limit: int,
    selected: list[Any],
) -> sa.Select[Any]:
    """The branches of :func:`page_statement` as one ``LATERAL`` scan per value of an array (PostgreSQL)."""
    c = message_table.c
    rest = filters
    values: list[Any] = []
    conditions: list[sa.ColumnElement[bool]] = []
    for name, column, listed in (("codes", c.last_error_code, [b.error_codes for b in branches]),
                                 ("states", c.state, [b.states for b in branches])):
        if all(len(value) == 1 for value in listed) and len({value[0] for value in listed}) > 1:
            array = sa.bindparam(name, [str(value[0]) for value in dict.fromkeys(listed)],
                                 type_=postgresql.ARRAY(sa.String), unique=True)
            unnested = sa.func.unnest(array).table_valued("value").render_derived(name=name)
            values.append(unnested)
            conditions.append(column == unnested.c.value)
            rest = replace(rest, error_codes=()) if name == "codes" else replace(rest, states=())
    scan = (sa.select(*selected).where(*conditions, *rest.conditions(), *after)
            .order_by(c.receive_ts.desc(), c.id.desc()).limit(limit + 1).lateral("page"))
    joined: Any = values[0]
    for more in values[1:]:
        joined = joined.join(more, sa.true())
    return (sa.select(*scan.c).select_from(joined.join(scan, sa.true()))
            .order_by(scan.c.receive_ts.desc(), scan.c.id.desc()).limit(limit + 1))


#: a search without filters (every message): its count is not steered (:func:`steer_count`)
_NO_FILTER = SearchFilters()


def steer_count(connection: sa.Connection, filters: SearchFilters, on: bool = True) -> bool:
    """On PostgreSQL, with a filter that is not a text: make the capped count of ``filters`` read a B-tree index
    (``on``) or stop doing so (``on=False``, after the count), for the rest of the transaction. True when it did.

    A B-tree index serves every filter but the text ones, so the count reads at most ``COUNT_CAP + 1`` of its
    entries; the planner would rather read every match into a bitmap before the LIMIT, or read the table until
    ``COUNT_CAP`` rows match (20,000 rows for a filter that 5 % of the messages match). Without any filter the
    table's first ``COUNT_CAP + 1`` rows are the count: its sequential scan reads as few rows, from all-visible
    pages, where an index-only scan of the newest entries fetches their heap rows (1.1 against 1.8 ms at 1M)."""
    if connection.dialect.name != "postgresql" or filters.has_text or filters == _NO_FILTER:
        return False
    value = "off" if on else "DEFAULT"
    connection.exec_driver_sql(f"SET LOCAL enable_seqscan TO {value}; SET LOCAL enable_bitmapscan TO {value}")
    return True


#: how many of the newest messages matching the other filters a text search checks for its count, when its first
#: page had matches enough (:func:`probe_count_statement`); its page checks ten times the page (:func:`probe_statement`)
TEXT_PROBE = 2 * (COUNT_CAP + 1)


def probe_statement(
    filters: SearchFilters, cursor: str | None, limit: int, columns: Sequence[str] | None = None
) -> sa.Select[Any]:
    """A text search's first try: the text checked on the newest ``10 * (limit + 1)`` messages that match the
    other filters (read in the order of their B-tree index, so at most that many); ``limit + 1`` rows of the
    ``columns`` named (default every column).

    When the text is common among them (one in ten or more), this finds the page from a bounded read. A trigram
    index finds a rare text fast but cannot stop early: its bitmap holds every match before the LIMIT (60,000
    rows for an error code with a text its errors share).
    """
    needed = None if columns is None else [*columns, "last_error_text", "payload"]
    candidates = page_statement(filters.without_text(), cursor, 10 * (limit + 1) - 1, needed).subquery()
    order = (candidates.c.receive_ts.desc(), candidates.c.id.desc())
    return (sa.select(*_columns(columns, candidates)).where(*filters.text_conditions(candidates.c))
            .order_by(*order).limit(limit + 1))


#: a word of a text filter found in more than this share of the messages a text search checked first is not looked
#: up in the trigram index (:func:`narrowed`): the index reads the whole list of the rows holding each of its
#: trigrams, and a word nearly every payload holds (a tag or key name) is a list of 1M rows at 1M messages
COMMON_WORD_SHARE = 0.1


def text_words(text: str) -> list[str]:
    """The words of ``text`` as the trigram index sees them: runs of letters or digits (``pg_trgm`` splits a text
    at every other character), lower case, each once, in order."""
    words: list[str] = []
    for word in "".join(char if char.isalnum() else " " for char in text.lower()).split():
        if word not in words:
            words.append(word)
    return words


#: how many of the candidates a text search checked first (:func:`probe_statement`) are sampled for its words
#: (:func:`narrowed`): the newest, already read by the probe
WORD_SAMPLE = 100


def sample_statement(filters: SearchFilters, words: Sequence[str], cursor: str | None) -> sa.Select[Any]:
    """(candidates, then per word of ``words`` how many candidates' payloads hold it), where the candidates are the
    newest :data:`WORD_SAMPLE` messages after ``cursor`` that match the filters but the text ones (the first of
    those :func:`probe_statement` checks)."""
    candidates = page_statement(filters.without_text(), cursor, WORD_SAMPLE - 1, ["receive_ts", "id", "payload"])
    payload = candidates.subquery().c.payload
    counts: list[Any] = [sa.func.count(), *(sa.func.count().filter(payload.ilike(like_pattern(word), escape="\\"))
                                            for word in words)]
    return sa.select(*counts).select_from(payload.table)


def narrowed(
    connection: sa.Connection, filters: SearchFilters, cursor: str | None, limit: int
) -> SearchFilters | None:
    """The filters of the trigram page of a text search whose first try (:func:`probe_statement`) did not fill its
    page: on PostgreSQL, a ``payload_text`` looked up in the payload index (:attr:`~SearchFilters.payload_index`,
    :meth:`~SearchFilters.payload_matches`) and, when it has several words, with the
    :attr:`~SearchFilters.index_words` to look up instead of the whole text, or None when the first try checked
    every candidate (its rows are the answer).

    One statement counts how many of the newest :data:`WORD_SAMPLE` candidates of the probe hold each word. A word
    found in more than :data:`COMMON_WORD_SHARE` of them is left out of the index lookup, and so is a word shorter
    than 3 characters (alone it gives the index no trigram); the whole text is then checked on the rows the index
    finds, so the matches are the same. No index words when no word is common or none is left to look up.
    The error text is always looked up whole: its index holds only the messages with an error, so even a word
    every error holds is a short list."""
    if connection.dialect.name != "postgresql" or filters.payload_text is None:
        return filters
    indexed = replace(filters, payload_index=True)
    words = text_words(filters.payload_text)
    if len(words) < 2:
        return indexed
    statement, values = prepared("sample", lambda s: sample_statement(s.filters, s.words, s.cursor),
                                 Search(filters, cursor, tuple(words)))
    candidates, *holding = connection.execute(statement, values).one()
    if candidates < min(WORD_SAMPLE, 10 * (limit + 1)):  # fewer candidates than the probe checked
        return None
    common = {word for word, count in zip(words, holding, strict=True) if count > COMMON_WORD_SHARE * candidates}
    kept = tuple(word for word in words if word not in common and len(word) >= 3)
    if not common or not kept:
        return indexed
    return replace(indexed, index_words=kept)


def probe_count_statement(filters: SearchFilters) -> sa.Select[Any]:
    """(matches, the number of the last candidate read) among the newest :data:`TEXT_PROBE` messages that match the
    filters but the text ones, read newest first until ``COUNT_CAP + 1`` match: every match when the last number
    read is below :data:`TEXT_PROBE` (fewer candidates), else at least ``COUNT_CAP + 1`` when the text is common.

    The candidates are numbered as read; only the matches and the :data:`TEXT_PROBE`-th candidate are kept, and the
    reading stops at ``COUNT_CAP + 1`` of them, so a text that every candidate holds reads half the candidates."""
    needed = ["receive_ts", "id", "last_error_text", "payload"]  # the rest of the row is not looked at
    candidates = page_statement(filters.without_text(), None, TEXT_PROBE - 1, needed).subquery()
    number = sa.func.row_number().over(order_by=(candidates.c.receive_ts.desc(), candidates.c.id.desc()))
    matched = sa.case((sa.and_(*filters.text_conditions(candidates.c)), 1), else_=0)
    numbered = sa.select(number.label("number"), matched.label("matched")).subquery()
    kept = (sa.select(numbered.c.number, numbered.c.matched)
            .where(sa.or_(numbered.c.matched == 1, numbered.c.number == TEXT_PROBE)).limit(COUNT_CAP + 1).subquery())
    counts: sa.Select[Any] = sa.select(sa.func.coalesce(sa.func.sum(kept.c.matched), 0),
                                       sa.func.coalesce(sa.func.max(kept.c.number), 0))
    return counts


def probe_page_count_statement(
    filters: SearchFilters, limit: int, columns: Sequence[str] | None = None
) -> sa.Select[Any]:
    """An error text search's first page and its count in one statement, from one read of its candidates: the newest
    :data:`TEXT_PROBE` messages that match the filters but the text, read newest first until ``COUNT_CAP + 1`` match
    (what :func:`probe_count_statement` reads). Its rows: the first ``limit + 1`` matches, newest first, of the
    ``columns`` named (default every column), then ``matched`` (1; 0 for the :data:`TEXT_PROBE`-th candidate when it
    was read and no page row is left), ``matches`` (matches read) and ``last_number`` (the number of that candidate,
    :data:`TEXT_PROBE`, or less when there were fewer candidates). No row: no match among fewer candidates.

    Where :func:`probe_statement` and :func:`probe_count_statement` read the first candidates twice (an error code
    and a state in a day at 1M messages: 740 candidates, one heap buffer each, read by both), this reads each once,
    in one round trip. The candidates carry only their key and error text; the page's rows are read by id after."""
    candidates = page_statement(filters.without_text(), None, TEXT_PROBE - 1,
                                ["receive_ts", "id", "last_error_text"]).subquery()
    number = sa.func.row_number().over()  # in the order read, the candidates' (an ORDER BY here compares every row)
    matched = sa.case((sa.and_(*filters.text_conditions(candidates.c)), 1), else_=0)
    numbered = sa.select(candidates.c.receive_ts, candidates.c.id, number.label("number"),
                         matched.label("matched")).subquery()
    kept = (sa.select(numbered).where(sa.or_(numbered.c.matched == 1, numbered.c.number == TEXT_PROBE))
            .limit(COUNT_CAP + 1).subquery())
    newest = (kept.c.matched.desc(), kept.c.receive_ts.desc(), kept.c.id.desc())
    page = (sa.select(kept.c.receive_ts, kept.c.id, kept.c.matched, sa.func.sum(kept.c.matched).over().label("matches"),
                      sa.func.max(kept.c.number).over().label("last_number"))
            .order_by(*newest).limit(limit + 1).subquery())
    m = message_table
    return (sa.select(*_columns(columns), page.c.matched, page.c.matches, page.c.last_number)
            .select_from(page.join(m, m.c.id == page.c.id))
            .order_by(page.c.matched.desc(), page.c.receive_ts.desc(), page.c.id.desc()))


def _plan(connection: sa.Connection, kind: str, query: Callable[[SearchFilters], sa.Select[Any]], options: str,
          filters: SearchFilters) -> dict[str, Any]:
    """The top node of PostgreSQL's ``EXPLAIN (options, FORMAT JSON)`` of the ``query`` of ``filters`` (built once
    per shape of the filters, :func:`~openroute.queries._prepared.prepared`)."""
    statement, values = prepared(kind, lambda s: Explain(query(s.filters), options), Search(filters))
    plan = connection.execute(statement, values).scalar_one()
    document = json.loads(plan) if isinstance(plan, str) else plan
    return dict(document[0]["Plan"])


def _matching(filters: SearchFilters) -> sa.Select[Any]:
    """A row for each message matching ``filters`` (what the planner's estimate of the total is read from)."""
    return sa.select(sa.literal(1)).select_from(message_table).where(*filters.conditions())


def _capped(filters: SearchFilters) -> sa.Select[Any]:
    """:func:`_matching` up to ``COUNT_CAP + 1`` rows."""
    return _matching(filters).limit(COUNT_CAP + 1)


def _execute(
    connection: sa.Connection, kind: str, build: Callable[[SearchFilters], sa.Select[Any]], filters: SearchFilters
) -> sa.CursorResult[Any]:
    """``build(filters)`` executed, built once per shape of the filters
    (:func:`openroute.queries._prepared.prepared`)."""
    statement, values = prepared(kind, lambda s: build(s.filters), Search(filters))
    return connection.execute(statement, values)


def _names(columns: Sequence[str] | None) -> tuple[str, ...] | None:
    return None if columns is None else tuple(columns)


def counted_with_estimate(connection: sa.Connection, filters: SearchFilters) -> tuple[int, int]:
    """PostgreSQL: (matches counted up to ``COUNT_CAP + 1``, the planner's estimate of all matches) in one statement.

    ``EXPLAIN (ANALYZE, TIMING OFF)`` of ``SELECT 1 ... LIMIT COUNT_CAP + 1`` runs the capped count (the rows its
    Limit returned) and shows the estimate its scan was planned with: one round trip and one plan where a count
    and an ``EXPLAIN`` took two of each."""
    limit = _plan(connection, "counted", _capped, "ANALYZE, TIMING OFF, ", filters)
    scan = limit["Plans"][0]  # what the Limit reads from: a scan, or a Gather of parallel ones
    return int(limit["Actual Rows"]), int(scan["Plan Rows"])


def _count(
    connection: sa.Connection, filters: SearchFilters, keep_settings: bool, probed: tuple[int, int] | None = None
) -> tuple[int, bool]:
    """(total, estimated); ``probed``: what :func:`probe_count_statement` gives, when the search has it already."""
    exact, estimate = 0, None
    postgresql = connection.dialect.name == "postgresql"
    if filters.has_text:
        if probed is None:
            counted: Any = _execute(connection, "probe_count", probe_count_statement, filters).one()
            probed = (int(counted[0]), int(counted[1]))
        exact, last = probed
        if exact <= COUNT_CAP and last < TEXT_PROBE:  # the probe saw every candidate
            return int(exact), False
    if exact <= COUNT_CAP:
        steered = steer_count(connection, filters)
        if postgresql:
            exact, estimate = counted_with_estimate(connection, filters)
        else:
            exact = _execute(connection, "count", count_statement, filters).scalar_one()
        # an error rolls the transaction back, and the settings with it; the estimate does not depend on them (the
        # planner's row estimate of one table is the same for every path)
        if steered and not keep_settings:
            steer_count(connection, filters, on=False)
    if exact <= COUNT_CAP:
        return int(exact), False
    if not postgresql:
        return COUNT_CAP + 1, True  # SQLite has no row estimate: "more than COUNT_CAP"
    if estimate is None:  # the text probe found more than COUNT_CAP: only the estimate is missing
        estimate = int(_plan(connection, "estimate", _matching, "", filters)["Plan Rows"])
    return max(estimate, COUNT_CAP + 1), True


@dataclass(frozen=True)
class SummaryPage:
    """One page of search results as rows of :data:`SUMMARY_COLUMNS`, newest first (:func:`search_summaries`)."""

    rows: Sequence[sa.Row[Any]]
    #: pass it back as ``cursor`` for the next page; None on the last page
    next_cursor: str | None
    #: how many messages match (exact when ``total_estimated`` is False)
    total: int
    total_estimated: bool


def _search(
    connection: sa.Connection, filters: SearchFilters, cursor: str | None, limit: int, columns: Sequence[str] | None,
    keep_settings: bool = False,
) -> tuple[Sequence[sa.Row[Any]], str | None, int, bool]:
    """The rows of one page (``columns``, default every column), the next page's cursor and the total."""
    if not 1 <= limit <= MAX_LIMIT:
        raise InvalidQueryError(f"limit must be in 1..{MAX_LIMIT}, got {limit}")
    rows: Sequence[sa.Row[Any]] = []
    page_filters: SearchFilters | None = filters
    compiling = False  # whether JIT was turned off for the trigram page (:func:`_without_jit`)
    probed: tuple[int, int] | None = None
    if cursor is None and filters.payload_text is None and _errors_only(filters):
        rows, probed = _probe_page_count(connection, filters, limit, columns)
        if probed[0] <= COUNT_CAP and probed[1] < TEXT_PROBE:  # every candidate read: its matches are the answer
            return rows[:limit], _next_cursor(rows, limit), probed[0], False
    elif filters.has_text:  # the newest matches of the other filters first; the trigram index when the text is rare
        statement, values = prepared("probe", lambda s: probe_statement(s.filters, s.cursor, limit, columns),
                                     Search(filters, cursor), (limit, _names(columns)))
        rows = connection.execute(statement, values).all()
    if len(rows) <= limit:  # the text is rare among the newest candidates: the trigram index finds the page
        if probed is None and filters.has_text:
            page_filters = narrowed(connection, filters, cursor, limit)
        if page_filters is not None:  # else the first try checked every candidate: its rows are the answer
            lateral = connection.dialect.name == "postgresql"
            compiling = page_filters.payload_index and _without_jit(connection)
            statement, values = prepared(
                "page", lambda s: page_statement(s.filters, s.cursor, limit, columns, lateral=lateral),
                Search(page_filters, cursor), (limit, _names(columns), lateral),
            )
            rows = connection.execute(statement, values).all()
    next_cursor = _next_cursor(rows, limit)
    if cursor is None and next_cursor is None:  # the first page holds every match: that is the count
        total, estimated = len(rows), False
    else:
        total, estimated = _count(connection, page_filters or filters, keep_settings, probed)
    if compiling and not keep_settings:
        _without_jit(connection, on=False)
    return rows[:limit], next_cursor, total, estimated


def _without_jit(connection: sa.Connection, on: bool = True) -> bool:
    """On PostgreSQL, stop compiling statements to machine code (JIT) for the rest of the transaction (``on``) or
    compile them again as configured (``on=False``); True when it did.

    A payload search reads the payloads still pending one by one (:meth:`SearchFilters.pending_matches`), which the
    planner costs by the pending table's statistics: a million dead rows never analyzed cost it past
    ``jit_above_cost``, and compiling the statement took 230-300 ms where running it took 8 ms (at 1M). A search
    reads too few rows for compiled code to pay off."""
    if connection.dialect.name != "postgresql":
        return False
    connection.exec_driver_sql("SET LOCAL jit TO off" if on else "SET LOCAL jit TO DEFAULT")
    return True


#: the states whose messages all carry an error (:func:`_errors_only`)
_ERROR_STATES = frozenset({MessageState.FAILED, MessageState.PARTLY_FAILED})


def _errors_only(filters: SearchFilters) -> bool:
    """Whether ``filters`` search an error text among messages that all carry an error (an error code or only the
    failed states is asked for): a text is then likely common among the candidates, whose count reads them anyway, so
    the page and the count are read together (:func:`probe_page_count_statement`). A text searched among every message
    is first checked on fewer of them (:func:`probe_statement`: a rare text costs a fourth of the candidates)."""
    if filters.error_text is None:
        return False
    return bool(filters.error_codes) or (bool(filters.states) and _ERROR_STATES.issuperset(filters.states))


def _next_cursor(rows: Sequence[sa.Row[Any]], limit: int) -> str | None:
    """The cursor after the ``limit``-th of ``rows`` when there are more (``limit + 1`` were asked for)."""
    if len(rows) <= limit:
        return None
    last = rows[limit - 1]._mapping
    return cursor_after(last["receive_ts"], last["id"])


def _probe_page_count(
    connection: sa.Connection, filters: SearchFilters, limit: int, columns: Sequence[str] | None
) -> tuple[Sequence[sa.Row[Any]], tuple[int, int]]:
    """:func:`probe_page_count_statement`: its matches as rows of the ``columns`` (default every column), and
    (matches, last candidate's number) as :func:`probe_count_statement` gives them."""
    names = [column.name for column in message_table.c] if columns is None else list(columns)
    statement, values = prepared("probe_page_count", lambda s: probe_page_count_statement(s.filters, limit, columns),
                                 Search(filters), (limit, _names(columns)))
    frozen = connection.execute(statement, values).freeze()
    flags = frozen().columns("matched", "matches", "last_number").all()
    rows = [row for row, flag in zip(frozen().columns(*names).all(), flags, strict=True) if flag.matched]
    return rows, ((int(flags[0].matches), int(flags[0].last_number)) if flags else (0, 0))


def search_messages(
    connection: sa.Connection, filters: SearchFilters, cursor: str | None = None, limit: int = DEFAULT_LIMIT
) -> Page:
    """One page of the messages matching ``filters``, newest first (receive time, then id), after ``cursor``.

    ``limit`` is 1..:data:`MAX_LIMIT`. The total is exact up to :data:`COUNT_CAP` matches, else estimated.
    Raises :class:`InvalidQueryError` for a bad ``limit`` or a cursor this search did not issue.
    """
    rows, next_cursor, total, estimated = _search(connection, filters, cursor, limit, None)
    return Page([row_to_message(row) for row in rows], next_cursor, total, estimated)


def search_summaries(
    connection: sa.Connection, filters: SearchFilters, cursor: str | None = None, limit: int = DEFAULT_LIMIT, *,
    keep_settings: bool = False,
) -> SummaryPage:
    """:func:`search_messages` reading only the :data:`SUMMARY_COLUMNS` of each match, as rows (what the admin
    API answers: no message objects are built). Same arguments, order, total and errors.

    With ``keep_settings`` the planner settings of the capped count (:func:`steer_count`) stay for the rest of the
    transaction, one round trip fewer: pass it when the transaction ends with the search."""
    rows, next_cursor, total, estimated = _search(connection, filters, cursor, limit, SUMMARY_COLUMNS, keep_settings)
    return SummaryPage(rows, next_cursor, total, estimated)


def summary_page(store: MessageStore, filters: SearchFilters, cursor: str | None, limit: int) -> SummaryPage:
    """:func:`search_summaries` on a connection of ``store``'s own, rolled back at its end (the count's planner
    settings with it): what the admin API, the console and ``openroute messages`` read a page of their lists with.
    A cursor this search did not issue is an :class:`InvalidQueryError` before any database work."""
    if cursor is not None:
        decode_cursor(cursor)
    with store.engine.connect() as connection:
        return search_summaries(connection, filters, cursor, limit, keep_settings=True)
