"""What an admin search asks for: its filters (:class:`SearchFilters`, read from query parameters by
:func:`parse_filters`), its limits, its page (:class:`Page`) and the opaque cursor of the next page.

:mod:`openroute.queries.search` turns them into statements; the admin API, the console and ``openroute messages``
parse their parameters here.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa

from openroute.definitions.clock import aware_datetime
from openroute.definitions.errors import ValidationError
from openroute.persistence import MessageState, StoredMessage, message_table
from openroute.persistence.models import message_payload_pending_table, message_payload_text_table

if TYPE_CHECKING:
    from starlette.requests import Request

#: matches counted exactly; above this the planner's estimate is returned (``total_estimated``)
COUNT_CAP = 1000
MAX_LIMIT = 500
DEFAULT_LIMIT = 50

#: the text filters, by the column they compare (equality)
TEXT_FILTERS = ("service", "operation", "source_system", "correlation_id", "object_id", "process_id", "entity_type")
#: what went wrong: ``error_code`` (exact; repeated or comma-separated for a list), ``error_text`` and
#: ``payload_text`` (text anywhere inside, case-insensitive; ``%`` and ``_`` are plain characters)
ERROR_FILTERS = ("error_code", "error_text", "payload_text")
#: every filter parameter of the search (paging parameters apart)
SEARCH_PARAMS = (*TEXT_FILTERS, "state", "received_from", "received_to", *ERROR_FILTERS)
#: most error codes in one search
MAX_ERROR_CODES = 50


def like_pattern(text: str) -> str:
    """``text`` as a LIKE pattern matching it anywhere, its wildcards (``%``, ``_``) and the escape (``\\``)
    escaped: the user's text is matched as written."""
    escaped = text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return f"%{escaped}%"


class InvalidQueryError(ValidationError):
    """A search parameter is unknown or malformed, or a cursor is not one this search issued (HTTP 400)."""

    code = "INVALID_QUERY"


