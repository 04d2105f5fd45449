"""The dashboard's reads against a real store (SQLite and PostgreSQL): the same figures as plain GROUP BYs."""

from __future__ import annotations

import json
import random
from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import Any

import sqlalchemy as sa
from openroute.persistence import FINAL_STATES, MessageState, MessageStore, NewMessage, message_table

from benchmarks.store_fill import MIXED, START, fill
from openroute.queries._explain import Explain
from openroute.queries.dashboard import (
    _LATEST_ONE,
    FAILING_WINDOW,
    THROUGHPUT_BUCKETS,
    dashboard,
    latest_failures_statement,
)

S = MessageState


def _plain(store: MessageStore, now: Any) -> dict[tuple[str, str], Any]:
    """The failing routes as a GROUP BY of the failing messages with a lookup of each route's latest failure (the
    dashboard takes them from the kept counts)."""
    c = message_table.c
    failing_states = [MessageState.FAILED, MessageState.PARTLY_FAILED]
    with store.engine.connect() as connection:
        failing: dict[tuple[str, str], Any] = {}
        for service, operation, state, n in connection.execute(
                sa.select(c.service, c.operation, c.state, sa.func.count()).where(c.state.in_(failing_states))
                .group_by(c.service, c.operation, c.state)):
            failing.setdefault((service, operation), {"FAILED": 0, "PARTLY_FAILED": 0})[str(state)] = n
        for (service, operation), entry in list(failing.items()):
            entry["last"], entry["lastErrorCode"] = connection.execute(
                sa.select(c.last_update_ts, c.last_error_code).where(
                    c.service == service, c.operation == operation, c.state.in_(failing_states))
                .order_by(c.last_update_ts.desc(), c.id.desc()).limit(1)).one()
            if entry["last"] < now - FAILING_WINDOW:  # the route's latest failure is too old to list it
                del failing[service, operation]
    return failing


def test_the_dashboard_reads_what_plain_group_bys_read(store: MessageStore) -> None:
    """Two hours of mixed messages, one a second (1 % PARTLY_FAILED, 2 % FAILED over 20 routes, error codes
    alternating), a newer failure with its own code, and a backlog: each failing route has its failing messages
    and the time and code of its latest failure, that one query per figure gives; a route whose latest failure is
    over a day old is not listed."""
    with store.engine.begin() as connection:
        fill(connection, 7200, MIXED, "d")
        fill(connection, 3, "NEW", "n", first=9000)
        connection.execute(sa.update(message_table).where(message_table.c.correlation_id == "d-7101")
                           .values(last_error_code="LATEST"))  # svc1/op1's newest failure (7101 % 100 == 1)
    store.counts.recount()
    for now in (START + timedelta(seconds=7150), START + timedelta(seconds=7150, hours=23)):
        board = dashboard(store, now)
        keys = ("FAILED", "PARTLY_FAILED", "last", "lastErrorCode")
        failing = _plain(store, now)
        assert {(e["service"], e["operation"]): {k: e[k] for k in keys} for e in board.failing_routes} == failing
        assert failing and [e["FAILED"] for e in board.failing_routes] == sorted(
            (e["FAILED"] for e in board.failing_routes), reverse=True)
    days_later = dashboard(store, START + timedelta(days=2))  # the failures are still there, none of the last 24 h
    assert days_later.failing_routes == [] and days_later.by_state[MessageState.FAILED] > 0
    board = dashboard(store, START + timedelta(seconds=7150))
    latest = [e["lastErrorCode"] for e in board.failing_routes if (e["service"], e["operation"]) == ("svc1", "op1")]
    assert latest == ["LATEST"]
    assert board.oldest_open is not None and board.oldest_open.correlation_id == "d-100"  # PARTLY_FAILED is open


