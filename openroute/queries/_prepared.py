"""Search statements built once per shape, executed with each search's values as parameters.

Building a search's statement and its cache key cost more of the server's CPU than executing it: at 1M messages the
first statement of an error text search (:func:`~openroute.queries.search.probe_page_count_statement`) took 1.4 ms to
build and 0.7 ms to key, against 1.0 ms to execute and read (docs/performance.md). What decides a statement's SQL is
its *shape*: which filters are given, how many error codes and words, the states (few, so their values are part of
the shape), whether a cursor is given, and the builder's own arguments (page size, columns). The first search of a
shape builds its statement from stand-in values, each of which becomes a named parameter; later searches of that
shape execute the same statement object (SQLAlchemy memoizes its cache key, and its compiled cache keeps the SQL)
with their own values::

    statement, values = prepared("page", lambda search: page_statement(search.filters, search.cursor, 50),
                                 Search(filters, cursor), 50)
    rows = connection.execute(statement, values).all()

A builder must put each value of the search into the statement as a bound value (``column == value``, ``ilike``,
``in_``, ``literal``), never decide in Python by a value (only by what the shape holds: counts, presence, states);
a stand-in left in the statement otherwise makes the search build its statement as before (:func:`prepared`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any, cast

import sqlalchemy as sa
from sqlalchemy.sql import visitors
from sqlalchemy.sql.elements import BindParameter

from openroute.queries.filters import SearchFilters, cursor_after, decode_cursor, like_pattern

#: how many shapes are kept (the first built leaves first): the benchmark's 58 searches have 101 statements, which
#: hold 3.7 MB beside SQLAlchemy's compiled cache (~37 kB each, tracemalloc)
MAX_SHAPES = 256

#: stand-in texts are marked with NUL and stand-in times and ids are out of any range the builders write themselves
#: (limits, caps, literals), so that a bound value of a built statement is a stand-in exactly when it is one of these;
#: only the stand-ins of the shape being built are looked up, and none of them reaches the database
_MARK = "\x00"
_TIME_BASE = datetime(1901, 1, 1, tzinfo=UTC)
_ID_BASE = -(10**15)
#: what a stand-in looks like written into SQL text
_TRACES = (_MARK, _TIME_BASE.date().isoformat(), str(_ID_BASE)[:-3])


@dataclass(frozen=True)
class Search:
    """The values of one search that its statements are built from: the filters, the cursor of the page, and the
    words of its payload text that a word sample counts (:func:`~openroute.queries.search.sample_statement`)."""

    filters: SearchFilters
    cursor: str | None = None
    words: tuple[str, ...] = ()


Extract = Callable[[Search], Any]


class _StandIns:
    """Stand-in values of one shape and how to find the real value of each in a search."""

    def __init__(self) -> None:
        self.extracts: dict[Hashable, Extract] = {}

    def text(self, extract: Extract, pattern: bool = False) -> str:
        """A stand-in text; with ``pattern`` its LIKE pattern stands for the search value's pattern too."""
        value = f"{_MARK}{len(self.extracts)}{_MARK}"
        self.extracts[value] = extract
        if pattern:
            self.extracts[like_pattern(value)] = lambda search: like_pattern(extract(search))
        return value

    def time(self, extract: Extract) -> datetime:
        value = _TIME_BASE + timedelta(microseconds=len(self.extracts))
        self.extracts[value] = extract
        return value

    def ident(self, extract: Extract) -> int:
        value = _ID_BASE - len(self.extracts)
        self.extracts[value] = extract
        return value

    def search(self, search: Search) -> Search:
        """A search of the same shape as ``search``, every value a stand-in."""
        f = search.filters
        codes = tuple(self.text(_code(i)) for i in range(len(f.error_codes)))
        if len(codes) > 1:  # one IN list or one array of them
            self.extracts[codes] = lambda s: list(s.filters.error_codes)
        text = {name: self.text(_text(name)) for name in f.text}
        filters = replace(
            f,
            text=text,
            error_codes=codes,
            received_from=None if f.received_from is None else self.time(lambda s: s.filters.received_from),
            received_to=None if f.received_to is None else self.time(lambda s: s.filters.received_to),
            error_text=None if f.error_text is None else self.text(lambda s: s.filters.error_text, pattern=True),
            payload_text=None if f.payload_text is None else self.text(lambda s: s.filters.payload_text, pattern=True),
            index_words=tuple(self.text(_index_word(i), pattern=True) for i in range(len(f.index_words))),
        )
        cursor = None
        if search.cursor is not None:
            cursor = cursor_after(self.time(lambda s: decode_cursor(s.cursor)[0]),  # type: ignore[arg-type]
                                  self.ident(lambda s: decode_cursor(s.cursor)[1]))  # type: ignore[arg-type]
        words = tuple(self.text(_word(i), pattern=True) for i in range(len(search.words)))
        return Search(filters, cursor, words)

    def find(self, value: Any) -> Extract | None:
        key = tuple(value) if isinstance(value, list) else value
        try:
            return self.extracts.get(key)
        except TypeError:  # an unhashable constant
            return None


