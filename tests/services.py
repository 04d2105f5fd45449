"""Access to the real services the integration tests need (PostgreSQL, RabbitMQ, Spark).

On a laptop without a service the tests that need it are skipped with the reason; in CI
(``CI=true``) a missing service is a failure, never a skip.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import uuid
from collections.abc import Callable, Iterator

import pytest
import sqlalchemy as sa
from openroute.persistence import MessageStore

POSTGRES_ADMIN_URL = os.environ.get(
    "OPENROUTE_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)
RABBITMQ_URL = os.environ.get("OPENROUTE_TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/")


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in {"1", "true", "yes"}


def require(service: str, probe: Callable[[], str | None]) -> None:
    """Skip (laptop) or fail (CI) the current test when ``probe`` reports a problem."""
    problem = probe()
    if problem is None:
        return
    message = f"{service} is not available: {problem}"
    if in_ci():
        pytest.fail(f"{message} (CI=true: a missing service is a failure)", pytrace=False)
    pytest.skip(message)


def require_database(database: str) -> None:
    """Fail (CI) or skip the current test when ``database`` (``sqlite`` or ``postgres``) is not there."""
    if database == "postgres":
        require("PostgreSQL", postgres_problem)


def tcp_problem(host: str, port: int) -> str | None:
    try:
        with socket.create_connection((host, port), timeout=2):
            return None
    except OSError as error:
        return f"cannot connect to {host}:{port} ({error})"


def postgres_problem() -> str | None:
    problem = tcp_problem("127.0.0.1", 5432)
    if problem:
        return problem
    try:
        import sqlalchemy as sa

        engine = sa.create_engine(POSTGRES_ADMIN_URL)
        with engine.connect() as connection:
            connection.execute(sa.text("select 1"))
        engine.dispose()
    except Exception as error:  # any driver or auth problem is reported as the reason
        return f"{POSTGRES_ADMIN_URL}: {error}"
    return None


def rabbitmq_problem() -> str | None:
    return tcp_problem("127.0.0.1", 5672)


def spark_problem() -> str | None:
    try:
        import pyspark  # noqa: F401
    except ImportError:
        return "pyspark is not installed (pip install -e '.[dev]')"
    if not (os.environ.get("JAVA_HOME") or shutil.which("java")):
        return "no Java runtime (JAVA_HOME unset and no java on PATH)"
    return None


@contextlib.contextmanager
def scratch_postgres_store(prefix: str) -> Iterator[MessageStore]:
    """A store with its schema on a PostgreSQL database of its own (``<prefix>_<random>``), dropped afterwards: for
    tests that shape a whole table (plans, statistics) without meeting other tests' rows."""
    require("PostgreSQL", postgres_problem)
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    admin = sa.create_engine(POSTGRES_ADMIN_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        connection.execute(sa.text(f'CREATE DATABASE "{name}"'))
    store = MessageStore(POSTGRES_ADMIN_URL.rsplit("/", 1)[0] + f"/{name}")
    try:
        store.create_schema()
        yield store
    finally:
        store.dispose()
        with admin.connect() as connection:
            connection.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()
