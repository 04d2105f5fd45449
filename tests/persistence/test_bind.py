"""The hot path's bind processors (persistence/_bind.py): each stores exactly what SQLAlchemy's own processor stores
for the column, and refuses what it refuses with the same error; a batch's column is converted once when it can be."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
import sqlalchemy as sa
from openroute.persistence import MessageState, message_table
from openroute.persistence._bind import _SMALL_DICTS, _converted, _processor, _sqlite_timestamp
from openroute.persistence.models import message_transition_table
from sqlalchemy.dialects import postgresql, sqlite

CEST = timezone(timedelta(hours=2))


@pytest.mark.parametrize(
    "stamp",
    [
        datetime(2024, 6, 1, 14, 0, tzinfo=UTC),  # no microseconds: isoformat would leave them out
        datetime(2024, 6, 1, 14, 0, 0, 123, tzinfo=CEST),  # another zone: converted to UTC
        datetime(999, 2, 3, 4, 5, 6, 7, tzinfo=UTC),  # a year of three digits is still written with four
        datetime(9999, 12, 31, 23, 59, 59, 999_999, tzinfo=UTC),
    ],
)
def test_sqlite_timestamps_are_the_text_sqlalchemy_writes(stamp: datetime) -> None:
    dialect = sqlite.dialect()
    sqlalchemys = message_table.c.receive_ts.type.dialect_impl(dialect).bind_processor(dialect)
    assert _sqlite_timestamp(stamp) == sqlalchemys(stamp)
    assert _sqlite_timestamp(None) is None


def test_sqlite_timestamps_of_one_second_share_its_text_and_not_the_microseconds() -> None:
    dialect = sqlite.dialect()
    sqlalchemys = message_table.c.receive_ts.type.dialect_impl(dialect).bind_processor(dialect)
    start = datetime(2024, 6, 1, 14, 58, 59, 999_990, tzinfo=UTC)
    stamps = [start + timedelta(microseconds=step * 3_000_001) for step in range(50)]  # over two minutes, an hour
    assert [_sqlite_timestamp(stamp) for stamp in stamps] == [sqlalchemys(stamp) for stamp in stamps]


@pytest.mark.parametrize("dialect", [sqlite.dialect(), postgresql.psycopg.dialect()], ids=["sqlite", "postgresql"])
def test_small_dicts_of_texts_get_the_json_sqlalchemy_writes_also_from_the_cache(dialect: sa.Dialect) -> None:
    sqlalchemy_processor = message_table.c.headers.type.dialect_impl(dialect).bind_processor(dialect)
    our_processor = _processor(message_table.c.headers, dialect)
    assert our_processor is not None and sqlalchemy_processor is not None
    ours, sqlalchemys = our_processor, sqlalchemy_processor
    values: list[Any] = [{"endpoint": "soap", "soapVersion": "1.1"}, {"soapVersion": "1.1", "endpoint": "soap"},
                         {"endpoint": "json"}, {"a": "é", "b": "\"quoted\""}, {"n": 1}, {"x": ["y"]}, {}, [],
                         {str(n): "v" for n in range(6)}]
    def same(value: Any) -> bool:  # PostgreSQL's processor wraps the value for the driver, which writes it later
        a, b = ours(value), sqlalchemys(value)
        return bool(a == b) if isinstance(b, str) else (type(a) is type(b) and a.obj == b.obj == value)

    for value in values * 2:  # the second time from the cache where one is kept
        assert same(value), value
    for n in range(_SMALL_DICTS + 5):  # more distinct dicts than the cache keeps
        assert same({"endpoint": str(n)})


@pytest.mark.parametrize("dialect", [sqlite.dialect(), postgresql.psycopg.dialect()], ids=["sqlite", "postgresql"])
def test_states_get_the_text_sqlalchemy_writes_and_its_error_for_no_state(dialect: sa.Dialect) -> None:
    """The state's processor answers a member (or its value) from its table, anything else through SQLAlchemy's."""
    for column in (message_table.c.state, message_transition_table.c.from_state):
        sqlalchemys = column.type.dialect_impl(dialect).bind_processor(dialect)
        ours = _processor(column, dialect)
        assert ours is not None and sqlalchemys is not None
        for value in [*MessageState, *(state.value for state in MessageState)]:
            assert ours(value) == sqlalchemys(value)
            assert type(ours(value)) is type(sqlalchemys(value))
        for bad in ("BOGUS", 3, ["NEW"]):
            with pytest.raises((LookupError, TypeError)) as ours_error:
                ours(bad)
            with pytest.raises((LookupError, TypeError)) as sqlalchemys_error:
                sqlalchemys(bad)
            assert (type(ours_error.value), str(ours_error.value)) == (type(sqlalchemys_error.value),
                                                                       str(sqlalchemys_error.value))


def test_a_column_of_one_object_or_of_empty_containers_is_converted_once() -> None:
    calls: list[Any] = []

    def process(value: Any) -> str:
        calls.append(value)
        return repr(value)

    stamp = datetime(2024, 6, 1, 14, 0, tzinfo=UTC)
    assert _converted(process, [stamp, stamp, stamp]) == (repr(stamp),) * 3
    assert _converted(process, [{}, {}, {}]) == ("{}",) * 3  # each row's own empty dict: the same text
    assert _converted(process, [[], []]) == ("[]",) * 2
    assert calls == [stamp, {}, []]
    calls.clear()
    # different values, or an empty dict beside an empty list, are converted one by one, in order
    assert _converted(process, [1, 2, 1]) == ("1", "2", "1")
    assert _converted(process, [{}, []]) == ("{}", "[]")
    assert calls == [1, 2, 1, {}, []]