def _code(index: int) -> Extract:
    return lambda search: search.filters.error_codes[index]


def _text(name: str) -> Extract:
    return lambda search: search.filters.text[name]


def _index_word(index: int) -> Extract:
    return lambda search: search.filters.index_words[index]


def _word(index: int) -> Extract:
    return lambda search: search.words[index]


def _shape(search: Search) -> Hashable | None:
    """What decides the SQL of ``search``'s statements; None for a search that is built each time (an error code
    listed twice: the list's arrays are made of its distinct codes)."""
    f = search.filters
    if len(set(f.error_codes)) != len(f.error_codes):
        return None
    return (f.states, len(f.error_codes), tuple(f.text), f.received_from is None, f.received_to is None,
            f.error_text is None, f.payload_text is None, f.payload_index, len(f.index_words), search.cursor is None,
            len(search.words))


@dataclass(frozen=True)
class _Prepared:
    statement: sa.Executable
    #: parameter name -> its value in a search
    parameters: dict[str, Extract]


def _named(statement: sa.Executable, stand_ins: _StandIns) -> _Prepared | None:
    """``statement`` with each stand-in value a named parameter; None when a stand-in is left in it otherwise."""
    parameters: dict[str, Extract] = {}

    def rename(element: Any, **_kw: Any) -> Any:
        if isinstance(element, BindParameter):
            extract = stands(element.value)
            if extract is not None:
                name = f"search_{len(parameters)}"
                parameters[name] = extract
                return sa.bindparam(name, type_=element.type, expanding=element.expanding,
                                    literal_execute=element.literal_execute)
        return None

    stands = stand_ins.find
    named: Any = visitors.replacement_traverse(cast(Any, statement), {}, rename)
    for element in visitors.iterate(named):
        if isinstance(element, BindParameter) and element.key not in parameters and _is_stand_in(element.value):
            return None
    try:  # a stand-in written into the SQL text itself (a literal column, a text fragment)
        sql = str(named)
    except Exception:  # a construct only its own dialect renders: not kept, built every time
        return None
    if any(trace in sql for trace in _TRACES):
        return None
    return _Prepared(named, parameters)


def _is_stand_in(value: Any) -> bool:
    if isinstance(value, str):
        return _MARK in value
    if isinstance(value, list | tuple):
        return any(_is_stand_in(item) for item in value)
    if isinstance(value, datetime):
        return value.year == _TIME_BASE.year
    return isinstance(value, int) and not isinstance(value, bool) and value <= _ID_BASE


_prepared: dict[Hashable, _Prepared | None] = {}
_UNKNOWN = _Prepared(sa.select(sa.literal(1)), {})  # a shape not built yet
_lock = threading.Lock()


def prepared(
    kind: str, build: Callable[[Search], sa.Executable], search: Search, arguments: Hashable = ()
) -> tuple[sa.Executable, dict[str, Any]]:
    """The statement ``build`` makes for ``search`` and the parameters to execute it with: the statement of the
    search's shape, built once (``kind`` and ``arguments`` name the builder and what else it was given), or built now
    for a search whose shape is not kept (then without parameters)."""
    shape = _shape(search)
    if shape is None:
        return build(search), {}
    key = (kind, arguments, shape)
    entry = _prepared.get(key, _UNKNOWN)
    if entry is _UNKNOWN:
        stand_ins = _StandIns()
        entry = _named(build(stand_ins.search(search)), stand_ins)
        with _lock:
            if len(_prepared) >= MAX_SHAPES:
                del _prepared[next(iter(_prepared))]
            _prepared[key] = entry
    if entry is None:  # the builder decided by a value: this shape is built every time
        return build(search), {}
    return entry.statement, {name: extract(search) for name, extract in entry.parameters.items()}
