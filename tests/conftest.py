"""Shared fixtures: real services (PostgreSQL, RabbitMQ, Spark) and throw-away databases."""

from __future__ import annotations

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
        """The URL of a new, empty database for the caller alone."""
        name = f"openroute_t_{uuid.uuid4().hex[:12]}"
        with self._admin.connect() as connection:
            connection.execute(sa.text(f'CREATE DATABASE "{name}"'))
        return f"{self._base}/{name}"

    def drop(self, url: str) -> None:
        name = url.rsplit("/", 1)[1]
        with self._admin.connect() as connection:
            connection.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))

    def close(self) -> None:
        self._admin.dispose()


@pytest.fixture(scope="session")
def fresh_databases() -> Iterator[FreshDatabases]:
    """The run's maker of empty PostgreSQL databases."""
    require("PostgreSQL", postgres_problem)
    databases = FreshDatabases(POSTGRES_ADMIN_URL)
    try:
        yield databases
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