@dataclass(frozen=True)
class SearchFilters:
    """What to search for; every given filter must match (AND). Build it with :func:`parse_filters`."""

    states: tuple[MessageState, ...] = ()
    text: Mapping[str, str] = field(default_factory=dict)
    #: inclusive lower bound of the receive time
    received_from: datetime | None = None
    #: exclusive upper bound of the receive time
    received_to: datetime | None = None
    #: the current error code is one of these
    error_codes: tuple[str, ...] = ()
    #: text inside the current error text (case-insensitive)
    error_text: str | None = None
    #: text inside the payload (case-insensitive)
    payload_text: str | None = None
    #: set by the search on PostgreSQL (:func:`narrowed`): words of ``payload_text`` that the trigram index is asked
    #: for instead of the whole text, which is then checked on the rows the index finds (the same matches)
    index_words: tuple[str, ...] = ()
    #: set by the search on PostgreSQL (:func:`narrowed`): ``payload_text`` is looked up in the payload index
    #: (:meth:`payload_matches`) instead of read in each candidate's payload
    payload_index: bool = False

    def conditions(self) -> list[sa.ColumnElement[bool]]:
        """The SQL conditions on the message table.

        The text searches are ``ILIKE '%text%'``: on PostgreSQL trigram indexes answer them (texts of 3 characters
        or more; the error text's on ``message``, migration 0009, the payload's on ``message_payload_text``,
        migration 0018, see :meth:`payload_matches`); SQLite scans the rows the other filters leave
        (docs/console.md)."""
        c = message_table.c
        conditions: list[sa.ColumnElement[bool]] = []
        if len(self.error_codes) == 1:
            conditions.append(c.last_error_code == self.error_codes[0])
        elif self.error_codes:
            conditions.append(c.last_error_code.in_(self.error_codes))
        if self.payload_index and self.payload_text is not None:
            conditions.extend(replace(self, payload_text=None).text_conditions(c))
            conditions.append(c.id.in_(self.payload_matches()))
        else:
            conditions.extend(self.text_conditions(c))
        if len(self.states) == 1:
            conditions.append(c.state == self.states[0])
        elif self.states:
            conditions.append(c.state.in_(self.states))
        conditions.extend(c[name] == value for name, value in self.text.items())
        if self.received_from is not None:
            conditions.append(c.receive_ts >= self.received_from)
        if self.received_to is not None:
            conditions.append(c.receive_ts < self.received_to)
        return conditions

    def text_conditions(self, c: sa.ColumnCollection[str, Any]) -> list[sa.ColumnElement[bool]]:
        """The ``error_text`` and ``payload_text`` conditions on the columns ``c`` (the table's or a subquery's),
        each text read in the row itself."""
        conditions: list[sa.ColumnElement[bool]] = []
        if self.error_text is not None:
            conditions.append(c.last_error_text.ilike(like_pattern(self.error_text), escape="\\"))
        if self.payload_text is not None:
            conditions.append(c.payload.ilike(like_pattern(self.payload_text), escape="\\"))
        return conditions

    def payload_matches(self) -> sa.CompoundSelect[tuple[int]]:
        """The ids of the messages whose payload holds ``payload_text`` (PostgreSQL, migration 0018): those whose
        copy in ``message_payload_text`` holds it (its trigram index asked for the text, or for the
        :attr:`index_words` only, the whole text then compared as ``payload || ''`` on the copies found, so that the
        index is not asked for it), and those still pending whose payload holds it (:meth:`pending_matches`)."""
        pattern = like_pattern(self.payload_text or "")
        copy = message_payload_text_table.c
        if self.index_words:
            looked_up = [copy.payload.ilike(like_pattern(word), escape="\\") for word in self.index_words]
            looked_up.append(copy.payload.op("||")(sa.literal("")).ilike(pattern, escape="\\"))
        else:
            looked_up = [copy.payload.ilike(pattern, escape="\\")]
        return sa.union_all(sa.select(copy.message_id).where(*looked_up), self.pending_matches(pattern))

    @staticmethod
    def pending_matches(pattern: str) -> sa.Select[tuple[int]]:
        """The ids of the messages still pending (stored since the last move of
        :mod:`openroute.persistence.payload_index`) whose payload matches the LIKE ``pattern``, read from the pending
        table whatever its statistics say.

        Each pending id's payload is read by primary key (a subquery per pending row), and the ids found are handed
        on as one array (computed once), which the planner counts as a few rows. Joined as a table instead, the
        pending table is planned from its statistics: after a bulk load whose payloads were all moved it holds
        only dead rows, never analyzed, planned as a million live ones, and the search read all of ``message``
        (31,000 buffers at 1M, 690-850 ms) to test them (docs/performance.md)."""
        pending = message_payload_pending_table.c
        stored = message_table.alias("pending_message")
        payload = sa.select(stored.c.payload).where(stored.c.id == pending.message_id).scalar_subquery()
        waiting = sa.select(pending.message_id).where(payload.ilike(pattern, escape="\\"))
        found = sa.func.unnest(sa.func.array(waiting.scalar_subquery())).table_valued("message_id")
        return sa.select(found.render_derived(name="pending_match").c.message_id)

    def without_text(self) -> SearchFilters:
        """These filters without ``error_text`` and ``payload_text``."""
        return replace(self, error_text=None, payload_text=None, index_words=(), payload_index=False)

    @property
    def has_text(self) -> bool:
        """Whether the search asks for an error text or a payload text."""
        return self.error_text is not None or self.payload_text is not None


@dataclass(frozen=True)
class Page:
    """One page of search results, newest first."""

    items: list[StoredMessage]
    #: pass it back as ``cursor`` for the next page; None on the last page
    next_cursor: str | None
    #: how many messages match (exact when ``total_estimated`` is False)
    total: int
    total_estimated: bool


