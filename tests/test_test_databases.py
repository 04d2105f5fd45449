"""The suite's PostgreSQL databases: prefixed ``openroute_t_``, dropped after use, leftovers swept (issue 26)."""

from __future__ import annotations

import time
import uuid

import sqlalchemy as sa
from openroute.persistence import MessageStore

from tests.conftest import PREFIX, FreshDatabases


def _names(databases: FreshDatabases) -> set[str]:
    with databases._admin.connect() as connection:
        return set(connection.execute(sa.text("SELECT datname FROM pg_database")).scalars())


def test_databases_are_prefixed_dropped_and_old_leftovers_swept(fresh_databases: FreshDatabases) -> None:
    url = fresh_databases.take()
    name = url.rsplit("/", 1)[1]
    assert name.startswith(PREFIX) and name in _names(fresh_databases)
    old = f"{PREFIX}{int(time.time()) - 7200}_{uuid.uuid4().hex[:8]}"  # a killed run's, two hours ago
    with fresh_databases._admin.connect() as connection:
        connection.execute(sa.text(f'CREATE DATABASE "{old}"'))
    try:
        swept = fresh_databases.sweep(time.time() - 3600)
        assert old in swept and name not in swept  # the young one may belong to a run still going
        assert old not in _names(fresh_databases) and name in _names(fresh_databases)
    finally:
        fresh_databases.drop(url)
    assert name not in _names(fresh_databases)


def test_a_migrated_copy_holds_the_schema_and_a_released_database_is_dropped_behind(
    fresh_databases: FreshDatabases,
) -> None:
    url = fresh_databases.take_migrated()
    name = url.rsplit("/", 1)[1]
    store = MessageStore(url)
    try:
        assert name.startswith(PREFIX) and store.current_revision() == MessageStore.head_revision()
        assert store.find() == [], "the copy of the migrated template holds no message"
    finally:
        store.dispose()
    other = fresh_databases.take_migrated()
    assert other != url, "each test has a copy of its own"
    for taken in (url, other):
        fresh_databases.release(taken)
    fresh_databases.wait_released()
    assert {name, other.rsplit("/", 1)[1]}.isdisjoint(_names(fresh_databases))
