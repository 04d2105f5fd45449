"""The audit job on real Spark (local[2]) over SQLite and PostgreSQL stores generated to cover every statistic and,
with planted violations, every consistency check (the audit must find exactly the planted ids)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from openroute.persistence import MessageStore
from openroute.persistence.models import (
    confirmation_table,
    entity_call_table,
    external_call_table,
    message_table,
    message_transition_table,
    node_table,
)

from openroute.spark.audit import CHECKS, AuditError, audit, parse_duration
from openroute.spark.report import render_report

NOW = datetime(2026, 11, 20, 12, 0, tzinfo=UTC)
DAY1 = datetime(2026, 11, 19, 9, 0, tzinfo=UTC)
DAY2 = datetime(2026, 11, 20, 9, 0, tzinfo=UTC)
CRM = ("crm", "setCustomer")
BILL = ("billing", "createInvoice")


def ago(**delta: float) -> datetime:
    return NOW - timedelta(**delta)


@dataclass
class StoreBuilder:
    """Rows of a store, written in one go by :meth:`write`; every message gets the history it names."""

    messages: list[dict[str, Any]] = field(default_factory=list)
    transitions: list[dict[str, Any]] = field(default_factory=list)
    confirmations: list[dict[str, Any]] = field(default_factory=list)
    external_calls: list[dict[str, Any]] = field(default_factory=list)
    entity_calls: list[dict[str, Any]] = field(default_factory=list)
    nodes: list[dict[str, Any]] = field(default_factory=list)

    def message(
        self, id: int, route: tuple[str, str], path: list[tuple[Any, ...]], *, state: str | None = None,
        source: str = "crm-src", failed_count: int = 0, error: str | None = None,
        business: list[dict[str, str]] | None = None, parent: int | None = None, node: str | None = "n1",
        next_attempt_at: datetime | None = None, confirm: str | None = "SENT", entity: tuple[str, str] | None = None,
        chain: bool = True,
    ) -> None:
        """A message received at ``path[0]`` going through the states of ``path`` (``(state, at)``, or
        ``(state, at, error code)``, or ``(state, at, error code, cause)``); ``state`` overrides the last state
        stored on the row (a planted mismatch), ``confirm`` the confirmation status of a final top-level message
        (None: no row), ``chain=False`` breaks the from/to chain of its history."""
        received = path[0][1]
        final_state = state or path[-1][0]
        self.messages.append({
            "id": id, "correlation_id": f"c{id}", "source_system": source, "service": route[0],
            "operation": route[1], "object_id": entity[1] if entity else None,
            "entity_type": entity[0] if entity else None, "funnel_value": None, "payload": "{}",
            "content_type": "application/json", "headers": {}, "state": final_state, "failed_count": failed_count,
            "receive_ts": received, "msg_ts": received, "start_process_ts": received, "last_update_ts": path[-1][1],
            "next_attempt_at": next_attempt_at, "node_id": node, "custom_data": {},
            "business_errors": business or [], "last_error_code": error, "last_error_text": error,
            "parent_id": parent, "version": len(path),
        })
        previous = None
        for number, (to_state, at, *rest) in enumerate(path):
            from_state = previous if chain or number < 2 else "PARTLY_FAILED"
            code, cause = (rest + [None, "engine"][len(rest):])[:2]
            self.transitions.append({
                "message_id": id, "from_state": from_state, "to_state": to_state, "at": at, "node_id": node,
                "attempt": 1, "error_code": code, "cause": cause,
            })
            previous = to_state
        if confirm and parent is None and final_state in ("OK", "FAILED", "CANCEL"):
            self.confirm(id, final_state, confirm, path[-1][1], source=source)

    def confirm(self, message_id: int, outcome: str, status: str, at: datetime, *, source: str = "crm-src",
                attempts: int = 1, lag: timedelta = timedelta(seconds=4)) -> None:
        self.confirmations.append({
            "id": message_id, "message_id": message_id, "source_system": source, "outcome_state": outcome,
            "status": status, "attempts": attempts, "next_attempt_at": at if status == "PENDING" else None,
            "last_error": None, "created_at": at, "updated_at": at + lag,
            "sent_at": at + lag if status == "SENT" else None,
        })

    def write(self, url: str) -> None:
        store = MessageStore(url)
        store.create_schema()
        try:
            with store.begin() as connection:
                for table, rows in ((node_table, self.nodes), (message_table, self.messages),
                                    (message_transition_table, self.transitions),
                                    (confirmation_table, self.confirmations),
                                    (external_call_table, self.external_calls)):
                    if rows:
                        connection.execute(table.insert(), rows)
                if self.entity_calls:
                    # a copy of the table without its unique key, so a duplicate OK call can be planted
                    connection.execute(sa.text("CREATE TABLE entity_call_copy AS SELECT * FROM entity_call"))
                    connection.execute(sa.text("DROP TABLE entity_call"))
                    connection.execute(sa.text("ALTER TABLE entity_call_copy RENAME TO entity_call"))
                    connection.execute(entity_call_table.insert(), self.entity_calls)
        finally:
            store.dispose()

    def call(self, id: int, owner: int, entity: tuple[str, str], key: str = "push", status: str = "OK") -> None:
        self.entity_calls.append({
            "id": id, "entity_type": entity[0], "object_id": entity[1], "call_key": key, "status": status,
            "owner_message_id": owner, "attempts": 1, "result": None, "last_error": None,
            "created_at": NOW - timedelta(days=1), "updated_at": NOW - timedelta(days=1),
        })


def clean_store() -> StoreBuilder:
    """A store every check passes on, with known figures for every statistic."""
    b = StoreBuilder()
    b.nodes = [{"id": "n1", "host": "h", "pid": 1, "started_at": ago(days=3), "heartbeat_at": ago(seconds=30),
                "stopped_at": None}]
    s = timedelta(seconds=1)
    # crm, day 1: three OK in 10 s, 20 s, 30 s; one FAILED after 3 attempts with a business error
    for i, secs in enumerate((10, 20, 30), start=1):
        b.message(i, CRM, [("NEW", DAY1), ("PROCESSING", DAY1 + 2 * s), ("OK", DAY1 + secs * s)],
                  entity=("customer", f"C{i}"))
    b.message(4, CRM, [("NEW", DAY1), ("PROCESSING", DAY1 + s), ("PARTLY_FAILED", DAY1 + 5 * s, "E_TIMEOUT"),
                       ("PROCESSING", DAY1 + 65 * s), ("PARTLY_FAILED", DAY1 + 70 * s, "E_TIMEOUT"),
                       ("PROCESSING", DAY1 + 130 * s), ("FAILED", DAY1 + 140 * s, "E_TIMEOUT")],
              failed_count=2, error="E_TIMEOUT", business=[{"code": "B100", "text": "customer blocked"}])
    # crm, day 2: one funnel-postponed then OK (its row says it failed once: the audit counts its history), one
    # PROCESSING now on the live node
    b.message(5, CRM, [("NEW", DAY2), ("PROCESSING", DAY2 + s), ("POSTPONED", DAY2 + 2 * s, "FUNNEL"),
                       ("PROCESSING", DAY2 + 62 * s), ("OK", DAY2 + 100 * s)], failed_count=1, error="E_CONN")
    b.message(6, CRM, [("NEW", ago(minutes=2)), ("PROCESSING", ago(minutes=1))])
    # billing, day 2: parent OK with two OK children; a FAILED one whose confirmation failed
    b.message(10, BILL, [("NEW", DAY2), ("PROCESSING", DAY2 + s), ("WAITING_FOR_CHILDREN", DAY2 + 2 * s),
                         ("OK", DAY2 + 50 * s)], source="erp")
    for child in (11, 12):
        b.message(child, BILL, [("NEW", DAY2 + 2 * s), ("PROCESSING", DAY2 + 3 * s), ("OK", DAY2 + 40 * s)],
                  parent=10, source="erp")
    b.message(13, BILL, [("NEW", DAY2), ("PROCESSING", DAY2 + s), ("FAILED", DAY2 + 8 * s, "E_TIMEOUT")],
              source="erp", error="E_TIMEOUT", confirm="FAILED")
    # a parent still waiting for a child that is working now
    b.message(14, BILL, [("NEW", ago(minutes=3)), ("PROCESSING", ago(minutes=3)),
                         ("WAITING_FOR_CHILDREN", ago(minutes=2))], source="erp")
    b.message(15, BILL, [("NEW", ago(minutes=2)), ("PROCESSING", ago(minutes=1))], parent=14, source="erp")
    # a retry scheduled in the future is not stuck, however old
    b.message(16, BILL, [("NEW", DAY1), ("PROCESSING", DAY1 + s), ("PARTLY_FAILED", DAY1 + 2 * s, "E_CONN")],
              source="erp", failed_count=1, error="E_CONN", next_attempt_at=NOW + timedelta(minutes=5))
    # messages of a source system that gets no confirmations
    b.message(20, CRM, [("NEW", DAY2), ("PROCESSING", DAY2 + s), ("OK", DAY2 + 6 * s)], source="batch", confirm=None)
    b.external_calls = [
        {"id": 1, "message_id": 1, "call_key": "crm", "status": "OK", "attempts": 1, "result": None,
         "last_error": None, "created_at": DAY1, "updated_at": DAY1},
        {"id": 2, "message_id": 2, "call_key": "crm", "status": "OK", "attempts": 1, "result": None,
         "last_error": None, "created_at": DAY1, "updated_at": DAY1},
    ]
    b.call(1, 1, ("customer", "C1"))
    b.call(2, 2, ("customer", "C2"))
    return b


#: planted violations: check -> the message ids that break it
PLANTED: dict[str, list[int]] = {
    "stuck": [101],
    "dead_node_processing": [102, 103],
    "confirmation_missing": [104],
    "confirmation_overdue": [105, 106],
    "parent_final_child_open": [108],
    "children_final_parent_waiting": [109],
    "duplicate_ok_call": [112, 113],
    "history_mismatch": [114, 115, 116],
}


def planted_store() -> StoreBuilder:
    """The clean store plus one planted violation (or a few) of each check; nothing else breaks a check."""
    b = clean_store()
    b.nodes.append({"id": "n-dead", "host": "h", "pid": 2, "started_at": ago(days=1), "heartbeat_at": ago(hours=1),
                    "stopped_at": None})
    b.message(101, CRM, [("NEW", ago(hours=3))], node=None)
    b.message(102, CRM, [("NEW", ago(minutes=3)), ("PROCESSING", ago(minutes=2))], node="n-dead")
    b.message(103, CRM, [("NEW", ago(minutes=3)), ("PROCESSING", ago(minutes=2))], node="n-unknown")
    b.message(104, CRM, [("NEW", ago(hours=2)), ("PROCESSING", ago(hours=2)), ("OK", ago(hours=1))], confirm=None)
    b.message(105, CRM, [("NEW", ago(hours=2)), ("PROCESSING", ago(hours=2)), ("OK", ago(minutes=5))],
              confirm=None)
    b.confirm(105, "OK", "PENDING", ago(minutes=5), attempts=10)
    b.message(106, CRM, [("NEW", ago(hours=5)), ("PROCESSING", ago(hours=5)), ("OK", ago(hours=4))], confirm=None)
    b.confirm(106, "OK", "PENDING", ago(hours=4), attempts=2)
    b.message(107, BILL, [("NEW", ago(hours=1)), ("PROCESSING", ago(hours=1)), ("WAITING_FOR_CHILDREN", ago(hours=1)),
                          ("FAILED", ago(minutes=30))], source="erp")
    b.message(108, BILL, [("NEW", ago(hours=1)), ("PROCESSING", ago(hours=1)), ("PARTLY_FAILED", ago(minutes=50))],
              parent=107, source="erp", next_attempt_at=NOW + timedelta(minutes=10))
    b.message(109, BILL, [("NEW", ago(minutes=40)), ("PROCESSING", ago(minutes=40)),
                          ("WAITING_FOR_CHILDREN", ago(minutes=39))], source="erp")
    for child in (110, 111):
        b.message(child, BILL, [("NEW", ago(minutes=39)), ("PROCESSING", ago(minutes=39)), ("OK", ago(minutes=30))],
                  parent=109, source="erp")
    for owner in (112, 113):
        b.message(owner, CRM, [("NEW", DAY2), ("PROCESSING", DAY2), ("OK", DAY2 + timedelta(seconds=3))],
                  entity=("customer", "C9"))
        b.call(owner, owner, ("customer", "C9"))
    b.message(114, CRM, [("NEW", DAY2), ("PROCESSING", DAY2), ("FAILED", DAY2 + timedelta(seconds=3))], state="OK")
    b.message(115, CRM, [("NEW", DAY2), ("PROCESSING", DAY2), ("OK", DAY2 + timedelta(seconds=3))], chain=False)
    b.message(116, CRM, [("NEW", DAY2), ("PROCESSING", DAY2), ("OK", DAY2 + timedelta(seconds=3))])
    b.transitions = [t for t in b.transitions if t["message_id"] != 116]
    return b


def rows(result: Any, table: str, **match: Any) -> list[dict[str, Any]]:
    return [r for r in result.statistics[table] if all(r.get(k) == v for k, v in match.items())]


def one(result: Any, table: str, **match: Any) -> dict[str, Any]:
    found = rows(result, table, **match)
    assert len(found) == 1, f"{table} {match}: {found}"
    return found[0]


def test_statistics_of_a_clean_store(spark: Any, database_url: str, tmp_path: Path) -> None:
    clean_store().write(database_url)
    result = audit(spark, database_url, now=NOW, partitions=2)

    assert result.passed, [(c.name, c.ids) for c in result.checks if not c.passed]
    assert [c.name for c in result.checks] == list(CHECKS)
    assert result.totals["messages"] == 14
    assert result.totals["by_state"] == {"FAILED": 2, "OK": 8, "PARTLY_FAILED": 1, "PROCESSING": 2,
                                         "WAITING_FOR_CHILDREN": 1}
    d1, d2 = DAY1.date().isoformat(), DAY2.date().isoformat()
    assert one(result, "state_counts", service="crm", day=d1, state="OK")["count"] == 3
    assert one(result, "state_counts", service="crm", day=d1, state="FAILED")["count"] == 1
    assert one(result, "state_counts", service="billing", day=d2, state="OK")["count"] == 3
    # time to final state: exact values of this small store
    crm1 = one(result, "latency", service="crm", day=d1)
    assert (crm1["finished"], crm1["p50_s"], crm1["p95_s"], crm1["p99_s"], crm1["max_s"]) == (4, 20, 140, 140, 140)
    assert one(result, "throughput_hourly", service="crm", hour="2026-11-19 09:00")["finished"] == 4
    # time in each state, from the transitions: message 4 waited 60 s + 60 s in PARTLY_FAILED
    waiting = one(result, "time_in_state", service="crm", state="PARTLY_FAILED")
    assert (waiting["visits"], waiting["total_s"]) == (2, 120)
    assert one(result, "time_in_state", service="crm", state="POSTPONED")["total_s"] == 60
    # attempts from the transitions: message 4 ran 3 times; message 5's funnel hold was no attempt
    assert {(r["attempts"], r["count"]) for r in rows(result, "attempts", service="crm")} == {(1, 5), (3, 1)}
    # the codes met over the history (message 4 met E_TIMEOUT 3 times); the funnel's hold is no error
    assert [(r["code"], r["count"], r["messages"], r["current"]) for r in rows(result, "top_errors", service="crm")] \
        == [("E_TIMEOUT", 3, 1, 1)]
    assert {(r["code"], r["count"], r["messages"], r["current"]) for r in rows(result, "top_errors",
                                                                              service="billing")} == {
        ("E_TIMEOUT", 1, 1, 1), ("E_CONN", 1, 1, 1)}
    assert one(result, "business_errors", service="crm")["code"] == "B100"
    erp = one(result, "confirmations", source_system="erp")
    assert (erp["count"], erp["sent"], erp["failed"], erp["pending"]) == (2, 1, 1, 0)
    crm_conf = rows(result, "confirmations", source_system="crm-src")
    assert sum(r["sent"] for r in crm_conf) == 5 and all(r["lag_p50_s"] == 4 for r in crm_conf)
    funnel = one(result, "funnel_postpones", service="crm", day=d2)
    assert (funnel["postpones"], funnel["messages"]) == (1, 1)

    out = result.write(tmp_path / "out")
    summary = json.loads((out / "summary.json").read_text())
    assert summary["passed"] is True and set(summary["checks"]) == set(CHECKS)
    report = (out / "report.html").read_text()
    assert report.count("data:image/png;base64,") == 4 and "PASSED" in report
    latency = spark.read.parquet(str(out / "parquet" / "latency"))
    assert latency.count() == len(result.statistics["latency"])
    assert spark.read.parquet(str(out / "parquet" / "violations")).count() == 0


def test_a_restart_keeps_the_attempts_and_the_errors_of_the_history(spark: Any, sqlite_url: str) -> None:
    """Issue 42: a restart starts the failed count again (0 on the row), yet the audit counts the 3 attempts and the
    outage's HTTP_503 of message 1, which ended OK after its restart; a call the breaker refused (CIRCUIT_OPEN) is
    no attempt but an error met."""
    b = StoreBuilder()
    s = timedelta(seconds=1)
    b.message(1, CRM, [("NEW", DAY1), ("PROCESSING", DAY1 + s), ("PARTLY_FAILED", DAY1 + 2 * s, "HTTP_503"),
                       ("PROCESSING", DAY1 + 62 * s), ("POSTPONED", DAY1 + 63 * s, "CIRCUIT_OPEN"),
                       ("PROCESSING", DAY1 + 90 * s), ("FAILED", DAY1 + 91 * s, "HTTP_503"),
                       ("PARTLY_FAILED", DAY1 + 600 * s, None, "admin:ops"), ("PROCESSING", DAY1 + 601 * s),
                       ("OK", DAY1 + 602 * s)])
    b.message(2, CRM, [("NEW", DAY1), ("PROCESSING", DAY1 + s), ("OK", DAY1 + 2 * s)])
    b.write(sqlite_url)
    result = audit(spark, sqlite_url, now=NOW, partitions=1)
    assert {(r["attempts"], r["count"]) for r in rows(result, "attempts", service="crm")} == {(1, 1), (3, 1)}
    assert {(r["code"], r["count"], r["messages"], r["current"]) for r in rows(result, "top_errors")} == {
        ("HTTP_503", 2, 1, 0), ("CIRCUIT_OPEN", 1, 1, 0)}
    result.release()


def test_planted_violations_are_found_exactly(spark: Any, database_url: str) -> None:
    planted_store().write(database_url)
    result = audit(spark, database_url, now=NOW, partitions=3, id_cap=2)

    # id_cap keeps the lowest ids of each check, the count stays exact
    assert {c.name: c.ids for c in result.checks} == {k: v[:2] for k, v in PLANTED.items()}
    assert {c.name: c.count for c in result.checks} == {k: len(v) for k, v in PLANTED.items()}
    assert not result.passed
    violations = result.details["violations"].collect()
    assert sorted((r["check"], r["message_id"]) for r in violations) == sorted(
        (name, i) for name, ids in PLANTED.items() for i in ids)
    summary = result.summary()
    assert summary["checks"]["history_mismatch"]["ids"] == [114, 115]
    assert summary["checks"]["stuck"] == {"passed": False, "count": 1, "ids": [101],
                                          "description": CHECKS["stuck"]}
    report = render_report(summary)
    assert "FAILED" in report and "<td>history_mismatch</td>" in report
    result.release()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"stuck_after": "soon"}, "not a duration: 'soon'"),
        ({"grace": "0m"}, "not a duration: '0m'"),
        ({"heartbeat_timeout": timedelta(0)}, "a duration must be positive"),
        ({"partitions": 0}, "partitions must be an int >= 1, got 0"),
        ({"id_cap": True}, "id_cap must be an int >= 1, got True"),
        ({"now": datetime(2026, 1, 1)}, "now must be timezone-aware"),
        ({"include_archive": "/nonexistent/archive"}, "no archive folder at /nonexistent/archive"),
    ],
)
def test_bad_arguments_are_refused_before_reading(spark: Any, sqlite_url: str, kwargs: dict[str, Any],
                                                  message: str) -> None:
    with pytest.raises(AuditError, match=message.replace("(", r"\(")):
        audit(spark, sqlite_url, **kwargs)


def test_parse_duration() -> None:
    assert parse_duration("90s") == timedelta(seconds=90)
    assert parse_duration("2h") == timedelta(hours=2)
    assert parse_duration(" 7d ") == timedelta(days=7)
    assert parse_duration("1w") == timedelta(weeks=1)


def test_include_archive_reads_archived_messages_with_the_live_store(spark: Any, sqlite_url: str,
                                                                     tmp_path: Path) -> None:
    from openroute.spark.archive import archive

    clean_store().write(sqlite_url)
    moved = archive(spark, sqlite_url, keep="OK=1h,FAILED=1h", to=tmp_path / "archive", now=NOW, partitions=2)
    engine = sa.create_engine(sqlite_url)
    with engine.connect() as connection:
        live = connection.execute(sa.text("SELECT count(*) FROM message")).scalar()
    engine.dispose()
    assert moved.deleted > 0 and live == 14 - moved.deleted

    result = audit(spark, sqlite_url, now=NOW, partitions=2, include_archive=tmp_path / "archive")

    # the same figures as before archiving, and archived confirmations and transitions still match their messages
    assert result.passed, [(c.name, c.ids) for c in result.checks if not c.passed]
    assert result.totals["messages"] == 14
    assert result.totals["by_state"]["OK"] == 8
    crm1 = one(result, "latency", service="crm", day=DAY1.date().isoformat())
    assert (crm1["finished"], crm1["p50_s"], crm1["max_s"]) == (4, 20, 140)
    result.release()


def test_include_archive_without_a_finished_run_is_refused(spark: Any, sqlite_url: str, tmp_path: Path) -> None:
    clean_store().write(sqlite_url)
    (tmp_path / "empty").mkdir()
    with pytest.raises(AuditError, match=r"--include-archive .*empty: no finished archive run"):
        audit(spark, sqlite_url, include_archive=tmp_path / "empty")
