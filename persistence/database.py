"""The store's database: one SQLAlchemy engine over a SQLite file (default) or PostgreSQL, its schema and its
transactions.

One transaction story for every part of the store (:mod:`~openroute.persistence.store` and the parts it holds,
``store.transitions``, ``store.calls``, ``store.funnels``, ``store.nodes``, and the tables of ``breaker``,
``call_records``, ``alerts``, ``throttle``): a method that reads or writes takes an optional ``connection``. Without
one it runs in a transaction of its own (:meth:`Database.run` commits it); with one, a connection of
:meth:`Database.begin` or of the engine's group-commit writer, it joins that caller's transaction, so several
writes of several parts commit together. The table modules used by services that hold only a SQLAlchemy engine
(``outbox``, ``confirmations``) take the caller's connection as a required first argument: the same rule, with the
transaction always the caller's.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import sqlalchemy as sa
from openroute.persistence.outage import StoreOutage
from sqlalchemy.dialects import postgresql, sqlite

__all__ = ["DEFAULT_DATABASE_URL", "MIGRATIONS_DIR", "Database", "StorePart", "alembic_config", "create_store_engine"]

#: the store when none is named (the one default: the server's settings and every operator command use it)
DEFAULT_DATABASE_URL = "sqlite:///openroute.db"
MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"

T = TypeVar("T")


def _configure_sqlite(engine: sa.Engine) -> None:
    """WAL, busy timeout and immediate write transactions for every SQLite connection.

    ``BEGIN IMMEDIATE`` takes the write lock at the start of a transaction: with pysqlite's deferred
    BEGIN a reader that later writes can fail with SQLITE_BUSY without honouring the busy timeout.
    """

    @sa.event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None  # we emit BEGIN ourselves (see below)
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA busy_timeout=30000")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.close()

    # the dialect's own begin (a no-op for pysqlite) on the driver's connection: the documented recipe, a "begin"
    # listener running exec_driver_sql, builds a full execution context each time (~60,000 instructions, every
    # transaction of the engine's writer); a driver error is still raised as SQLAlchemy's (do_begin runs inside
    # its error handling). SQLAlchemy's cursor listeners do not hear this BEGIN.
    engine.dialect.do_begin = _begin_immediate  # type: ignore[method-assign]


def _begin_immediate(dbapi_connection: Any) -> None:
    dbapi_connection.execute("BEGIN IMMEDIATE")


#: a pooled PostgreSQL connection idle longer than this (seconds) is pinged before it is handed out
PING_AFTER_IDLE = 1.0


def _ping_when_idle(engine: sa.Engine, idle: float) -> None:
    """Ping a pooled connection before handing it out only when it sat idle more than ``idle`` seconds.

    SQLAlchemy's ``pool_pre_ping`` pings at every checkout: one round trip of the four of an admin lookup. A
    connection dropped while it was idle (a database restart, a firewall's timeout) is found as before; one used
    within the last ``idle`` seconds is taken as alive, and if the database went away in that moment its first
    statement fails and the pool replaces its connections, as for a connection that breaks in use.
    """

    @sa.event.listens_for(engine, "connect")
    @sa.event.listens_for(engine, "checkin")
    def _used(_dbapi_connection: Any, record: Any) -> None:
        record.info["checked_in_at"] = time.monotonic()

    @sa.event.listens_for(engine, "checkout")
    def _on_checkout(dbapi_connection: Any, record: Any, _proxy: Any) -> None:
        if time.monotonic() - record.info.get("checked_in_at", 0.0) <= idle:
            return
        try:
            engine.dialect.do_ping(dbapi_connection)
        except engine.dialect.loaded_dbapi.Error as error:
            if engine.dialect.is_disconnect(error, dbapi_connection, None):
                # the pool discards this connection and checks out another (a new one if need be)
                raise sa.exc.DisconnectionError(str(error).splitlines()[0] if str(error) else "ping failed") from error
            raise


def create_store_engine(
    url: str, *, pool_size: int = 8, echo: bool = False, ping_after_idle: float = PING_AFTER_IDLE
) -> sa.Engine:
    """A SQLAlchemy engine configured the way the store needs it (SQLite pragmas, pool size; a PostgreSQL connection
    idle more than ``ping_after_idle`` seconds is pinged before use, see :func:`_ping_when_idle`)."""
    parsed = sa.engine.make_url(url)
    if parsed.get_backend_name() == "sqlite":
        if parsed.database in (None, "", ":memory:"):
            raise ValueError("the store needs a SQLite file (an in-memory database is private to one connection)")
        engine = sa.create_engine(url, echo=echo, pool_size=pool_size, max_overflow=pool_size)
        _configure_sqlite(engine)
        return engine
    if parsed.get_backend_name() == "postgresql":
        engine = sa.create_engine(url, echo=echo, pool_size=pool_size, max_overflow=pool_size)
        _ping_when_idle(engine, ping_after_idle)
        return engine
    raise ValueError(f"unsupported database {parsed.get_backend_name()!r}: use sqlite:/// or postgresql+psycopg://")


def sqlite_file(url: str) -> Path | None:
    """The file of a SQLite store's ``url`` (relative to the working directory when the URL is), None for another
    database or a URL that is not one. A command that only reads the store checks it exists first: connecting to a
    missing SQLite file would create an empty one."""
    try:
        parsed = sa.engine.make_url(url)
    except (sa.exc.ArgumentError, ValueError):  # not a URL, or a port that is no number: opening it says which
        return None
    if parsed.get_backend_name() != "sqlite" or parsed.database in (None, "", ":memory:"):
        return None
    return Path(parsed.database)


def alembic_config(url: str) -> Any:
    """An Alembic ``Config`` for the store's migrations at ``url`` (no ini file needed)."""
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return config


class Database:
    """The store's database at ``url``: its SQLAlchemy engine, schema migrations and transactions.

    ``url`` is a SQLAlchemy URL: ``sqlite:///path/file.db`` (the default ``sqlite:///openroute.db``) or
    ``postgresql+psycopg://user@host/db``. The same statements run on both.
    """

    def __init__(self, url: str | None = None, *, pool_size: int = 8, echo: bool = False) -> None:
        self.url = url or DEFAULT_DATABASE_URL
        self.engine = create_store_engine(self.url, pool_size=pool_size, echo=echo)
        self.dialect = self.engine.dialect.name
        #: whether the database is known to be unreachable now (every user of this store reports to it)
        self.outage = StoreOutage()

    # -- schema ---------------------------------------------------------------------------------
    def upgrade(self, revision: str = "head") -> None:
        """Apply the Alembic migrations up to ``revision`` (what ``openroute db upgrade`` runs)."""
        from alembic import command

        with self.engine.begin() as connection:
            config = alembic_config(self.url)
            config.attributes["connection"] = connection
            command.upgrade(config, revision)

    def create_schema(self) -> None:
        """Create every table, through the migrations so the schema is always the migrated one."""
        self.upgrade("head")

    def current_revision(self) -> str | None:
        """The Alembic revision the database is at (None before the first upgrade)."""
        from alembic.runtime.migration import MigrationContext

        with self.engine.connect() as connection:
            return MigrationContext.configure(connection).get_current_revision()

    @staticmethod
    def head_revision() -> str:
        """The newest migration this version of openroute ships (what ``upgrade()`` brings a database to)."""
        from alembic.script import ScriptDirectory

        head = ScriptDirectory.from_config(alembic_config("sqlite://")).get_current_head()
        assert head is not None, "the migrations folder has no head revision"  # noqa: S101  a broken install, not input
        return head

    def dispose(self) -> None:
        """Close every pooled connection."""
        self.engine.dispose()

    # -- transactions ---------------------------------------------------------------------------
    @contextlib.contextmanager
    def begin(self) -> Iterator[sa.Connection]:
        """One transaction: committed when the block ends, rolled back on an exception."""
        with self.engine.begin() as connection:
            yield connection

    def run(self, work: Callable[[sa.Connection], T], connection: sa.Connection | None = None) -> T:
        """Run ``work`` in ``connection``'s transaction, or in a new one."""
        if connection is not None:
            return work(connection)
        with self.engine.begin() as own:
            return work(own)

    def upsert(self, table: sa.Table) -> Any:
        """An INSERT into ``table`` in this database's dialect (with ``on_conflict_do_nothing`` / ``_update``)."""
        return upsert(table, self.dialect)

    def locked(self, query: sa.Select[Any]) -> sa.Select[Any]:
        """``query`` reading its rows under their row lock on PostgreSQL (SQLite's write lock serialises anyway)."""
        return query.with_for_update() if self.dialect == "postgresql" else query


def upsert(table: sa.Table, dialect: str) -> Any:
    """An INSERT into ``table`` in ``dialect`` (``postgresql`` or ``sqlite``), with ``on_conflict_do_nothing`` /
    ``_update``: for code that has a connection but no :class:`Database` (a migration's)."""
    return (postgresql.insert if dialect == "postgresql" else sqlite.insert)(table)


class StorePart:
    """A part of the store over ``database`` (``store.transitions``, ``store.calls``, ``store.funnels``,
    ``store.nodes``): each of its methods takes an optional ``connection`` and runs through :meth:`Database.run`,
    so it joins the caller's transaction when given one and commits on its own otherwise."""

    def __init__(self, database: Database) -> None:
        self.database = database
