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


@pytest.fixture
def postgres_url() -> Iterator[str]:
    """URL of a fresh, empty PostgreSQL database for one test, dropped afterwards."""
    require("PostgreSQL", postgres_problem)
    name = f"openroute_t_{uuid.uuid4().hex[:12]}"
    admin = sa.create_engine(POSTGRES_ADMIN_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        connection.execute(sa.text(f'CREATE DATABASE "{name}"'))
    url = POSTGRES_ADMIN_URL.rsplit("/", 1)[0] + f"/{name}"
    try:
        yield url
    finally:
        with admin.connect() as connection:
            connection.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


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
