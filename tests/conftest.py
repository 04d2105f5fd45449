"""Shared fixtures: real services (PostgreSQL, RabbitMQ, Spark) and throw-away databases."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from openroute.persistence import MessageStore

from tests.services import (
    POSTGRES_ADMIN_URL,
    RABBITMQ_URL,
    postgres_problem,
    rabbitmq_problem,
    require,
    spark_problem,
)


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    """URL of a fresh SQLite file database for one test."""
    return f"sqlite:///{tmp_path / 'openroute.db'}"


class FreshDatabases:
    """Empty PostgreSQL databases, each made by ``CREATE DATABASE`` for one test (or one module's tests) alone and
    dropped after it.

    Made when taken, not ahead: a version that kept two made ahead by a background thread saw, once, both queued
    names gone when the tests took them ("database ... does not exist") at the start of two Spark modules, for a
    cause not found; the few tenths of a second it saved per test are not worth a flaky run.
    """

    def __init__(self, admin_url: str) -> None:
        self._admin = sa.create_engine(admin_url, isolation_level="AUTOCOMMIT")
        self._base = admin_url.rsplit("/", 1)[0]

    def take(self) -> str:
        """The URL of a new, empty database for the caller alone, named ``openroute_t_<unix time>_<random>``."""
        name = f"{PREFIX}{int(time.time())}_{uuid.uuid4().hex[:8]}"
        with self._admin.connect() as connection:
            connection.execute(sa.text(f'CREATE DATABASE "{name}"'))
        return f"{self._base}/{name}"

    def drop(self, url: str) -> None:
        name = url.rsplit("/", 1)[1]
        with self._admin.connect() as connection:
            connection.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))

    def sweep(self, before: float) -> list[str]:
        """Drop the test databases (``openroute_t_...``) made before the unix time ``before`` that a run left
        behind (a killed run cannot drop its own); returns their names. The time is read from the name, or for
        an older name without one from the creation of its ``PG_VERSION`` file."""
        dropped = []
        with self._admin.connect() as connection:
            rows = connection.execute(sa.text(
                "SELECT datname, oid FROM pg_database WHERE datname LIKE 'openroute\\_t\\_%'")).all()
            for name, oid in rows:
                made = _made_at(name)
                if made is None:
                    try:
                        made = connection.execute(sa.text(
                            "SELECT extract(epoch FROM (pg_stat_file('base/' || :oid || '/PG_VERSION')).modification)"
                        ), {"oid": str(oid)}).scalar_one()
                    except sa.exc.DBAPIError:
                        continue  # not allowed to read it: leave the database alone
                if made is not None and float(made) < before:
                    connection.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
                    dropped.append(name)
        return dropped

    def close(self) -> None:
        self._admin.dispose()


#: the name prefix of every PostgreSQL database the tests make
PREFIX = "openroute_t_"
#: leftovers are dropped when older than the run and than this (other runs may share the server meanwhile)
LEFTOVER_AGE = 3600.0


def _made_at(name: str) -> float | None:
    stamp = name[len(PREFIX):].split("_", 1)[0]
    return float(stamp) if stamp.isdigit() and len(stamp) >= 9 else None


@pytest.fixture(scope="session")
def fresh_databases() -> Iterator[FreshDatabases]:
    """The run's maker of empty PostgreSQL databases."""
    require("PostgreSQL", postgres_problem)
    started = time.time()
    databases = FreshDatabases(POSTGRES_ADMIN_URL)
    try:
        yield databases
    finally:
        try:  # at the end of the run: leftovers of earlier (killed) runs, never a database of a run still going
            databases.sweep(min(started, time.time() - LEFTOVER_AGE))
        finally:
            databases.close()


@pytest.fixture
def postgres_url(fresh_databases: FreshDatabases) -> Iterator[str]:
    """URL of a fresh, empty PostgreSQL database for one test, dropped afterwards."""
    require("PostgreSQL", postgres_problem)
    url = fresh_databases.take()
    try:
        yield url
    finally:
        fresh_databases.drop(url)


@pytest.fixture(params=["sqlite", "postgres"])
def database_url(request: pytest.FixtureRequest) -> str:
    """Runs a test once on a SQLite file and once on a fresh PostgreSQL database."""
    if request.param == "sqlite":
        return request.getfixturevalue("sqlite_url")
    return request.getfixturevalue("postgres_url")


def _fresh_store(url: str) -> Iterator[MessageStore]:
    message_store = MessageStore(url)
    message_store.create_schema()
    try:
        yield message_store
    finally:
        message_store.dispose()


@pytest.fixture
def store(database_url: str) -> Iterator[MessageStore]:
    """A store with its schema, once on a SQLite file and once on a fresh PostgreSQL database (disposed after)."""
    yield from _fresh_store(database_url)


@pytest.fixture
def postgres_store(postgres_url: str) -> Iterator[MessageStore]:
    """A store with its schema on a fresh PostgreSQL database (for row-lock races SQLite cannot show)."""
    yield from _fresh_store(postgres_url)


@pytest.fixture
def rabbitmq_url() -> str:
    """URL of the local RabbitMQ broker (a failure in CI when it is down, a skip elsewhere)."""
    require("RabbitMQ", rabbitmq_problem)
    return RABBITMQ_URL


@pytest.fixture(scope="session")
def spark_available() -> None:
    require("Spark", spark_problem)
