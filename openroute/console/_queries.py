"""The reads behind the console's dashboard and error catalogue (the message search is the admin API's)."""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa

from openroute import errors as core_errors
from openroute.engine.outcome import ErrorCode as EngineErrorCode
from openroute.persistence import FINAL_STATES, MessageState, message_table
from openroute.persistence.store import MessageStore

#: the dashboard's throughput window and its buckets
THROUGHPUT_WINDOW = timedelta(hours=1)
THROUGHPUT_BUCKETS = 12
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
    #: messages that reached a final state in the last hour, per state
    finished_last_hour: dict[MessageState, int]
    #: messages finished per bucket of the last hour, oldest bucket first
    throughput: list[int]
    oldest_open: OpenMessage | None
    #: routes with FAILED or PARTLY_FAILED messages changed in the last 24 hours, worst first
    failing_routes: list[dict[str, Any]] = field(default_factory=list)

    @property
    def total(self) -> int:
        return sum(self.by_state.values())

    @property
    def per_minute(self) -> float:
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

    Five statements in one read-only transaction (one snapshot) whatever the number of routes: the counts (two),
    the last hour's finished messages per state and bucket (one scan of the window), the oldest open message, and
    the failing routes with the error code of each one's latest failure (a subquery per route in the same
    statement; migration 0015's index). The statements are built once, with the times as parameters."""
    window = _window(now)
    with store.counts.snapshot() as connection:
        # the store's counts (persistence/counts.py), not GROUP BYs of the message table: exact, and their cost
        # follows the transitions since the last fold, not the store
        by_route = store.counts.by_route(connection)
        finished_rows = connection.execute(_FINISHED, window).all()
        oldest_row = connection.execute(_OLDEST).first()
        failing_rows = connection.execute(_FAILING, window).all()
    by_state: dict[MessageState, int] = {}
    for states in by_route.values():
        for state, count in states.items():
            by_state[state] = by_state.get(state, 0) + count
    finished: dict[MessageState, int] = {}
    throughput = [0] * THROUGHPUT_BUCKETS
    for state, index, count in finished_rows:
        finished[MessageState(state)] = finished.get(MessageState(state), 0) + int(count)
        throughput[int(index)] += int(count)
    oldest = None if oldest_row is None else OpenMessage(*oldest_row[:4], MessageState(oldest_row[4]), oldest_row[5])
    failing: dict[tuple[str, str], dict[str, Any]] = {}
    for service, operation, state, count, last, code in failing_rows:
        entry = failing.setdefault(
            (service, operation),
            {
                "service": service,
                "operation": operation,
                "FAILED": 0,
                "PARTLY_FAILED": 0,
                "last": last,
                "lastErrorCode": code,
            },
        )
        entry[str(state)] = int(count)
        entry["last"] = max(entry["last"], last)
    worst = sorted(failing.values(), key=lambda e: (-e["FAILED"], -e["PARTLY_FAILED"], e["service"]))
    return Dashboard(now, by_state, by_route, finished, throughput, oldest, worst)


def _window(now: datetime) -> dict[str, datetime]:
    """The parameters of :data:`_FINISHED` and :data:`_FAILING` for ``now``."""
    start = now - THROUGHPUT_WINDOW
    step = THROUGHPUT_WINDOW / THROUGHPUT_BUCKETS
    bounds = {f"bound{i}": start + step * (i + 1) for i in range(THROUGHPUT_BUCKETS - 1)}
    return {"start": start, "now": now, "since": now - FAILING_WINDOW, **bounds}


def _time(name: str) -> sa.BindParameter[datetime]:
    return sa.bindparam(name, type_=message_table.c.last_update_ts.type)


def _finished() -> sa.Select[Any]:
    c = message_table.c
    bucket = sa.case(
        *[(c.last_update_ts < _time(f"bound{i}"), i) for i in range(THROUGHPUT_BUCKETS - 1)],
        else_=THROUGHPUT_BUCKETS - 1,
    ).label("bucket")
    recent_final = sa.and_(
        c.state.in_(FINAL_STATES), c.last_update_ts >= _time("start"), c.last_update_ts <= _time("now")
    )
    return sa.select(c.state, bucket, sa.func.count()).where(recent_final).group_by(c.state, bucket)


