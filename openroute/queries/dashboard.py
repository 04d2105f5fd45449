"""The reads behind the console's dashboard: counts per route and state, throughput, failing routes and their latest
failure, open messages, held-back systems (the message search is :mod:`openroute.queries.search`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import sqlalchemy as sa

from openroute.persistence import FINAL_STATES, MessageState, message_table
from openroute.persistence.breaker import BreakerStore, HeldBack
from openroute.persistence.store import MessageStore

#: the dashboard's throughput window (whole minutes: the current one and those before it) and its buckets
THROUGHPUT_WINDOW = timedelta(hours=1)
THROUGHPUT_BUCKETS = 12
_MINUTES = int(THROUGHPUT_WINDOW.total_seconds()) // 60
_BUCKET_MINUTES = _MINUTES // THROUGHPUT_BUCKETS
#: how far back the dashboard looks for failing routes
FAILING_WINDOW = timedelta(hours=24)

_NOT_FINAL = [s for s in MessageState if s not in FINAL_STATES]


@dataclass(frozen=True)
class OpenMessage:
    """The columns of a message the dashboard shows (its oldest message not final)."""

    id: int
    correlation_id: str
    service: str
    operation: str
    state: MessageState
    receive_ts: datetime


@dataclass
class Dashboard:
    """Everything the dashboard shows, read in one snapshot."""

    now: datetime
    by_state: dict[MessageState, int]
    #: (service, operation) -> state -> count
    by_route: dict[tuple[str, str], dict[MessageState, int]]
    #: transitions into a final state in the last hour (its minutes: the current one and the 59 before), per state;
    #: a message restarted after FAILED and then OK counts in both
    finished_last_hour: dict[MessageState, int]
    #: those transitions per bucket of the hour (5 minutes), oldest bucket first
    throughput: list[int]
    oldest_open: OpenMessage | None
    #: routes with FAILED or PARTLY_FAILED messages whose latest failure is less than :data:`FAILING_WINDOW` old,
    #: worst first: their messages in those states now, that latest failure's time (``last``) and error code
    failing_routes: list[dict[str, Any]] = field(default_factory=list)
    #: the external systems holding messages back (breaker not CLOSED, or messages parked on it), by name
    held_back: list[HeldBack] = field(default_factory=list)

    @property
    def total(self) -> int:
        """Every message in the store."""
        return sum(self.by_state.values())

    @property
    def per_minute(self) -> float:
        """Messages made final per minute over the last hour."""
        return sum(self.finished_last_hour.values()) / (THROUGHPUT_WINDOW.total_seconds() / 60)

    def route_rows(self) -> list[tuple[str, str, list[tuple[str, int]]]]:
        """(service, operation, [(state, count) of every state in order, 0 when none]) per route: the page's table
        with its lookups done here (a third of the page's rendering time when the template did them)."""
        return [
            (service, operation, [(state.value, counts.get(state, 0)) for state in MessageState])
            for (service, operation), counts in self.by_route.items()
        ]


def dashboard(store: MessageStore, now: datetime) -> Dashboard:
    """Counts per state and route (exact, from the store's counts), the last hour's throughput, the oldest open
    message and failing routes; every read is bounded by an index range (no scan of the message table).

    One read-only transaction (one snapshot): the counts' mark, the counts, the last hour's finished messages per
    minute and state (kept by the store as the counts are: migration 0017), the oldest open message, and the
    latest failure of each route the counts show failing (one index entry each: migration 0016's index; one
    statement on PostgreSQL, one per failing route on SQLite). No read grows with the store, the traffic or the
    failures: the throughput read every message finished in the hour (360,000 rows at 100 messages/s), and the
    failing routes every message failed in the day, when an outage is when operators look. The failing routes'
    figures are the counts' (their messages FAILED and PARTLY_FAILED now). The statements are built once."""
    first_minute = now.astimezone(UTC).replace(second=0, microsecond=0) - timedelta(minutes=_MINUTES - 1)
    with store.counts.snapshot() as connection:
        # the store's counts (persistence/counts.py), not GROUP BYs of the message table: exact, and their cost
        # follows the transitions since the last fold, not the store
        mark = store.counts.read_mark(connection)  # once: the snapshot's mark is the same for both reads
        by_route = store.counts.by_route(connection, mark=mark)
        by_minute = store.counts.finished_by_minute(connection, first_minute, mark=mark)
        oldest_row = connection.execute(_OLDEST).first()
        latest = _latest_failures(connection, [route for route, states in by_route.items() if _failing(states)])
        held_back = BreakerStore(store).holding_back(connection)
    by_state: dict[MessageState, int] = {}
    for states in by_route.values():
        for state, count in states.items():
            by_state[state] = by_state.get(state, 0) + count
    finished: dict[MessageState, int] = {}
    throughput = [0] * THROUGHPUT_BUCKETS
    for (minute, state), count in by_minute.items():
        finished[state] = finished.get(state, 0) + count
        bucket = int((minute - first_minute).total_seconds()) // 60 // _BUCKET_MINUTES
        throughput[min(bucket, THROUGHPUT_BUCKETS - 1)] += count  # a node's clock ahead: in the newest bucket
    oldest = None if oldest_row is None else OpenMessage(*oldest_row[:4], MessageState(oldest_row[4]), oldest_row[5])
    since = now - FAILING_WINDOW
    failing: list[dict[str, Any]] = [
        {
            "service": service,
            "operation": operation,
            "FAILED": by_route[service, operation].get(MessageState.FAILED, 0),
            "PARTLY_FAILED": by_route[service, operation].get(MessageState.PARTLY_FAILED, 0),
            "last": last,
            "lastErrorCode": code,
        }
        for (service, operation), (last, code) in latest.items()
        if last >= since
    ]
    worst = sorted(failing, key=lambda e: (-e["FAILED"], -e["PARTLY_FAILED"], e["service"], e["operation"]))
    return Dashboard(now, by_state, by_route, finished, throughput, oldest, worst, held_back)


#: the failing states, written into the SQL (``literal_execute``): a partial index is used only for a query whose
#: states the planner can compare with the index's (a prepared statement's generic plan, and SQLite, cannot)
_FAILING_STATES = sa.bindparam(
    "failing",
    [MessageState.FAILED, MessageState.PARTLY_FAILED],
    expanding=True,
    literal_execute=True,
    type_=message_table.c.state.type,
)


#: the route as ``ix_message_failing_route`` keys it (migration 0016): ``service || ''``, ``operation || ''``, the
#: empty text written into the SQL so that the expressions are the index's
_ROUTE_KEY = tuple(column.op("||")(sa.literal_column("''")) for column in (message_table.c.service,
                                                                        message_table.c.operation))


def _latest_failure(service: Any, operation: Any) -> sa.Select[Any]:
    """(last change, error code) of the newest FAILED or PARTLY_FAILED message of the route ``service``,
    ``operation`` (columns or parameters): the first entry of the route in ``ix_message_failing_route``, whose
    key is the route as expressions (see migration 0016: the columns drew searches by route and state to it)."""
    c = message_table.c
    return (
        sa.select(c.last_update_ts, c.last_error_code)
        .where(_ROUTE_KEY[0] == service, _ROUTE_KEY[1] == operation, c.state.in_(_FAILING_STATES))
        .order_by(c.last_update_ts.desc(), c.id.desc())
        .limit(1)
    )


def _latest_failures_postgresql() -> sa.Select[Any]:
    """(service, operation, last change, error code) of each route of the arrays ``services`` and ``operations``
    that has a failing message: one statement, a LATERAL lookup per route."""
    names = sa.dialects.postgresql.ARRAY(sa.String)
    routes = (
        sa.func.unnest(sa.bindparam("services", type_=names), sa.bindparam("operations", type_=names))
        .table_valued("service", "operation")
        .render_derived(name="routes")
    )
    latest = _latest_failure(routes.c.service, routes.c.operation).lateral("latest")
    columns = (routes.c.service, routes.c.operation, latest.c.last_update_ts, latest.c.last_error_code)
    return sa.select(*columns).select_from(routes.join(latest, sa.true()))


def _failing(states: dict[MessageState, int]) -> bool:
    return bool(states.get(MessageState.FAILED) or states.get(MessageState.PARTLY_FAILED))


def _latest_failures(
    connection: sa.Connection, routes: list[tuple[str, str]]
) -> dict[tuple[str, str], tuple[datetime, str | None]]:
    """(service, operation) -> (last change, error code) of the newest failing message of each of ``routes``
    (routes without one left out)."""
    if not routes:
        return {}
    if connection.dialect.name == "postgresql":
        rows = connection.execute(
            _LATEST_POSTGRESQL, {"services": [s for s, _ in routes], "operations": [o for _, o in routes]}
        )
        return {(service, operation): (last, code) for service, operation, last, code in rows}
    found: dict[tuple[str, str], tuple[datetime, str | None]] = {}
    for service, operation in routes:  # SQLite is in the process: a statement per route costs no round trip
        row = connection.execute(_LATEST_ONE, {"service": service, "operation": operation}).first()
        if row is not None:
            found[service, operation] = (row[0], row[1])
    return found


# built once: building them cost more CPU (about 1 ms a request) than executing them
_LATEST_POSTGRESQL = _latest_failures_postgresql()
_LATEST_ONE = _latest_failure(sa.bindparam("service", type_=sa.String), sa.bindparam("operation", type_=sa.String))
_OLDEST = (
    sa.select(
        message_table.c.id,
        message_table.c.correlation_id,
        message_table.c.service,
        message_table.c.operation,
        message_table.c.state,
        message_table.c.receive_ts,
    )
    .where(message_table.c.state.in_(_NOT_FINAL))
    .order_by(message_table.c.receive_ts, message_table.c.id)
    .limit(1)
)


def latest_failures_statement(routes: list[tuple[str, str]]) -> sa.Select[Any]:
    """PostgreSQL: (service, operation, last change, error code) of the newest failing message of each of
    ``routes`` (what the dashboard reads for the routes its counts show failing), for ``EXPLAIN``."""
    return _LATEST_POSTGRESQL.params(services=[s for s, _ in routes], operations=[o for _, o in routes])
