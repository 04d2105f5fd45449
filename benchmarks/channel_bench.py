"""Channel-fed route vs a fair floor: messages per second from a RabbitMQ queue into the store, acked after commit.

    python benchmarks/channel_bench.py [--count 5000] [--repeat 3] [--databases sqlite,postgres]
                                       [--sides floor,accept,process]

Both sides start with ``count`` persistent JSON messages (distinct message ids) in a fresh queue and stop when every
one is stored and acked:

* the **floor**: a bare aio-pika consumer (prefetch = the engine's ``queue_size + concurrency``) that parses each
  body as JSON, inserts the same ``message`` rows (with their ``message_transition`` row, through the store's own
  batch insert, ``INSERT ... ON CONFLICT DO NOTHING``), groups the inserts per commit as the deliveries arrive (up to
  the engine's ``write_batch``, in one writer thread), and acks each delivery after its commit;
* the **route**: ``openroute``'s channel-fed route on one engine node (default settings), through
  :class:`~openroute.inbound.channel.ChannelInbound` (parse, route checks and extraction, ``Engine.accept`` on the
  group-commit writer, ack after the commit).

Both sides set the garbage collector as ``openroute run`` does once it serves (``openroute.runtime.collector``:
start-up's objects frozen, a wider young generation; undone after the side, so the runs stay independent): a
collection then walks only what consuming creates, as in a served node.

Three sides, interleaved in every repetition (the floor first, the two route sides alternating):

* ``floor``, above;
* ``accept``: the route with the engine accepting only (no workers started, as in ``http_bench.py``): the same
  database work as the floor, the comparison the issue asks for;
* ``process``: the route while the engine also processes every message (claim, trivial step, OK: two more writes
  per message), as ``openroute run`` does; the time is until every message is accepted and acked.

It prints msgs/s and the ratios to the floor (min / median / max) with the load average.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import aio_pika  # noqa: E402
from openroute.persistence import MessageStore, NewMessage  # noqa: E402

from openroute.engine import Engine, EngineSettings  # noqa: E402
from openroute.inbound.channel import ChannelInbound  # noqa: E402
from openroute.runtime import collector  # noqa: E402
from tests.channels.amqp_helpers import delete, unique  # noqa: E402
from tests.channels.channel_app import app as application  # noqa: E402

AMQP = "amqp://guest:guest@127.0.0.1:5672/"
POSTGRES_ADMIN = "postgresql+psycopg://postgres@127.0.0.1:5432/test"


async def fill(queue: str, count: int) -> None:
    connection = await aio_pika.connect(AMQP)
    channel = await connection.channel(publisher_confirms=True)
    await channel.declare_queue(queue, durable=True)
    for start in range(0, count, 500):
        await asyncio.gather(*(
            channel.default_exchange.publish(aio_pika.Message(
                json.dumps({"customer": {"id": f"C{i}"}}).encode(), content_type="application/json",
                message_id=f"m-{i}", delivery_mode=aio_pika.DeliveryMode.PERSISTENT), routing_key=queue)
            for i in range(start, min(start + 500, count))))
    await connection.close()


def fresh_database(kind: str, folder: Path, index: int) -> str:
    if kind == "sqlite":
        url = f"sqlite:///{folder / f'bench-{index}.db'}"
    else:
        import sqlalchemy as sa

        admin = sa.create_engine(POSTGRES_ADMIN, isolation_level="AUTOCOMMIT")
        name = f"openroute_chbench_{index}_{int(time.time() * 1000) % 10**8}"
        with admin.connect() as connection:
            connection.execute(sa.text(f'CREATE DATABASE "{name}"'))
        admin.dispose()
        url = POSTGRES_ADMIN.rsplit("/", 1)[0] + "/" + name
    store = MessageStore(url)
    store.create_schema()
    store.dispose()
    return url


async def floor(url: str, queue: str, count: int, settings: EngineSettings) -> float:
    store = MessageStore(url)
    loop = asyncio.get_running_loop()
    pending: list[tuple[NewMessage, aio_pika.abc.AbstractIncomingMessage]] = []
    ready = threading.Condition()
    done = asyncio.Event()
    stored = 0

    def writer() -> None:
        while True:
            with ready:
                while not pending:
                    ready.wait()
                batch = pending[: settings.write_batch]
                del pending[: len(batch)]
            if batch[0][0] is None:  # type: ignore[comparison-overlap]
                return
            store.insert_messages([new for new, _ in batch], node_id="floor")
            COMMITS["floor"] += 1
            loop.call_soon_threadsafe(acknowledge, [incoming for _, incoming in batch])

    def acknowledge(deliveries: list[aio_pika.abc.AbstractIncomingMessage]) -> None:
        async def ack_all() -> None:
            nonlocal stored
            await asyncio.gather(*(incoming.ack() for incoming in deliveries))
            stored += len(deliveries)
            if stored >= count:
                done.set()

        acks.add(asyncio.ensure_future(ack_all()))

    acks: set[asyncio.Future[None]] = set()
    thread = threading.Thread(target=writer, daemon=True)
    thread.start()
    connection = await aio_pika.connect(AMQP)
    channel = await connection.channel()
    await channel.set_qos(prefetch_count=settings.queue_size + settings.concurrency)
    declared = await channel.declare_queue(queue, durable=True)

    async def on_message(incoming: aio_pika.abc.AbstractIncomingMessage) -> None:
        text = incoming.body.decode("utf-8")
        document = json.loads(text)
        new = NewMessage(service="crm", operation="setCustomer", payload=text, content_type="application/json",
                         correlation_id=incoming.message_id or "", source_system="CRM",
                         receive_ts=datetime.now(UTC),
                         headers={"endpoint": "channel"}, object_id=document["customer"]["id"],
                         entity_type="setCustomer")
        with ready:
            pending.append((new, incoming))
            ready.notify()

    started = time.perf_counter()
    await declared.consume(on_message)
    with collector.serving():  # the same collector treatment as the route's (as `openroute run` serves)
        await done.wait()
        elapsed = time.perf_counter() - started
    with ready:
        pending.append((None, None))  # type: ignore[arg-type]
        ready.notify()
    thread.join(10)
    await connection.close()
    store.dispose()
    return count / elapsed


async def route(url: str, queue: str, count: int, process: bool = True) -> float:
    """The channel-fed route; without ``process`` the engine only accepts (no workers started, as in http_bench.py):
    the same database work as the floor."""
    store = MessageStore(url)
    engine = Engine(store, application.routes, EngineSettings(repoll_interval=None))
    channels = ChannelInbound(engine, application.channels, {
        "openroute.messaging.connector.amqp.url": AMQP,
        "openroute.messaging.incoming.crm-in.connector": "amqp",
        "openroute.messaging.incoming.crm-in.queue": queue,
        "openroute.messaging.incoming.crm-in.source-system": "CRM",
    }, environ={})
    if process:
        await engine.start()
    stats = channels.stats("crm-in")
    started = time.perf_counter()
    await channels.start()
    with collector.serving():  # as `openroute run` serves (undone after the run, so the runs stay independent)
        while stats.accepted < count:
            await asyncio.sleep(0.005)
        elapsed = time.perf_counter() - started
    COMMITS["process" if process else "accept"] += engine._pipeline.writer.transactions  # a benchmark may look inside
    await channels.stop()
    await engine.stop()
    store.dispose()
    return count / elapsed


SIDES = ("floor", "accept", "process")
#: commits of each side's last run (the route's: every writer transaction, claims and outcomes included)
COMMITS = dict.fromkeys(SIDES, 0)


async def run_side(side: str, url: str, queue: str, count: int, settings: EngineSettings) -> float:
    if side == "floor":
        return await floor(url, queue, count, settings)
    return await route(url, queue, count, process=side == "process")


def spread(values: list[float], digits: int = 2) -> str:
    return " / ".join(f"{value:.{digits}f}" for value in (min(values), statistics.median(values), max(values)))


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--count", type=int, default=5000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--databases", default="sqlite,postgres")
    parser.add_argument("--sides", default=",".join(SIDES), help="floor, accept (the route, engine accepting "
                        "only: the floor's work) and process (the route while the engine processes)")
    args = parser.parse_args()
    sides = [side for side in SIDES if side in args.sides.split(",")]
    folder = Path(tempfile.mkdtemp(prefix="openroute-chbench-"))
    settings = EngineSettings()
    index = 0
    print(f"load average at start {os.getloadavg()[0]:.2f}", flush=True)
    for kind in args.databases.split(","):
        rates: dict[str, list[float]] = {side: [] for side in sides}
        cpu: dict[str, list[float]] = {side: [] for side in sides}
        for repetition in range(args.repeat):
            order = sides if repetition % 2 == 0 else [sides[0], *reversed(sides[1:])]  # floor first, then alternate
            for side in order:
                index += 1
                url = fresh_database(kind, folder, index)
                queue = unique(f"bench-{side}")
                await fill(queue, args.count)
                try:
                    before = time.process_time()  # this process's CPU, every thread (the writer's too)
                    COMMITS[side] = 0
                    rates[side].append(await run_side(side, url, queue, args.count, settings))
                    cpu[side].append((time.process_time() - before) / args.count * 1e6)
                finally:
                    await delete(AMQP, queue)
            line = "   ".join(f"{side} {rates[side][-1]:6.0f} msgs/s {cpu[side][-1]:4.0f} µs CPU/msg "
                               f"{args.count / max(COMMITS[side], 1):5.1f} msgs/commit" for side in sides)
            ratios = "   ".join(f"{side}/floor {rates[side][-1] / rates['floor'][-1]:.2f}" for side in sides[1:]
                               if "floor" in rates)
            print(f"{kind}: {line}   {ratios}   load {os.getloadavg()[0]:.2f}", flush=True)
        for side in sides:
            summary = (f"{kind}: {side:<8} msgs/s min / median / max {spread(rates[side], 0)}, CPU µs/msg "
                       f"{spread(cpu[side], 0)}")
            if side != "floor" and "floor" in rates:
                ratio = [r / f for r, f in zip(rates[side], rates["floor"], strict=True)]
                summary += f"   {side} / floor {spread(ratio)}"
            print(summary, flush=True)
    print(f"load average at end {os.getloadavg()[0]:.2f}", flush=True)

if __name__ == "__main__":
    asyncio.run(main())