def _failing() -> sa.Select[Any]:
    c = message_table.c
    failing = sa.bindparam(
        "failing",
        [MessageState.FAILED, MessageState.PARTLY_FAILED],
        expanding=True,
        literal_execute=True,
        type_=c.state.type,
    )
    other = message_table.alias("latest")
    latest_code = (
        sa.select(other.c.last_error_code)
        .where(other.c.service == c.service, other.c.operation == c.operation, other.c.state.in_(failing))
        .order_by(other.c.last_update_ts.desc(), other.c.id.desc())
        .limit(1)
        .scalar_subquery()
    )
    return (
        sa.select(c.service, c.operation, c.state, sa.func.count(), sa.func.max(c.last_update_ts), latest_code)
        .where(c.state.in_(failing), c.last_update_ts >= _time("since"))
        .group_by(c.service, c.operation, c.state)
    )


# built once: building them cost more CPU (about 1 ms a request) than executing them
_FINISHED = _finished()
_FAILING = _failing()
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


def finished_statement(now: datetime) -> sa.Select[Any]:
    """(state, bucket, messages) of the messages that reached a final state in the hour before ``now``, the hour
    cut in :data:`THROUGHPUT_BUCKETS` buckets, oldest first: one scan of the window's range of ``last_update_ts``."""
    return _FINISHED.params(_window(now))


def failing_statement(now: datetime) -> sa.Select[Any]:
    """(service, operation, state, messages, latest change, error code of the route's latest failure) of the
    FAILED and PARTLY_FAILED messages changed since ``now - FAILING_WINDOW``.

    The route's latest failure is a subquery per group, newest first in the partial index ``ix_message_failing_update``
    (migration 0015): a few index entries each, in the same statement. The states are written into the SQL, since a
    prepared statement's generic plan would not know that they select that index's rows."""
    return _FAILING.params(_window(now))


@dataclass(frozen=True)
class ErrorCode:
    """One entry of the error code catalogue."""

    code: str
    name: str
    meaning: str
    #: how many messages have it as their last error code
    messages: int = 0


#: what the codes the engine writes itself (:class:`~openroute.engine.outcome.ErrorCode`) mean
ENGINE_CODE_MEANINGS = {
    "CANCELLED": "an operator cancelled the message (console, admin API or CLI)",
    "CHILD_FAILED": "a child message of a split ended FAILED, so its parent did too",
    "DROPPED": "an interceptor dropped the message",
    "EXT_CALL_IN_PROGRESS": "another message of the same entity was making the same external call",
    "FUNNEL": "another message with the same funnel value was processing (or older, with guaranteed order)",
    "OBSOLETE": "a newer message of the same entity had already ended OK (SKIPPED)",
    "PROCESSING_ABANDONED": "the node processing the message died; repoll gave it back to the queue",
    "TECHNICAL_ERROR": "a step raised a TechnicalError without a code; retried per the route's retry policy",
    "VALIDATION_ERROR": "the message was invalid when processed (FAILED at once)",
}


def _error_classes() -> Iterator[type[BaseException]]:
    seen: set[type[BaseException]] = set()
    pending: list[type[BaseException]] = [core_errors.OpenrouteError]
    while pending:
        cls = pending.pop()
        if cls in seen:
            continue
        seen.add(cls)
        yield cls
        pending.extend(cls.__subclasses__())


def error_catalogue(store: MessageStore) -> list[ErrorCode]:
    """The error codes openroute defines (error classes with a ``code``, the engine's own codes) and every other
    code found as a message's current error (business error codes of the routes), with how many messages have it
    now (a message that ended OK has none: its earlier errors are in its transition history)."""
    import openroute.admin.api  # load the error classes the catalogue lists
    import openroute.inbound.errors  # noqa: F401

    c = message_table.c
    with store.engine.connect() as connection:
        seen = {code: int(count) for code, count in connection.execute(
            sa.select(c.last_error_code, sa.func.count()).where(c.last_error_code.is_not(None))
            .group_by(c.last_error_code)
        )}
    entries: dict[str, ErrorCode] = {}
    for cls in _error_classes():
        code = cls.__dict__.get("code")
        if isinstance(code, str) and code not in entries:
            doc = (inspect.getdoc(cls) or "").split("\n\n")[0].replace("\n", " ")
            entries[code] = ErrorCode(code, cls.__name__, doc, seen.get(code, 0))
    for code in [*(c.value for c in EngineErrorCode), "TECHNICAL_ERROR"]:
        meaning = ENGINE_CODE_MEANINGS.get(code, "written by the engine")
        entries.setdefault(code, ErrorCode(code, "engine", meaning, seen.get(code, 0)))
    for code, count in seen.items():
        entries.setdefault(code, ErrorCode(code, "route", "set by a route (business or technical error code)", count))
    return sorted(entries.values(), key=lambda e: e.code)
