"""The console's message search: the admin API's filters and its search, one keyset page at a time."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import sqlalchemy as sa

from openroute.admin.api import search_conditions, search_filters
from openroute.admin.filters import InvalidQueryError, decode_cursor, parse_limit
from openroute.admin.search import SummaryPage, search_summaries
from openroute.persistence import MessageState, MessageStore, message_table

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
    does (:func:`~openroute.admin.search.search_summaries`: newest first, keyset pages, capped count, rows of the
    columns a list shows, which :func:`openroute.admin.api.summaries` turns into the API's items). Empty values are
    ignored (a blank form field). Raises :class:`InvalidQueryError` for an unknown or malformed parameter."""
    flat, states, cursor, raw_limit = _flatten(params)
    limit = parse_limit(raw_limit)
    filters = search_filters(flat, states)
    if cursor is not None:
        decode_cursor(cursor)  # a bad cursor is an error before any database work
    with store.engine.connect() as connection:  # rolled back at its end: the count's planner settings too
        return search_summaries(connection, filters, cursor, limit, keep_settings=True)


def _pairs(params: Mapping[str, Any]) -> list[tuple[str, str]]:
    pairs: list[tuple[str, str]] = []
    for key, value in params.items():
        for item in value if isinstance(value, list | tuple) else [value]:
            pairs.append((key, str(item)))
    return pairs
