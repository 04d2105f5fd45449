"""Channel-fed route vs a fair floor: messages per second from a RabbitMQ queue into the store, acked after commit.

    python benchmarks/channel_bench.py [--count 5000] [--repeat 3] [--databases sqlite,postgres]

Both sides start with ``count`` persistent JSON messages (distinct message ids) in a fresh queue and stop when every
one is stored and acked:

* the **floor**: a bare aio-pika consumer (prefetch = the engine's ``queue_size + concurrency``) that parses each
  body as JSON, inserts the same ``message`` rows (with their ``message_transition`` row, through the store's own
  batch insert, ``INSERT ... ON CONFLICT DO NOTHING``), groups the inserts per commit as the deliveries arrive (up to
  the engine's ``write_batch``, in one writer thread), and acks each delivery after its commit;
* the **route**: ``openroute``'s channel-fed route on one engine node (default settings), through
  :class:`~openroute.inbound.channel.ChannelInbound` (parse, route checks and extraction, ``Engine.accept`` on the
  group-commit writer, ack after the commit). The engine also processes every message (claim, trivial step, OK)
  while it accepts, as it would in production; the floor does not.

Repetitions interleave floor and route; it prints msgs/s and the ratio route / floor (min / median / max).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import aio_pika  # noqa: E402
from openroute.persistence import MessageStore, NewMessage  # noqa: E402

from benchmarks._common import fresh_database  # noqa: E402
from openroute.engine import Engine, EngineSettings  # noqa: E402
from openroute.inbound.channel import ChannelInbound  # noqa: E402
from tests.channels.amqp_helpers import delete, unique  # noqa: E402
from tests.channels.channel_app import app as application  # noqa: E402

AMQP = "amqp://guest:guest@127.0.0.1:5672/"


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
    await done.wait()
    elapsed = time.perf_counter() - started
    with ready:
        pending.append((None, None))  # type: ignore[arg-type]
        ready.notify()
    thread.join(10)
    await connection.close()
    store.dispose()
    return count / elapsed


async def route(url: str, queue: str, count: int) -> float:
    store = MessageStore(url)
    engine = Engine(store, application.routes, EngineSettings(repoll_interval=None))
    channels = ChannelInbound(engine, application.channels, {
        "openroute.messaging.connector.amqp.url": AMQP,
        "openroute.messaging.incoming.crm-in.connector": "amqp",
        "openroute.messaging.incoming.crm-in.queue": queue,
        "openroute.messaging.incoming.crm-in.source-system": "CRM",
    }, environ={})
    await engine.start()
    stats = channels.stats("crm-in")
    started = time.perf_counter()
    await channels.start()
    while stats.accepted < count:
        await asyncio.sleep(0.005)
    elapsed = time.perf_counter() - started
    await channels.stop()
    await engine.stop()
    store.dispose()
    return count / elapsed


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--count", type=int, default=5000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--databases", default="sqlite,postgres")
    args = parser.parse_args()
    settings = EngineSettings()
    for kind in args.databases.split(","):
        ratios, floors, routes = [], [], []
        for _ in range(args.repeat):
            results = {}
            for side in ("floor", "route"):
                with fresh_database(kind, "openroute_chbench") as url:
                    queue = unique(f"bench-{side}")
                    await fill(queue, args.count)
                    try:
                        results[side] = (await floor(url, queue, args.count, settings) if side == "floor"
                                         else await route(url, queue, args.count))
                    finally:
                        await delete(AMQP, queue)
            floors.append(results["floor"])
            routes.append(results["route"])
            ratios.append(results["route"] / results["floor"])
            print(f"{kind}: floor {results['floor']:8.0f} msgs/s   route {results['route']:8.0f} msgs/s   "
                  f"ratio {ratios[-1]:.2f}", flush=True)
        print(f"{kind}: ratio route / floor min {min(ratios):.2f} median {statistics.median(ratios):.2f} "
              f"max {max(ratios):.2f} (floor median {statistics.median(floors):.0f} msgs/s, route median "
              f"{statistics.median(routes):.0f} msgs/s)", flush=True)


if __name__ == "__main__":
    asyncio.run(main())
