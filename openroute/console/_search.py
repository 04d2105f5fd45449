"""The console's message search: the admin API's filters and its search, one keyset page at a time."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any, NamedTuple

import sqlalchemy as sa

from openroute.persistence import MessageState, MessageStore, message_table
from openroute.persistence.models import FUNNEL_WAIT_CODE
from openroute.queries.filters import InvalidQueryError, parse_limit, search_conditions, search_filters
from openroute.queries.search import SUMMARY_COLUMNS, SummaryPage, summary_page

#: the states a restart takes a message from
RESTARTABLE = (MessageState.FAILED.value, MessageState.CANCEL.value)
#: most messages one "restart all matching" takes
BULK_LIMIT = 100_000

#: the search form's text fields (name, label), in the order shown; ``state`` is a set of checkboxes
SEARCH_FIELDS = (
    ("service", "Service"),
    ("operation", "Operation"),
    ("source_system", "Source system"),
    ("correlation_id", "Correlation id"),
    ("object_id", "Object id"),
    ("process_id", "Process id"),
    ("entity_type", "Entity type"),
    ("received_from", "Received from"),
    ("received_to", "Received before"),
    ("error_code", "Error code(s)"),
    ("error_text", "Text in the error"),
    ("payload_text", "Text in the payload"),
)

class ListedMessage(NamedTuple):
    """One row of the console's list of messages, each cell as the page shows it.

    The template reads the cells as attributes: Jinja looks an attribute up with ``getattr`` first, which a dict
    answers only by raising (a third of the list's rendering time when the rows were the API's JSON items), and the
    times are formatted once here rather than written as ISO text and cut again by a filter."""

    id: int
    state: str
    route: str
    source_system: str
    correlation_id: str
    object_id: str
    failed_count: int
    last_error_code: str
    received: str
    updated: str
    #: when the message runs next, or what it waits for (:func:`next_attempt`)
    next_attempt: str


def short_time(value: datetime | str | None) -> str:
    """A stored time as the console shows it: ``2024-03-01 10:15:00.250`` (UTC, milliseconds; "" for none).
    Takes a ``datetime`` or the admin API's ISO text of one."""
    if not value:
        return ""
    if isinstance(value, str):
        try:
            moment = datetime.fromisoformat(value)
        except ValueError:  # not a time after all: shown as it is, rather than failing the page
            return value.replace("T", " ")[:23]
    else:
        moment = value
    return moment.isoformat(sep=" ", timespec="milliseconds")[:23]


def next_attempt(state: MessageState | str, due: datetime | str | None, parked_on: str | None,
                 last_error_code: str | None) -> str:
    """When a message runs next, as the console and ``openroute messages`` show it: its due time; for a message
    with none, what it waits for (an external system's breaker, its funnel, its children); "" for a message that
    waits for nothing (NEW is queued at once, PROCESSING runs, a final state never runs again on its own). Takes the
    stored values or the admin API's JSON of them (the state's name, ISO times)."""
    if due:
        return short_time(due)
    state = MessageState(state)
    if state is MessageState.POSTPONED and parked_on:
        return f"when the breaker of {parked_on} closes"
    if state is MessageState.POSTPONED and last_error_code == FUNNEL_WAIT_CODE:
        return "when its funnel is free"
    if state is MessageState.WAITING_FOR_CHILDREN:
        return "when its children end"
    return ""


_ID, _STATE, _SERVICE, _OPERATION, _SOURCE, _CORRELATION, _OBJECT, _FAILED, _CODE, _RECEIVED, _UPDATED, _NEXT, \
    _PARKED = (SUMMARY_COLUMNS.index(name) for name in (
        "id", "state", "service", "operation", "source_system", "correlation_id", "object_id", "failed_count",
        "last_error_code", "receive_ts", "last_update_ts", "next_attempt_at", "parked_on"))


def listed_messages(rows: Iterable[Sequence[Any]]) -> list[ListedMessage]:
    """The list's rows from search results (rows of :data:`~openroute.queries.search.SUMMARY_COLUMNS`)."""
    return [ListedMessage(row[_ID], row[_STATE].value, f"{row[_SERVICE]}/{row[_OPERATION]}", row[_SOURCE],
                          row[_CORRELATION], row[_OBJECT] or "", row[_FAILED], row[_CODE] or "",
                          short_time(row[_RECEIVED]), short_time(row[_UPDATED]),
                          next_attempt(row[_STATE], row[_NEXT], row[_PARKED], row[_CODE]))
            for row in rows]


def restartable_ids(store: MessageStore, params: Any) -> tuple[list[int], tuple[str, ...]]:
    """The ids (oldest first) of the messages matching the search ``params`` that a restart can take, and the
    states searched: the chosen FAILED / CANCEL states, FAILED when none is chosen (as ``openroute messages
    restart``). Raises :class:`InvalidQueryError` for bad parameters, a choice of states none of which can be
    restarted, or more than :data:`BULK_LIMIT` matches."""
    flat, states, _cursor, _limit = _flatten(params)
    if states:
        wanted = tuple(s for s in dict.fromkeys(s.upper() for s in states) if s in RESTARTABLE)
        if not wanted:
            raise InvalidQueryError(f"only {' and '.join(RESTARTABLE)} messages can be restarted; the search "
                                    f"asks for {', '.join(states)}")
    else:
        wanted = (MessageState.FAILED.value,)
    conditions = search_conditions(flat, list(wanted))
    c = message_table.c
    with store.engine.connect() as connection:
        ids = list(connection.execute(
            sa.select(c.id).where(*conditions).order_by(c.id).limit(BULK_LIMIT + 1)).scalars())
    if len(ids) > BULK_LIMIT:
        raise InvalidQueryError(f"more than {BULK_LIMIT} messages match: narrow the search")
    return [int(i) for i in ids], wanted


def _flatten(params: Any) -> tuple[dict[str, Any], list[str], str | None, str | None]:
    """(filters, states, cursor, limit) of search parameters; empty values are ignored (a blank form field)."""
    flat: dict[str, Any] = {}
    states: list[str] = []
    codes: list[str] = []
    items = params.multi_items() if hasattr(params, "multi_items") else _pairs(params)
    for key, value in items:
        if key == "state":
            states.append(value)
        elif key == "error_code":
            if value != "":
                codes.append(value)
        elif value != "":
            flat[key] = value
    if codes:
        flat["error_code"] = codes
    return flat, states, flat.pop("cursor", None), flat.pop("limit", None)


def search_page(store: MessageStore, params: Any) -> SummaryPage:
    """One page of messages for the query parameters ``params`` (a Starlette ``QueryParams`` or a mapping of
    strings / lists of strings): the admin API's filters, ``cursor`` and ``limit``, searched as the admin API
    does (:func:`~openroute.queries.search.summary_page`: newest first, keyset pages, capped count, rows of the
    columns a list shows, which :func:`openroute.queries.messages.summaries` turns into the API's items). Empty
    values are ignored (a blank form field). Raises :class:`InvalidQueryError` for an unknown or malformed parameter."""
    flat, states, cursor, raw_limit = _flatten(params)
    limit = parse_limit(raw_limit)
    return summary_page(store, search_filters(flat, states), cursor, limit)


def _pairs(params: Mapping[str, Any]) -> list[tuple[str, str]]:
    pairs: list[tuple[str, str]] = []
    for key, value in params.items():
        for item in value if isinstance(value, list | tuple) else [value]:
            pairs.append((key, str(item)))
    return pairs