def _parse_int(raw: str, low: int, high: int | None, not_int: str, out_of_range: str) -> int:
    """``raw`` (a URL or form value) as an integer in ``low..high`` (no upper bound when ``high`` is None); else
    :class:`InvalidQueryError` (answered 400): ``"<not_int>, got 'raw'"`` or ``"<out_of_range>, got N"``."""
    try:
        value = int(raw)
    except ValueError:
        raise InvalidQueryError(f"{not_int}, got {raw[:40]!r}") from None
    if value < low or (high is not None and value > high):
        raise InvalidQueryError(f"{out_of_range}, got {value}")
    return value


def parse_limit(raw: str | None, name: str = "limit") -> int:
    """A page size from a URL or form value named ``name``: :data:`DEFAULT_LIMIT` when absent, else 1..:data:`MAX_LIMIT`
    (:class:`InvalidQueryError` otherwise)."""
    if raw is None:
        return DEFAULT_LIMIT
    return _parse_int(raw, 1, MAX_LIMIT, f"{name} must be an integer", f"{name} must be in 1..{MAX_LIMIT}")


#: the largest message id: a BIGINT of PostgreSQL, an INTEGER of SQLite (a larger one is a 400, never a driver error)
MAX_MESSAGE_ID = 2**63 - 1


def parse_message_id(raw: str) -> int:
    """A message id from a URL or form value; :class:`InvalidQueryError` (answered 400) unless an integer in
    1..:data:`MAX_MESSAGE_ID`."""
    return _parse_int(raw, 1, MAX_MESSAGE_ID, "a message id is an integer",
                      f"a message id is in 1..{MAX_MESSAGE_ID}")


def _parse_time(name: str, value: str) -> datetime:
    parsed = aware_datetime(
        value, InvalidQueryError,
        not_iso=f"{name} must be an ISO 8601 date-time, got {value[:60]!r}",
        no_zone=f"{name} needs a time zone (e.g. 2024-03-01T12:00:00+00:00), got {value[:60]!r}",
    )
    if not _storable(parsed):
        raise InvalidQueryError(f"{name} is out of range in UTC, got {value[:60]!r}")
    return parsed


def _storable(moment: datetime) -> bool:
    """Whether ``moment`` has a UTC form (the store compares UTC times): 0001-01-01T00:00+05:00 has none."""
    try:
        moment.astimezone(UTC)
    except OverflowError:
        return False
    return True


def parse_filters(params: Mapping[str, Any]) -> SearchFilters:
    """:class:`SearchFilters` from request parameters (strings; ``state`` may be a list of strings).

    Known names: ``state``, the :data:`TEXT_FILTERS`, ``received_from`` and ``received_to`` (ISO 8601 with a
    time zone), and the :data:`ERROR_FILTERS`: ``error_code`` (a string, comma-separated codes, or a list),
    ``error_text`` and ``payload_text``. Raises :class:`InvalidQueryError` for an unknown state, an empty or
    over-long text value, too many error codes, a time without a zone or a window that ends before it starts.
    """
    raw_states = params.get("state") or []
    if isinstance(raw_states, str):
        raw_states = [raw_states]
    try:
        wanted = tuple(dict.fromkeys(MessageState(s.upper()) for s in raw_states))
    except ValueError:
        raise InvalidQueryError(
            f"unknown state in {list(raw_states)}; states are {[s.value for s in MessageState]}"
        ) from None
    text: dict[str, str] = {}
    for name in TEXT_FILTERS:
        value = params.get(name)
        if value is not None:
            if not value or len(value) > 255:
                raise InvalidQueryError(f"{name} must be 1-255 characters, got {len(value)}")
            text[name] = value
    raw_codes = params.get("error_code") or []
    if isinstance(raw_codes, str):
        raw_codes = [raw_codes]
    codes = tuple(dict.fromkeys(code.strip() for raw in raw_codes for code in raw.split(",") if code.strip()))
    if len(codes) > MAX_ERROR_CODES or any(len(code) > 100 for code in codes):
        raise InvalidQueryError(f"error_code takes at most {MAX_ERROR_CODES} codes of at most 100 characters")
    found: dict[str, str | None] = {}
    for name in ("error_text", "payload_text"):
        value = params.get(name)
        if value is not None and (not value or len(value) > 255):
            raise InvalidQueryError(f"{name} must be 1-255 characters, got {len(value)}")
        found[name] = value
    start, end = params.get("received_from"), params.get("received_to")
    start_ts = _parse_time("received_from", start) if start is not None else None
    end_ts = _parse_time("received_to", end) if end is not None else None
    if start_ts is not None and end_ts is not None and end_ts < start_ts:
        raise InvalidQueryError(f"received_to ({end}) is before received_from ({start})")
    return SearchFilters(wanted, text, start_ts, end_ts, codes, found["error_text"], found["payload_text"])


