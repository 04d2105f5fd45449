"""The Spark session and JDBC reading of the store: URL translation, drivers, partitions, timestamps, errors."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from openroute.persistence import MessageStore, NewMessage

from openroute.spark.session import (
    IdRange,
    SparkSetupError,
    find_driver_jar,
    first_line,
    id_ranges,
    jdbc_source,
    read_table,
)

T0 = datetime(2024, 5, 1, 8, 30, 15, 123456, tzinfo=UTC)


def _store(url: str, count: int) -> MessageStore:
    store = MessageStore(url)
    store.create_schema()
    store.insert_messages([
        NewMessage("crm", "setCustomer", f'{{"n": {n}}}', "application/json", f"c-{n}", "CRM",
                   T0 + timedelta(minutes=n), headers={"h": str(n)})
        for n in range(count)
    ])
    return store


def test_sqlalchemy_urls_become_jdbc_urls(tmp_path: Path) -> None:
    db = tmp_path / "store.db"
    db.touch()
    sqlite = jdbc_source(f"sqlite:///{db}")
    assert (sqlite.url, sqlite.properties) == (f"jdbc:sqlite:{db}", {"driver": "org.sqlite.JDBC"})
    pg = jdbc_source("postgresql+psycopg://ops:s3cret@db.example:6543/openroute")
    assert pg.url == "jdbc:postgresql://db.example:6543/openroute"
    assert pg.properties == {"driver": "org.postgresql.Driver", "user": "ops", "password": "s3cret"}
    assert "s3cret" not in pg.describe()


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("mysql://h/db", "unsupported database 'mysql'"),
        ("sqlite:///{tmp}/missing.db", "no SQLite store at"),
        ("sqlite://", "needs a SQLite file"),
        ("not a url", "not a database URL"),
    ],
)
def test_bad_store_urls_are_one_line_setup_errors(tmp_path: Path, url: str, says: str) -> None:
    with pytest.raises(SparkSetupError, match=says) as raised:
        jdbc_source(url.format(tmp=tmp_path))
    assert "\n" not in str(raised.value)


def test_driver_jars_come_from_a_given_path_first(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    jar = tmp_path / "postgresql-42.7.1.jar"
    jar.write_bytes(b"")
    assert find_driver_jar("postgresql", tmp_path) == jar
    assert find_driver_jar("postgresql", jar) == jar
    monkeypatch.setattr("openroute.spark.session.DEFAULT_JAR_DIRS", ())
    monkeypatch.delenv("OPENROUTE_JDBC_PATH", raising=False)
    assert find_driver_jar("sqlite", tmp_path) is None
    db = tmp_path / "x.db"
    db.touch()
    with pytest.raises(SparkSetupError, match="apt-get install -y libxerial-sqlite-jdbc-java"):
        jdbc_source(f"sqlite:///{db}", tmp_path)


def test_read_table_in_id_range_partitions_with_utc_timestamps(spark: Any, database_url: str) -> None:
    _store(database_url, 25).dispose()
    frame = read_table(spark, database_url, "message", partitions=3)
    assert frame.rdd.getNumPartitions() == 3
    rows = sorted(frame.select("id", "receive_ts", "state", "headers", "failed_count").collect())
    assert len(rows) == 25
    first = rows[0]
    assert first.state == "NEW" and first.failed_count == 0 and '"h"' in first.headers
    # Spark hands naive datetimes in the session time zone, which build_session sets to UTC
    assert first.receive_ts.replace(tzinfo=UTC) == T0
    assert rows[-1].receive_ts.replace(tzinfo=UTC) == T0 + timedelta(minutes=24)
    transitions = read_table(
        spark, database_url, "message_transition", partitions=2, columns=["message_id", "to_state"]
    )
    assert transitions.count() == 25 and transitions.columns == ["message_id", "to_state"]


def test_an_empty_table_is_one_empty_partition(spark: Any, database_url: str) -> None:
    _store(database_url, 0).dispose()
    frame = read_table(spark, database_url, "message", partitions=4)
    assert frame.count() == 0


def test_id_ranges_of_several_tables_come_from_one_query_and_split_a_filtered_read(
    spark: Any, database_url: str
) -> None:
    import sqlalchemy as sa
    from openroute.persistence.models import message_table

    store = _store(database_url, 12)
    with store.engine.connect() as connection:
        ids = connection.execute(sa.text("SELECT min(id), max(id) FROM message")).one()
        transitions = connection.execute(sa.text("SELECT min(id), max(id) FROM message_transition")).one()
    store.dispose()
    ranges = id_ranges(spark, database_url, ["message", "message_transition", "confirmation"])
    assert ranges["message"] == IdRange(*ids) and ranges["message_transition"] == IdRange(*transitions)
    assert ranges["confirmation"].lo > ranges["confirmation"].hi  # an empty table: no rows to split
    # the filter runs in the partitions' queries: the same rows as with the bounds of the selection itself
    where = message_table.c.id.in_([ids[0] + 1, ids[0] + 2, ids[0] + 10])
    split = read_table(spark, database_url, "message", 3, columns=["id"], where=where, id_range=ranges["message"])
    bounded = read_table(spark, database_url, "message", 3, columns=["id"], where=where)
    assert split.rdd.getNumPartitions() == 3
    assert sorted(r.id for r in split.collect()) == sorted(r.id for r in bounded.collect()) == [
        ids[0] + 1, ids[0] + 2, ids[0] + 10
    ]
    empty = read_table(spark, database_url, "confirmation", 3, id_range=ranges["confirmation"])
    assert empty.count() == 0
    with pytest.raises(ValueError, match="no store table 'nope'"):
        id_ranges(spark, database_url, ["nope"])
    with pytest.raises(ValueError, match="id_range splits the id column"):
        read_table(spark, database_url, "message", column="version", id_range=ranges["message"])


def test_unreachable_database_is_one_line_not_a_stack_trace(spark: Any) -> None:
    with pytest.raises(SparkSetupError) as raised:
        read_table(spark, "postgresql+psycopg://nobody@127.0.0.1:1/none", "message")
    text = str(raised.value)
    assert "\n" not in text and "jdbc:postgresql://127.0.0.1:1/none" in text
    assert "Connection" in text or "connect" in text
    with pytest.raises(ValueError, match="partitions must be >= 1, got 0"):
        read_table(spark, "postgresql+psycopg://nobody@127.0.0.1:1/none", "message", partitions=0)


def test_first_line_of_a_plain_error() -> None:
    assert first_line(RuntimeError("boom\n  at x.y(Z.java:1)")) == "boom"
