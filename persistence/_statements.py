"""The texts of the hot path's statements (``_hot_path``, ``_call_path``) and the sizes they come in: written once
per shape, so that the driver's statement cache keeps them compiled."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from operator import itemgetter
from typing import Any, TypeVar

__all__ = [
    "SQLITE_MOST_ROWS",
    "TRANSITION_OPTIONAL",
    "TRANSITION_VALUES",
    "in_statement_sizes",
    "sqlite_inserted_keys",
    "statement_sizes",
    "transition_insert",
    "transition_values",
]

T = TypeVar("T")

# SQLite allows 32,766 parameters per statement: 26 columns x 256 rows stays well inside it
SQLITE_MOST_ROWS = 256


def statement_sizes(count: int) -> list[int]:
    """``count`` rows as chunks of powers of two (19 -> 16, 2, 1), at most :data:`SQLITE_MOST_ROWS` each.

    A multi-row statement's text depends on its number of rows, and SQLite compiles every new text again: for a
    16-row insert that cost three quarters of inserting the rows. With these sizes the texts repeat, so the
    driver's statement cache has them compiled.
    """
    sizes = []
    while count:
        size = min(1 << (count.bit_length() - 1), SQLITE_MOST_ROWS)
        sizes.append(size)
        count -= size
    return sizes


def in_statement_sizes(items: Sequence[T]) -> Iterator[Sequence[T]]:
    """``items`` cut into the chunks of :func:`statement_sizes`, in order."""
    first = 0
    for size in statement_sizes(len(items)):
        yield items[first:first + size]
        first += size


def transition_insert(mark: str, no_from: bool = False, no_node: bool = False, no_error: bool = False,
                       no_text: bool = False, no_trace: bool = False) -> str:
    """The ``message_transition`` INSERT, with NULL written for the values a group of rows lacks. The attempt is
    read from the message row as written (failed_count + 1, or + 0 for a counted failure): one primary-key
    lookup, no second source."""
    return ("INSERT INTO message_transition "  # noqa: S608  names are the schema's constants; values are bound parameters
            "(message_id, from_state, to_state, at, node_id, attempt, error_code, error_text, error_trace, cause) "
            f"VALUES ({mark}, {'NULL' if no_from else mark}, {mark}, {mark}, {'NULL' if no_node else mark}, "
            f"(SELECT failed_count + {mark} FROM message WHERE id = {mark}), {'NULL' if no_error else mark}, "
            f"{'NULL' if no_text else mark}, {'NULL' if no_trace else mark}, {mark})")


#: the values of a SQLite ``message_transition`` row (see :meth:`HotPath.record_transitions`) in parameter order, and
#: the positions of the optional ones (from state, node, error code, text, trace), which :func:`transition_insert`
#: writes as NULL when a group of rows lacks them
TRANSITION_OPTIONAL = (1, 4, 7, 8, 9)
TRANSITION_VALUES = 11


def transition_values(absent: tuple[bool, ...]) -> Callable[[Sequence[Any]], tuple[Any, ...]]:
    """The parameters of a row of values lacking ``absent``: every value but the absent optional ones."""
    skipped = {index for index, lacking in zip(TRANSITION_OPTIONAL, absent, strict=True) if lacking}
    kept = [index for index in range(TRANSITION_VALUES) if index not in skipped]
    return itemgetter(*kept)  # six indexes at least (the id twice, to state, time, attempt, cause): a tuple


def sqlite_inserted_keys(count: int) -> str:
    """The SELECT of the keys of ``count`` rows a SQLite INSERT stored, by id (see HotPath._sqlite_inserted)."""
    return f"SELECT id, source_system, correlation_id FROM message WHERE id IN ({', '.join(['?'] * count)})"  # noqa: S608  names are the schema's constants; values are bound parameters
