"""The plans PostgreSQL picks for the payload search's statements while the pending table's statistics lie.

A payload text is looked up in the indexed copies and checked on the payloads still pending
(:meth:`~openroute.queries.filters.SearchFilters.payload_matches`). Right after a bulk load, a restore or an outage's
backlog the pending table has rows (or only dead ones, once every payload was moved) and no statistics until
autovacuum comes by: planned as a table of that size, the pending branch read all of ``message`` to test membership
in an empty table (issue 45, item 6: 31,000 buffers, 690-850 ms at 1M). These tests run every statement of every
payload search shape under ``EXPLAIN (ANALYZE, BUFFERS)``, as prepared statements under custom and generic plans,
on such a store: no scan of ``message``, and the reads of the few rows the search looks at. Every other search shape
is checked right after a bulk load that nothing analyzed, once a node's repoll looked at the statistics.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa
from openroute.persistence import MessageStore, message_table

from benchmarks.store_fill import START, analyze, fill
from openroute.queries import parse_filters
from openroute.queries.search import search_summaries
from tests.services import scratch_postgres_store

#: messages of the store, every payload moved into the index: the pending table holds as many dead rows
ROWS = 80_000
#: messages of the bulk load made pending again on top of it
LOADED = 2_000

pytestmark = pytest.mark.postgres


@pytest.fixture(scope="module")
def bulk_loaded() -> Iterator[MessageStore]:
    """:data:`ROWS` mixed messages stored in one statement and their payloads moved in another (as
    ``benchmarks/store_fill.py`` and an indexer catching up leave them): ``message`` and the copies analyzed, the
    pending table's :data:`ROWS` dead rows never vacuumed nor analyzed (autovacuum off for it). One database for the
    module."""
    with scratch_postgres_store("openroute_search_plans") as store:
        with store.engine.begin() as connection:
            connection.exec_driver_sql("ALTER TABLE message_payload_pending SET (autovacuum_enabled = false)")
            fill(connection, ROWS, "mixed", "plans")
        with store.engine.begin() as connection:
            analyze(connection)
        yield store


def _day(at: int) -> dict[str, str]:
    start = START + timedelta(seconds=at)
    return {"received_from": start.isoformat(), "received_to": (start + timedelta(days=1)).isoformat()}


#: every shape of a payload search's trigram page: a text with a common word (the index asked for the rare one), one
#: word (asked whole), with a route, a window, no match, and a list of states (a LATERAL scan per state) whose
#: text is common enough for a full page, a next page and a capped count
SEARCHES: dict[str, dict[str, Any]] = {
    "payload_text": {"payload_text": 'id="20000"'},
    "payload_text one word": {"payload_text": "20000"},
    "payload_text+service": {"payload_text": 'id="20000"', "service": "svc0"},
    "payload_text+1 day window": {"payload_text": '"32345', **_day(20_000)},
    "payload_text (no match)": {"payload_text": 'id="nothing"'},
    "payload_text+states, counted": {"payload_text": 'id="12', "state": ["OK", "FAILED"]},
}

#: the searches whose statements read only a few rows (the counted one reads its 1,001 matches, a window's generic
#: plan may read the window in its index)
RARE = ("payload_text", "payload_text one word", "payload_text+service", "payload_text (no match)")


def _statements(store: MessageStore, connection: sa.Connection, params: dict[str, Any]) -> list[tuple[str, Any]]:
    """The statements reading the pending table that a search runs (first page and, when there is one, the next),
    with their parameters; checks that the pages hold what a plain ILIKE of the payloads finds, and that JIT is off for
    them."""
    captured: list[tuple[str, Any]] = []

    def listener(_conn: Any, _cursor: Any, statement: str, parameters: Any, _context: Any, _many: bool) -> None:
        if "message_payload_pending" in statement or statement == "SET LOCAL jit TO off":
            captured.append((statement, parameters))

    filters = parse_filters(params)
    c = message_table.c
    expected = connection.execute(sa.select(c.id).where(*filters.conditions())
                                  .order_by(c.receive_ts.desc(), c.id.desc()).limit(100)).scalars().all()
    sa.event.listen(store.engine, "before_cursor_execute", listener)
    try:
        first = search_summaries(connection, filters, None, 50)
        found = [row.id for row in first.rows]
        if first.next_cursor is not None:
            found += [row.id for row in search_summaries(connection, filters, first.next_cursor, 50).rows]
    finally:
        sa.event.remove(store.engine, "before_cursor_execute", listener)
    assert found == expected[:len(found)] and len(found) == min(len(expected), 100), params
    # costed by the pending table's statistics, the statements are not compiled (JIT) for the search
    assert captured and captured[0][0] == "SET LOCAL jit TO off", f"{params}: the trigram page was not asked"
    return captured[1:]


def _explained(connection: sa.Connection, statement: str, parameters: dict[str, Any], mode: str) -> dict[str, Any]:
    """``EXPLAIN (ANALYZE, BUFFERS)`` of ``statement`` prepared on the server and executed with ``parameters`` under
    ``plan_cache_mode`` ``mode`` (PostgreSQL 15 plans an EXPLAIN of bound parameters as a custom plan only)."""
    for prefix in ("EXPLAIN (ANALYZE, TIMING OFF, FORMAT JSON) ", "EXPLAIN (FORMAT JSON) "):
        statement = statement.removeprefix(prefix)  # the capped count with its estimate, the estimate: their query
    names: list[str] = []

    def number(match: re.Match[str]) -> str:
        names.append(match.group(1))
        return f"${len(names)}"

    numbered = re.sub(r"%\((\w+)\)s", number, statement).replace("%%", "%")
    raw = connection.connection.dbapi_connection
    assert isinstance(raw, psycopg.Connection)
    values = ", ".join(psycopg.sql.Literal(parameters[name]).as_string(raw) for name in names)
    with raw.cursor() as cursor:
        cursor.execute(f"SET plan_cache_mode = {mode}")
        cursor.execute(f"PREPARE payload_search AS {numbered}")
        try:
            cursor.execute(f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) EXECUTE payload_search({values})")
            row = cursor.fetchone()
            assert row is not None
            document = row[0]
        finally:
            cursor.execute("DEALLOCATE payload_search")
            cursor.execute("RESET plan_cache_mode")
    return dict((json.loads(document) if isinstance(document, str) else document)[0]["Plan"])


def _nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", []):
        yield from _nodes(child)


def _buffers(plan: dict[str, Any]) -> int:
    """Buffers the plan touched (its top node counts its children's, its init plans' and its subplans')."""
    return int(plan.get("Shared Hit Blocks", 0) + plan.get("Shared Read Blocks", 0))


def _pages(connection: sa.Connection, table: str) -> int:
    return int(connection.exec_driver_sql(f"SELECT pg_relation_size('{table}') / 8192").scalar_one())


def _check_plans(store: MessageStore, connection: sa.Connection, pending_rows: int) -> int:
    """Every statement of every search of :data:`SEARCHES` under custom and generic plans: never a sequential scan
    of ``message``; the pending branch driven from the pending table, reading its pages and ``pending_rows``
    payloads by primary key; the rare searches' reads bounded by that and what their few matches take. That bound."""
    pending_bound = _pages(connection, "message_payload_pending") + 6 * pending_rows + 10
    bound = pending_bound + 300
    for name, params in SEARCHES.items():
        for statement, parameters in _statements(store, connection, params):
            for mode in ("force_custom_plan", "force_generic_plan"):
                plan = _explained(connection, statement, parameters, mode)
                scans = [(node["Node Type"], node.get("Relation Name"), node.get("Index Name"))
                         for node in _nodes(plan)]
                assert not [scan for scan in scans if scan[:2] == ("Seq Scan", "message")], (name, mode, scans)
                [branch] = [node for node in _nodes(plan) if node.get("Relation Name") == "message_payload_pending"]
                assert _buffers(branch) < pending_bound, (name, mode, _buffers(branch), pending_bound, scans)
                if name in RARE:
                    assert _buffers(plan) < bound, (name, mode, _buffers(plan), bound, scans)
    return bound


def test_a_payload_search_reads_the_pending_table_not_the_messages_whatever_its_statistics(
    bulk_loaded: MessageStore,
) -> None:
    """Every payload moved, the pending table holds only dead rows that no statistics count: each statement of each
    payload search reads that table (its dead pages) and the few messages it looks at, never ``message`` whole."""
    with bulk_loaded.engine.connect() as connection:
        analyzed = connection.exec_driver_sql(
            "SELECT reltuples FROM pg_class WHERE relname = 'message_payload_pending'").scalar_one()
        assert analyzed < 0, "the pending table must have no statistics (never vacuumed or analyzed)"
        bound = _check_plans(bulk_loaded, connection, pending_rows=0)
        assert bound < _pages(connection, "message") / 2  # a scan of message shows


def test_right_after_a_bulk_load_the_payload_search_reads_the_pending_messages_by_key(
    bulk_loaded: MessageStore,
) -> None:
    """A bulk load of :data:`LOADED` messages on top (their payloads not moved yet, the statistics as before): the
    searches find a pending message too, and each statement reads the pending ids and their messages by primary
    key, never ``message`` whole (in a transaction, rolled back)."""
    with bulk_loaded.engine.connect() as connection:
        connection.begin()
        fill(connection, LOADED, "mixed", "loaded", first=ROWS + 1)  # moves them: made pending again below
        connection.exec_driver_sql(f"DELETE FROM message_payload_text WHERE message_id > {ROWS}")
        connection.exec_driver_sql(
            f"INSERT INTO message_payload_pending (message_id) SELECT id FROM message WHERE id > {ROWS}")
        assert bulk_loaded.payload_index.pending(connection) == LOADED
        pending_id = connection.exec_driver_sql(
            f"SELECT id FROM message WHERE correlation_id = 'loaded-{ROWS + 1500}'").scalar_one()
        page = search_summaries(connection, parse_filters({"payload_text": f'id="{ROWS + 1500}"'}), None, 50)
        assert [row.id for row in page.rows] == [pending_id]
        _check_plans(bulk_loaded, connection, pending_rows=LOADED)
        connection.rollback()


#: every other shape of search an operator asks (the admin API, the console and ``openroute messages`` share them):
#: nothing, a state or states, a route, each text filter, error codes and texts, a window, a mix, no match
EVERY_SEARCH: dict[str, dict[str, Any]] = {
    "the latest": {},
    "state": {"state": ["FAILED"]},
    "states": {"state": ["FAILED", "PARTLY_FAILED"]},
    "service": {"service": "svc1"},
    "route": {"service": "svc1", "operation": "op2"},
    "source_system": {"source_system": "src3"},
    "correlation_id": {"correlation_id": "bulk-31415"},
    "object_id": {"object_id": "obj-2718"},
    "process_id": {"process_id": "p-1414"},
    "entity_type": {"entity_type": "customer"},
    "error_code": {"error_code": "HLR_DOWN"},
    "error_text": {"error_text": "hlr 2000"},
    "1 hour window": {"received_from": (START + timedelta(hours=5)).isoformat(),
                      "received_to": (START + timedelta(hours=6)).isoformat()},
    "state+route+window": {"state": ["FAILED"], "service": "svc2", **_day(3_600)},
    "correlation_id (no match)": {"correlation_id": "nothing"},
}


def _every_statement(store: MessageStore, connection: sa.Connection, params: dict[str, Any]) -> list[tuple[str, Any]]:
    """The statements reading ``message`` that a search runs for its first page, the next one and its count."""
    captured: list[tuple[str, Any]] = []

    def listener(_conn: Any, _cursor: Any, statement: str, parameters: Any, _context: Any, _many: bool) -> None:
        if "FROM message" in statement and isinstance(parameters, dict):
            captured.append((statement, parameters))

    filters = parse_filters(params)
    sa.event.listen(store.engine, "before_cursor_execute", listener)
    try:
        first = search_summaries(connection, filters, None, 50)
        if first.next_cursor is not None:
            search_summaries(connection, filters, first.next_cursor, 50)
    finally:
        sa.event.remove(store.engine, "before_cursor_execute", listener)
    assert captured, params
    return captured


def _reads(store: MessageStore, connection: sa.Connection) -> dict[tuple[str, int, str], tuple[int, bool]]:
    """(buffers read, whether ``message`` is scanned whole) of every statement of every search of
    :data:`EVERY_SEARCH`, under custom and generic plans."""
    reads = {}
    for name, params in EVERY_SEARCH.items():
        for number, (statement, parameters) in enumerate(_every_statement(store, connection, params)):
            for mode in ("force_custom_plan", "force_generic_plan"):
                plan = _explained(connection, statement, parameters, mode)
                whole = any(node["Node Type"] == "Seq Scan" and node.get("Relation Name") == "message"
                            for node in _nodes(plan))
                reads[(name, number, mode)] = (_buffers(plan), whole)
    return reads


def test_right_after_a_bulk_load_every_search_plans_as_on_a_settled_store_once_the_repoll_looked() -> None:
    """:data:`ROWS` messages loaded in one statement and nothing analyzed (a restore, an import, an outage's backlog
    before autovacuum comes by: ``message`` has no statistics). PostgreSQL then plans on guesses: a search for one
    route's latest messages reads every row of the route and sorts them (2,000 of the table's ~1,900 pages, against
    12 analyzed). A running node's repoll looks every 10 s (``MessageStore.refresh_stale_statistics``) and analyzes
    the table once a tenth of it changed: after that look, every statement of every search shape reads no more than
    on a settled store (twice as many buffers and 200 more at most), and scans ``message`` whole only where the
    settled plan does too."""
    with scratch_postgres_store("openroute_bulk_plans") as store:
        with store.engine.begin() as connection:
            for table in ("message", "message_payload_pending", "message_transition"):
                connection.exec_driver_sql(f"ALTER TABLE {table} SET (autovacuum_enabled = false)")
            fill(connection, ROWS, "mixed", "bulk")
        with store.engine.connect() as connection:
            assert connection.exec_driver_sql(
                "SELECT reltuples FROM pg_class WHERE relname = 'message'").scalar_one() < 0, "message was analyzed"
            guessed = _reads(store, connection)
        assert store.refresh_stale_statistics(), "the repoll's look did not see the bulk load"
        assert not store.refresh_stale_statistics(), "analyzed, the table is not stale any more"
        with store.engine.connect() as connection:
            kept = _reads(store, connection)
        with store.engine.begin() as connection:
            analyze(connection)
        with store.engine.connect() as connection:
            settled = _reads(store, connection)
            pages = _pages(connection, "message")
    assert kept.keys() == settled.keys() == guessed.keys()

    def worse(reads: dict[tuple[str, int, str], tuple[int, bool]]) -> dict[Any, Any]:
        return {key: (reads[key], settled[key]) for key in reads
                if reads[key][0] > max(2 * settled[key][0], settled[key][0] + 200)
                or (reads[key][1] and not settled[key][1])}

    # what the repoll's look is for: without it, planned on guesses, searches read most of the table
    assert worse(guessed), "the bulk load left plans as good as analyzed ones: the test's store shows nothing"
    assert not worse(kept), f"plans that lean on missing statistics (buffers, whole scan; {pages} pages): {worse(kept)}"
