"""The columns' bind processors as the hot path (:mod:`openroute.persistence._hot_path`) runs them: each stores what
SQLAlchemy's own would store (tests/persistence/test_bind.py pins it), at a fraction of the calls: a SQLite
timestamp's text from caches, a JSON column's empty containers and small dicts of texts from caches, a state's text
from a table, and a column of one batch converted once when every row holds the same value.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from itertools import repeat
from operator import is_
from typing import Any

import sqlalchemy as sa
from openroute.persistence.column_types import UTCDateTime
from openroute.persistence.models import MessageState

Processor = Callable[[Any], Any]


def _processor(column: sa.Column[Any], dialect: sa.Dialect) -> Processor | None:
    processor: Processor | None = column.type.dialect_impl(dialect).bind_processor(dialect)
    if processor is None:
        return None
    if isinstance(column.type, UTCDateTime) and dialect.name == "sqlite":
        return _sqlite_timestamp
    if isinstance(column.type, sa.JSON):
        return _with_empty_containers(processor)
    if isinstance(column.type, sa.Enum) and column.type.enum_class is MessageState:
        return _StateTexts(processor).__getitem__
    return processor


def _converted(process: Processor, column: Sequence[Any]) -> Sequence[Any]:
    """The values of ``column`` (one a row) converted by ``process``; once for the batch when every row holds the
    same object, or an empty dict or list each (a new message's own empty headers, custom data and business
    errors: the same JSON text)."""
    first = column[0]
    if all(map(is_, column, repeat(first))) or (
        first.__class__ in _EMPTY_CONTAINERS and not any(column)
        and all(map(is_, map(type, column), repeat(first.__class__)))
    ):
        return (process(first),) * len(column)
    return tuple(map(process, column))


_EMPTY_CONTAINERS = (dict, list)


#: distinct small text-only dicts whose JSON a column's processor keeps (the inbound headers of an endpoint)
_SMALL_DICTS = 256


def _with_empty_containers(processor: Processor) -> Processor:
    """A JSON column's processor that answers an empty dict or list from a cache: most messages carry empty headers,
    custom data and business errors, and serialising them is most of the JSON work of the hot path. Where the
    processor writes text (SQLite), a small dict of texts (an inbound message's headers: ``{"endpoint": "soap",
    "soapVersion": "1.1"}``) is answered from a bounded cache keyed by its items in order: the same text."""
    empty_dict, empty_list = processor({}), processor([])
    known: dict[tuple[tuple[str, str], ...], Any] = {}

    def process(value: Any) -> Any:
        if not value:
            if value.__class__ is dict:
                return empty_dict
            if value.__class__ is list:
                return empty_list
        elif value.__class__ is dict and len(value) <= 4:
            key = tuple(value.items())
            if all(item.__class__ is str for pair in key for item in pair):
                found = known.get(key)
                if found is None:
                    found = processor(value)
                    if found.__class__ is str:  # PostgreSQL's driver gets a wrapper of the dict: it writes it later
                        if len(known) >= _SMALL_DICTS:
                            known.clear()
                        known[key] = found
                return found
        return processor(value)

    return process


#: the text of a second ("2024-06-01 14:05:03.") by its offset in seconds from the epoch
_seconds: dict[int, str] = {}
_SECONDS_KEPT = 4096
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
#: the three digits of each thousand of microseconds (the six always written are two of them)
_THREE_DIGITS = tuple(f"{number:03d}" for number in range(1000))


def _sqlite_timestamp(value: datetime | None) -> str | None:
    """:class:`UTCDateTime`'s bind processor on SQLite, as one function: the same text SQLAlchemy's DATETIME
    stores (naive UTC, microseconds always written), a third of the calls. tests/persistence/test_bind.py pins
    the equality.

    No cache of the texts by object: a message's timestamps are each converted once on the hot path (the texts of
    its row go on to its transition rows, :class:`~openroute.persistence._hot_path.HotPath`), and keeping them by
    id cost a third of a conversion on every call."""
    if value is None:
        return None
    if value.tzinfo is not UTC:
        if value.tzinfo is None:
            raise ValueError(f"naive datetime {value!r}: the store only takes timezone-aware timestamps")
        value = value.astimezone(UTC)
    # isoformat costs ~13,000 instructions a call (CPython's PyUnicode_FromFormat): a second's text is shared by every
    # timestamp of that second, found by the offset from the epoch (one subtraction and two reads: the five fields
    # of a minute cost twice that), and the microseconds are two texts of a table joined by one f-string
    since = value - _EPOCH
    second = since.days * 86_400 + since.seconds
    prefix = _seconds.get(second)
    if prefix is None:
        if len(_seconds) >= _SECONDS_KEPT:
            _seconds.clear()
        # "2024-06-01 14:05:03." (without "+00:00": naive UTC, as SQLAlchemy writes it; a year has four digits)
        prefix = _seconds[second] = value.isoformat(" ", "seconds")[:-6] + "."
    micro = since.microseconds
    return f"{prefix}{_THREE_DIGITS[micro // 1000]}{_THREE_DIGITS[micro % 1000]}"


class _StateTexts(dict[Any, Any]):
    """The stored text of each :class:`MessageState`, by member: its ``__getitem__`` is the state's bind processor.
    A member (or its value: a StrEnum member hashes and compares as its value, and SQLAlchemy stores either the same)
    is answered by the dict's own lookup, anything else by SQLAlchemy's processor (its LookupError for a name that
    is no state)."""

    __slots__ = ("_general",)

    def __init__(self, general: Processor) -> None:
        super().__init__((member, general(member)) for member in MessageState)
        self._general = general

    def __missing__(self, value: Any) -> Any:
        return self._general(value)