def test_the_throughput_is_the_transitions_into_a_final_state_per_five_minutes(store: MessageStore) -> None:
    """Transitions at minutes spread over the last 70 minutes (and one a few seconds ahead: another node's clock),
    restarts among them (FAILED, then NEW, then OK counts FAILED and OK), folded part way: the dashboard's figures
    per state and per five-minute bar are those of the transitions into a final state in its hour's minutes."""
    now = datetime.now(UTC)
    first = now.replace(second=0, microsecond=0) - timedelta(minutes=59)
    rng = random.Random(28)
    expected_states: Counter[MessageState] = Counter()
    expected_bars = [0] * THROUGHPUT_BUCKETS
    for index in range(60):
        message = store.insert_message(NewMessage(
            service="orders", operation="create", payload="{}", content_type="application/json",
            correlation_id=f"t-{index}", source_system="crm", receive_ts=now - timedelta(minutes=80)))
        path = rng.choice([[S.PROCESSING, S.OK], [S.PROCESSING, S.FAILED], [S.PROCESSING, S.FAILED, S.NEW,
                           S.PROCESSING, S.OK], [S.CANCEL], [S.PROCESSING, S.PARTLY_FAILED]])
        at = now - timedelta(seconds=rng.randrange(0, 70 * 60)) if index else now + timedelta(seconds=20)
        for to in path:
            current = store.get(message.message.id)
            assert current is not None
            assert store.transitions.apply((current.id, current.version, current.state, to, at, {}))
            if to in FINAL_STATES and at >= first:
                expected_states[to] += 1
                expected_bars[min(int((at.replace(second=0, microsecond=0) - first).total_seconds()) // 300,
                                  THROUGHPUT_BUCKETS - 1)] += 1
        if index == 30:
            store.counts.fold()
    board = dashboard(store, now)
    assert board.finished_last_hour == dict(expected_states) and board.throughput == expected_bars
    assert sum(expected_bars) > 0 and expected_states[S.FAILED] and expected_states[S.OK]
    store.counts.fold()  # everything folded: the same figures from the kept minutes alone
    assert dashboard(store, now).throughput == expected_bars


def test_the_latest_failure_of_a_route_is_one_entry_of_its_index(store: MessageStore) -> None:
    """The failing routes' lookup reads migration 0016's partial index, newest first (not the route's messages)."""
    with store.engine.begin() as connection:
        fill(connection, 7200, MIXED, "d")
    with store.engine.connect() as connection:
        if connection.dialect.name == "postgresql":
            connection.exec_driver_sql("ANALYZE message")
            statement = latest_failures_statement([("svc1", "op1"), ("svc2", "op2")])
            plan = json.dumps(connection.execute(Explain(statement)).scalar_one())
        else:
            compiled = _LATEST_ONE.params(service="svc1", operation="op1").compile(
                connection, compile_kwargs={"literal_binds": True})
            plan = "\n".join(str(row[-1]) for row in connection.exec_driver_sql(f"EXPLAIN QUERY PLAN {compiled}"))
    assert "ix_message_failing_route" in plan, plan


def test_the_dashboard_reads_the_counts_mark_once(store: MessageStore) -> None:
    """Its counts and its throughput are both read after the same mark of the one snapshot: read once (a round
    trip each time), and the figures are those of the counts' own reads."""
    with store.engine.begin() as connection:
        fill(connection, 600, MIXED, "d")
    store.counts.recount()
    now = START + timedelta(seconds=590)
    statements: list[str] = []

    def listener(*args: Any) -> None:
        statements.append(args[2])

    sa.event.listen(store.engine, "before_cursor_execute", listener)
    try:
        board = dashboard(store, now)
    finally:
        sa.event.remove(store.engine, "before_cursor_execute", listener)
    assert sum("FROM message_count_mark" in statement for statement in statements) == 1, statements
    by_state: Counter[MessageState] = Counter()
    for states in store.counts.by_route().values():
        by_state.update(states)
    assert board.by_state == dict(by_state) and sum(by_state.values()) == 600
