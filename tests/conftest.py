"""Shared fixtures: real services (PostgreSQL, RabbitMQ, Spark) and throw-away databases."""

from __future__ import annotations

import os
import queue
import shutil
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

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
def sqlite_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """URL of a fresh SQLite file database for one test (for a test of ``store``, a copy of a migrated file)."""
    path = tmp_path / "openroute.db"
    if _migrating(request):
        shutil.copyfile(request.getfixturevalue("_migrated_sqlite"), path)
    return f"sqlite:///{path}"


class FreshDatabases:
    """PostgreSQL databases, each made by ``CREATE DATABASE`` for one test (or one module's tests) alone and
    dropped after it: empty, or a copy of the run's migrated template (:meth:`take_migrated`).

    Made when taken, not ahead: a version that kept two made ahead by a background thread saw, once, both queued
    names gone when the tests took them ("database ... does not exist") at the start of two Spark modules, for a
    cause not found; the few tenths of a second it saved per test are not worth a flaky run.

    Dropped behind the tests (:meth:`release`): PostgreSQL 15's ``DROP DATABASE`` waits for a checkpoint, a second
    or more on a busy machine, which no test needs to wait for.
    """

    def __init__(self, admin_url: str) -> None:
        self._admin = sa.create_engine(admin_url, isolation_level="AUTOCOMMIT")
        self._base = admin_url.rsplit("/", 1)[0]
        self._template: str | None = None
        self._template_made = 0.0
        self._template_lock = threading.Lock()
        self._released: queue.Queue[str] = queue.Queue(maxsize=RELEASE_BACKLOG)
        self._release_failures: list[str] = []
        self._dropper = threading.Thread(target=self._drop_released, name="test-database-dropper", daemon=True)
        self._dropper.start()

    def take(self) -> str:
        """The URL of a new, empty database for the caller alone, named ``openroute_t_<unix time>_<random>``."""
        return self._create()

    def take_migrated(self) -> str:
        """The URL of a new database for the caller alone holding the migrated schema (the copy of a template
        database that :meth:`MessageStore.create_schema` migrated once in this run), nothing else."""
        with self._template_lock:
            # renewed well before another run's sweep would take it for a leftover (older than LEFTOVER_AGE)
            if self._template is None or time.time() - self._template_made > LEFTOVER_AGE / 2:
                if self._template is not None:
                    self.release(f"{self._base}/{self._template}")
                url = self._create()
                template = MessageStore(url)
                try:
                    template.create_schema()
                finally:
                    template.dispose()  # a template must have no session: CREATE DATABASE ... TEMPLATE refuses
                self._template, self._template_made = url.rsplit("/", 1)[1], time.time()
            return self._create(template=self._template)

    def _create(self, template: str | None = None) -> str:
        name = f"{PREFIX}{int(time.time())}_{uuid.uuid4().hex[:8]}"
        copy = f' TEMPLATE "{template}"' if template else ""
        with self._admin.connect() as connection:
            connection.execute(sa.text(f'CREATE DATABASE "{name}"{copy}'))
        return f"{self._base}/{name}"

    def drop(self, url: str) -> None:
        """Drop the database at ``url`` now (its open sessions are ended)."""
        name = url.rsplit("/", 1)[1]
        with self._admin.connect() as connection:
            connection.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))

    def release(self, url: str) -> None:
        """Hand the database at ``url`` to the background dropper; waits only while :data:`RELEASE_BACKLOG` are
        still to drop. :meth:`close` waits for every one."""
        self._released.put(url)

    def wait_released(self) -> None:
        """Return when every database handed to :meth:`release` so far is dropped (or failed to be)."""
        self._released.join()

    def _drop_released(self) -> None:
        while True:
            url = self._released.get()
            try:
                self.drop(url)
            except Exception as error:  # reported by close(); the next run's sweep drops it
                self._release_failures.append(f"{url.rsplit('/', 1)[1]}: {str(error).splitlines()[0]}")
            finally:
                self._released.task_done()

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

    def close(self) -> list[str]:
        """Wait until every released database is dropped, drop the template, close the admin connections;
        returns the released databases that could not be dropped (one line each)."""
        self.wait_released()
        if self._template is not None:
            self.drop(f"{self._base}/{self._template}")
        self._admin.dispose()
        return self._release_failures


