"""The dashboard's reads against a real store (SQLite and PostgreSQL): the same figures as plain GROUP BYs."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import sqlalchemy as sa
from openroute.persistence import FINAL_STATES, MessageState, MessageStore, message_table

from benchmarks.store_fill import MIXED, START, fill
from openroute.admin._explain import Explain
from openroute.console._queries import (
    _LATEST_ONE,
    FAILING_WINDOW,
    THROUGHPUT_BUCKETS,
    THROUGHPUT_WINDOW,
    dashboard,
    latest_failures_statement,
)


def _plain(store: MessageStore, now: Any) -> tuple[dict[MessageState, int], list[int], dict[tuple[str, str], Any]]:
    """The dashboard's window figures as one GROUP BY each, and the failing routes as a GROUP BY of the failing
    messages with a lookup of each route's latest failure (the dashboard takes them from the kept counts)."""
    c = message_table.c
    start = now - THROUGHPUT_WINDOW
    step = THROUGHPUT_WINDOW / THROUGHPUT_BUCKETS
    recent = sa.and_(c.state.in_(FINAL_STATES), c.last_update_ts >= start, c.last_update_ts <= now)
    bucket = sa.case(*[(c.last_update_ts < start + step * (i + 1), i) for i in range(THROUGHPUT_BUCKETS - 1)],
                     else_=THROUGHPUT_BUCKETS - 1)
    failing_states = [MessageState.FAILED, MessageState.PARTLY_FAILED]
    with store.engine.connect() as connection:
        finished = {MessageState(s): n for s, n in connection.execute(
            sa.select(c.state, sa.func.count()).where(recent).group_by(c.state))}
        throughput = [0] * THROUGHPUT_BUCKETS
        for index, n in connection.execute(sa.select(bucket, sa.func.count()).where(recent).group_by(bucket)):
            throughput[int(index)] = n
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
    return finished, throughput, failing


def test_the_dashboard_reads_what_plain_group_bys_read(store: MessageStore) -> None:
    """Two hours of mixed messages, one a second (1 % PARTLY_FAILED, 2 % FAILED over 20 routes, error codes
    alternating), a newer failure with its own code, and a backlog: the merged window reads give the figures, and
    each failing route its failing messages and the time and code of its latest failure, that one query per figure
    gives; a route whose latest failure is over a day old is not listed."""
    with store.engine.begin() as connection:
        fill(connection, 7200, MIXED, "d")
        fill(connection, 3, "NEW", "n", first=9000)
        connection.execute(sa.update(message_table).where(message_table.c.correlation_id == "d-7101")
                           .values(last_error_code="LATEST"))  # svc1/op1's newest failure (7101 % 100 == 1)
    store.counts.recount()
    for now in (START + timedelta(seconds=7150), START + timedelta(seconds=7150, hours=23)):
        board = dashboard(store, now)
        finished, throughput, failing = _plain(store, now)
        assert board.finished_last_hour == finished and board.throughput == throughput
        keys = ("FAILED", "PARTLY_FAILED", "last", "lastErrorCode")
        assert {(e["service"], e["operation"]): {k: e[k] for k in keys} for e in board.failing_routes} == failing
        assert [e["FAILED"] for e in board.failing_routes] == sorted((e["FAILED"] for e in board.failing_routes),
                                                                    reverse=True)
    assert sum(finished.values()) == 0 and failing  # 23 h later: nothing finished in the hour, failures in the day
    days_later = dashboard(store, START + timedelta(days=2))  # the failures are still there, none of the last 24 h
    assert days_later.failing_routes == [] and days_later.by_state[MessageState.FAILED] > 0
    board = dashboard(store, START + timedelta(seconds=7150))
    latest = [e["lastErrorCode"] for e in board.failing_routes if (e["service"], e["operation"]) == ("svc1", "op1")]
    assert latest == ["LATEST"]
    assert sum(board.throughput) == 3601 - 36  # the hour's messages but its 36 PARTLY_FAILED (not final)
    assert board.oldest_open is not None and board.oldest_open.correlation_id == "d-100"  # PARTLY_FAILED is open


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
