"""The database under the store (``persistence/database.py``): SQLite's file settings, PostgreSQL's ping of an idle
connection, the URLs it refuses."""

from __future__ import annotations

import pytest
import sqlalchemy as sa
from openroute.persistence import MessageStore, create_store_engine


def test_sqlite_file_uses_wal_and_busy_timeout(sqlite_url: str) -> None:
    store = MessageStore(sqlite_url)
    with store.engine.connect() as connection:
        assert connection.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
        assert connection.exec_driver_sql("PRAGMA busy_timeout").scalar() == 30000
    store.dispose()


def _pings(engine: sa.Engine, monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """The connections ``engine``'s dialect pings from now on (recorded, then pinged)."""
    pinged: list[object] = []
    ping = engine.dialect.do_ping

    def recording(dbapi_connection: object) -> bool:
        pinged.append(dbapi_connection)
        return ping(dbapi_connection)

    monkeypatch.setattr(engine.dialect, "do_ping", recording)
    return pinged


def test_a_postgresql_connection_is_pinged_only_after_it_sat_idle(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    busy = create_store_engine(postgres_url, pool_size=1)
    pinged = _pings(busy, monkeypatch)
    for _ in range(3):  # a fresh connection, then one back from the pool within the idle time
        with busy.connect() as connection:
            connection.exec_driver_sql("SELECT 1")
    assert pinged == []
    busy.dispose()

    idle = create_store_engine(postgres_url, pool_size=1, ping_after_idle=0.0)  # every connection counts as idle
    pinged = _pings(idle, monkeypatch)
    with idle.connect() as connection:
        backend = connection.exec_driver_sql("SELECT pg_backend_pid()").scalar_one()
    with idle.connect() as connection:  # pinged, and the same connection (alive)
        assert connection.exec_driver_sql("SELECT pg_backend_pid()").scalar_one() == backend
    assert len(pinged) == 2
    killer = sa.create_engine(postgres_url)
    with killer.connect() as connection:  # the database drops the pooled connection while it is idle
        connection.exec_driver_sql(f"SELECT pg_terminate_backend({backend})")
    killer.dispose()
    with idle.connect() as connection:  # the ping finds it dead: the pool hands out a new one, no error
        assert connection.exec_driver_sql("SELECT pg_backend_pid()").scalar_one() != backend
    idle.dispose()


@pytest.mark.parametrize("url", ["sqlite://", "sqlite:///:memory:", "mysql://u@h/db"])
def test_unusable_urls_are_refused(url: str) -> None:
    with pytest.raises(ValueError):
        MessageStore(url)