#: released databases still to drop before :meth:`FreshDatabases.release` waits (bounds the disk they hold)
RELEASE_BACKLOG = 16


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
            failures = databases.close()
        assert not failures, f"test databases not dropped (the next run's sweep drops them): {failures}"


#: the fixtures that migrate their database at once: for them the database is made as a copy of a migrated one
MIGRATING_FIXTURES = frozenset({"store", "postgres_store"})


def _migrating(request: pytest.FixtureRequest) -> bool:
    return not MIGRATING_FIXTURES.isdisjoint(request.fixturenames)


@pytest.fixture(scope="session")
def _migrated_sqlite(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A SQLite file that :meth:`MessageStore.create_schema` migrated once in this run (copied, never used)."""
    path = tmp_path_factory.mktemp("migrated") / "openroute.db"
    template = MessageStore(f"sqlite:///{path}")
    try:
        template.create_schema()
    finally:
        template.dispose()  # the last connection closed: the write-ahead log is in the file, the copy is whole
    return path


@pytest.fixture
def postgres_url(request: pytest.FixtureRequest, fresh_databases: FreshDatabases) -> Iterator[str]:
    """URL of a fresh, empty PostgreSQL database for one test (for a test of ``store`` or ``postgres_store``, a
    copy of a migrated one), dropped afterwards."""
    url = fresh_databases.take_migrated() if _migrating(request) else fresh_databases.take()
    try:
        yield url
    finally:
        fresh_databases.release(url)


@pytest.fixture(params=["sqlite", "postgres"])
def database_url(request: pytest.FixtureRequest) -> str:
    """Runs a test once on a SQLite file and once on a fresh PostgreSQL database."""
    if request.param == "sqlite":
        return request.getfixturevalue("sqlite_url")
    return request.getfixturevalue("postgres_url")


def _fresh_store(url: str) -> Iterator[MessageStore]:
    message_store = MessageStore(url)  # the database was made as a copy of a migrated one (see _migrating)
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


#: the Spark tests' folder, relative to the root (how pytest-xdist names tests): one work unit for one worker
_SPARK_FOLDER = "tests/spark/"


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """How pytest-xdist shares the suite between its 2 workers (``--numprocesses=2`` in pyproject.toml).

    A module is one unit of work, given to whichever worker is free: its module-scoped fixtures (a 100,000-row
    database, a fake server) are made once. The Spark tests (``tests/spark``) are one unit, run by one worker one
    after the other: one SparkSession (one JVM) per run, as without workers, and never two Spark jobs at once on the
    2 cores. Units go out in collection order, which :func:`pytest_collection_modifyitems` starts with the Spark tests
    and then the modules that hold a slow test, so the long ones begin at once, beside each other, and the short
    modules fill in at the end. (xdist's own ``--dist loadgroup`` would do the Spark grouping, but with pytest 9 the
    group it writes into the test's id is lost.)
    """
    from xdist.scheduler import LoadScopeScheduling

    class ModulesAndSpark(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _SPARK_FOLDER if nodeid.startswith(_SPARK_FOLDER) else nodeid.split("::", 1)[0]

    return ModulesAndSpark(config, log)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """On pytest-xdist's workers: the Spark tests first, then the modules that hold a slow test, then the rest, each
    in its collected order (see :func:`pytest_xdist_make_scheduler`). A run without workers keeps its order."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return
    root = Path(__file__).parent.parent

    def module(item: pytest.Item) -> str:
        return item.path.relative_to(root).as_posix()
    slow = {module(item) for item in items if item.get_closest_marker("slow") is not None}
    items.sort(key=lambda item: 0 if module(item).startswith(_SPARK_FOLDER) else 1 if module(item) in slow else 2)
