"""What the benchmarks share: their command line, fresh databases, concurrent senders and min / median / max."""

from __future__ import annotations

import argparse
import asyncio
import socket
import statistics
import subprocess
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import sqlalchemy as sa
from openroute.persistence import MessageStore

#: the local test server; a benchmark's fresh PostgreSQL databases are made on it unless it names another
POSTGRES_ADMIN_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"


def arguments(
    doc: str, *, count: int, repeat: int = 3, senders: int | None = None, databases: str | None = None
) -> argparse.ArgumentParser:
    """The command line of a benchmark: described by the first line of its docstring ``doc``, with ``--count``
    and ``--repeat`` (the interleaved repetitions), and ``--senders`` and ``--databases`` where a default is
    given. The caller adds its own options and parses."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--count", type=int, default=count)
    parser.add_argument("--repeat", type=int, default=repeat)
    if senders is not None:
        parser.add_argument("--senders", type=int, default=senders)
    if databases is not None:
        parser.add_argument("--databases", default=databases)
    return parser


@contextmanager
def fresh_database(
    kind: str, prefix: str, folder: Path | None = None, admin_url: str = POSTGRES_ADMIN_URL
) -> Iterator[str]:
    """The URL of a new database with the store's schema, removed on exit: a SQLite file in ``folder`` (default:
    the temporary directory) when ``kind`` is ``"sqlite"``, otherwise a PostgreSQL database made on the server of
    ``admin_url`` (dropped with FORCE). ``prefix`` starts its name."""
    admin: sa.Engine | None = None
    if kind == "sqlite":
        path = (folder or Path(tempfile.gettempdir())) / f"{prefix}-{uuid.uuid4().hex[:8]}.db"
        url = f"sqlite:///{path}"
    else:
        name = f"{prefix}_{uuid.uuid4().hex[:10]}"
        admin = sa.create_engine(admin_url, isolation_level="AUTOCOMMIT")
        with admin.connect() as connection:
            connection.exec_driver_sql(f'CREATE DATABASE "{name}"')
        url = sa.make_url(admin_url).set(database=name).render_as_string(hide_password=False)
    try:
        store = MessageStore(url)
        store.create_schema()
        store.dispose()
        yield url
    finally:
        if admin is None:
            for suffix in ("", "-wal", "-shm"):
                Path(f"{path}{suffix}").unlink(missing_ok=True)
        else:
            with admin.connect() as connection:
                connection.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            admin.dispose()


async def concurrently(count: int, senders: int, send: Callable[[int], Awaitable[object]]) -> None:
    """Awaits ``send(0)`` .. ``send(count - 1)`` from ``senders`` concurrent tasks; each task takes the next number
    once its previous call returned."""
    numbers = iter(range(count))

    async def sender() -> None:
        for number in numbers:
            await send(number)

    await asyncio.gather(*(sender() for _ in range(senders)))


def spread(values: list[float], digits: int = 0) -> str:
    """``min / median / max`` of ``values`` with ``digits`` decimals."""
    return f"{min(values):.{digits}f} / {statistics.median(values):.{digits}f} / {max(values):.{digits}f}"


def free_port() -> int:
    """A loopback port free now, for a server a benchmark starts."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_for_port(port: int, process: subprocess.Popen[bytes], timeout: float = 30) -> None:
    """Return once ``process`` accepts connections on ``port``; RuntimeError if it exits, TimeoutError after
    ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"server exited with {process.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"server on port {port} did not start")
