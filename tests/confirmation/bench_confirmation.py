"""Benchmark: confirmations per second through the persisted ConfirmationService to a local receiver.

Run: ``python -m tests.confirmation.bench_confirmation [N]`` (default N=500). Prints figures, asserts nothing
about time. Uses a SQLite file and, if reachable, the local PostgreSQL (a throw-away database).
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

import sqlalchemy as sa
from openroute.confirmation import (
    ConfirmationRequest,
    ConfirmationService,
    DelegateConfirmationCallback,
    HttpJsonConfirmation,
    SoapConfirmation,
)
from openroute.persistence import MessageState, MessageStore, NewMessage

from tests.confirmation.receiver import Receiver, ServerThread
from tests.services import POSTGRES_ADMIN_URL, postgres_problem


def fill(store: MessageStore, n: int) -> list[int]:
    now = datetime.now(UTC)
    ids = []
    with store.begin() as connection:
        for i in range(n):
            mid = store.insert_message(
                NewMessage(service="s", operation="o", payload="{}", content_type="application/json",
                           correlation_id=f"c{i}", source_system="CRM", receive_ts=now),
                connection,
            ).message.id
            store.transitions.apply((mid, 0, MessageState.NEW, MessageState.OK, now, {}), connection)
            ids.append(mid)
    return ids


async def one_run(url: str, kind: str, n: int, receiver: Receiver) -> None:
    store = MessageStore(url)
    store.create_schema()
    ids = fill(store, n)
    system = (SoapConfirmation("CRM", receiver.url + "/soap") if kind == "soap"
              else HttpJsonConfirmation("CRM", receiver.url + "/json"))
    callback = DelegateConfirmationCallback([system])
    service = ConfirmationService(store, callback, concurrency=16)
    receiver.reset()
    try:
        started = time.perf_counter()
        for mid in ids:
            await service.enqueue(ConfirmationRequest(message_id=mid, correlation_id="c", source_system="CRM",
                                                      state="OK"))
        enqueued = time.perf_counter()
        report = await service.process_due()
        done = time.perf_counter()
    finally:
        await callback.aclose()
        store.dispose()
    assert report.sent == n and len(receiver.snapshot()) == n, (report, len(receiver.snapshot()))
    print(f"{store.dialect:10s} {kind:4s} n={n}: enqueue {n / (enqueued - started):8.0f}/s, "
          f"send+record {n / (done - enqueued):8.0f}/s")


async def main(n: int) -> None:
    receiver = Receiver()
    server = ServerThread(receiver)
    server.start()
    receiver.url = f"http://127.0.0.1:{server.port}"
    admin = None
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for kind in ("json", "soap"):
                await one_run(f"sqlite:///{Path(tmp) / f'{kind}.db'}", kind, n, receiver)
        if postgres_problem() is None:
            admin = sa.create_engine(POSTGRES_ADMIN_URL, isolation_level="AUTOCOMMIT")
            for kind in ("json", "soap"):
                name = f"openroute_b_{uuid.uuid4().hex[:12]}"
                with admin.connect() as connection:
                    connection.execute(sa.text(f'CREATE DATABASE "{name}"'))
                try:
                    await one_run(POSTGRES_ADMIN_URL.rsplit("/", 1)[0] + f"/{name}", kind, n, receiver)
                finally:
                    with admin.connect() as connection:
                        connection.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        else:
            print("PostgreSQL not reachable: skipped")
    finally:
        if admin is not None:
            admin.dispose()
        server.stop()


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]) if len(sys.argv) > 1 else 500))
