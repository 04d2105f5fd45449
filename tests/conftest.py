"""Shared fixtures: real services (PostgreSQL, RabbitMQ, Spark) and throw-away databases."""

from __future__ import annotations

import queue
import threading
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
    """Empty PostgreSQL databases made ahead, each handed to exactly one test and dropped after it.

    ``CREATE DATABASE`` copies template1 through the WAL: 0.05 s on an idle server, 0.3 s once a run has written
    a few hundred of them since the last checkpoint. One background thread keeps ``ahead`` databases created
    while the tests run, so a test waits for none; every database is still made by ``CREATE DATABASE`` for that
    test alone and no one else connects to it. A failure to create one is raised in the test that takes it.
    """

    def __init__(self, admin_url: str, ahead: int = 2) -> None:
        self._admin = sa.create_engine(admin_url, isolation_level="AUTOCOMMIT")
        self._base = admin_url.rsplit("/", 1)[0]
        self._ready: queue.Queue[str | Exception] = queue.Queue()
        self._wanted = threading.Semaphore(ahead)
        self._closing = threading.Event()
        self._maker = threading.Thread(target=self._make, name="fresh-postgres-databases", daemon=True)
        self._maker.start()

    def _make(self) -> None:
        while True:
            self._wanted.acquire()
            if self._closing.is_set():
                return
            name = f"openroute_t_{uuid.uuid4().hex[:12]}"
            try:
                with self._admin.connect() as connection:
                    connection.execute(sa.text(f'CREATE DATABASE "{name}"'))
            except Exception as error:  # raised in the test that takes this turn
                self._ready.put(error)
            else:
                self._ready.put(name)

    def take(self, timeout: float = 120) -> str:
        """The URL of a database made for the caller alone (waits at most ``timeout`` s for it)."""
        try:
            made = self._ready.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"no fresh PostgreSQL database created within {timeout} s") from None
        self._wanted.release()  # the thread makes the next one while the caller runs
        if isinstance(made, Exception):
            raise made
        return f"{self._base}/{made}"

    def drop(self, url: str) -> None:
        name = url.rsplit("/", 1)[1]
        with self._admin.connect() as connection:
            connection.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))

    def close(self) -> None:
        """Stop making databases and drop the ones no test took."""
        self._closing.set()
        self._wanted.release()
        self._maker.join(120)
        while True:
            try:
                made = self._ready.get_nowait()
            except queue.Empty:
                break
            if isinstance(made, str):
                self.drop(f"{self._base}/{made}")
        self._admin.dispose()


@pytest.fixture(scope="session")
def fresh_databases() -> Iterator[FreshDatabases]:
    """The run's maker of empty PostgreSQL databases (started by the first test that needs one)."""
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