def encode_cursor(message: StoredMessage) -> str:
    """The opaque cursor of the page that continues after ``message``."""
    return cursor_after(message.receive_ts, message.id)


def cursor_after(receive_ts: datetime, message_id: int) -> str:
    """The opaque cursor of the page that continues after the message ``message_id`` received at ``receive_ts``."""
    raw = json.dumps([receive_ts.isoformat(), message_id], separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[datetime, int]:
    """(receive time, id) of a cursor made by :func:`encode_cursor`; InvalidQueryError for anything else."""
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        stamp, message_id = json.loads(raw)
        at = datetime.fromisoformat(stamp)
        if at.tzinfo is None or not isinstance(message_id, int) or isinstance(message_id, bool):
            raise ValueError
        if not (-MAX_MESSAGE_ID <= message_id <= MAX_MESSAGE_ID and _storable(at)):  # a BIGINT, a UTC time
            raise ValueError
    except (ValueError, TypeError, binascii.Error, UnicodeDecodeError):
        raise InvalidQueryError(f"cursor {cursor[:60]!r} is not one this search returned") from None
    return at, message_id


# page_size is the old name of limit, still accepted
_KNOWN_PARAMS = frozenset({*SEARCH_PARAMS, "cursor", "limit", "page_size"})


def check_params(names: Iterable[str]) -> None:
    """InvalidQueryError when ``names`` holds a parameter the admin search does not know (``page`` with a hint)."""
    unknown = set(names) - _KNOWN_PARAMS
    if "page" in unknown:
        raise InvalidQueryError("page is not supported any more: follow nextCursor with cursor= (keyset pages)")
    if unknown:
        raise InvalidQueryError(f"unknown search parameters {sorted(unknown)}; known: {sorted(_KNOWN_PARAMS)}")


def search_filters(params: Mapping[str, Any], states_: list[str]) -> SearchFilters:
    """The filters of the admin search parameters ``params`` (paging ones allowed) and the states ``states_``;
    InvalidQueryError for an unknown or malformed parameter."""
    check_params(params)
    return parse_filters({**params, "state": states_})


def search_conditions(params: Mapping[str, Any], states_: list[str]) -> list[sa.ColumnElement[bool]]:
    """SQL conditions on the message table for the admin search parameters (InvalidQueryError if bad).

    Prefer :func:`openroute.queries.search.search_messages`, which also pages and counts.
    """
    return search_filters(params, states_).conditions()


def check_no_nul(request: Request) -> None:
    """Raises InvalidQueryError (HTTP 400) when a query parameter or path part holds a NUL character, which no
    database column stores (PostgreSQL refuses it with an error, SQLite cuts the text there)."""
    for name, value in request.query_params.multi_items():
        if "\x00" in name or "\x00" in value:
            raise InvalidQueryError(f"query parameter {name[:40]!r} holds a NUL character (%00)")
    for name, value in request.path_params.items():
        if isinstance(value, str) and "\x00" in value:
            raise InvalidQueryError(f"{name} holds a NUL character (%00)")
