"""Messaging throughput.

1. In memory: 200,000 messages emitter -> processor -> consumer, POST_PROCESSING acks (each send's future
   completes when the consumer acked the processor's output, which acks the emitter's message).
2. RabbitMQ: 50,000 messages published with publisher confirms and consumed with manual acks, with a bare
   aio-pika loop and through the amqp connector (same confirm window, same prefetch), interleaved ``--repeat``
   times (bare, connector, bare, ...); the ratios connector / bare are printed per repetition and as
   min / median / max.

Usage: python benchmarks/messaging_bench.py [--memory N] [--amqp N] [--repeat R] [--url URL] [--window W]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
import uuid

import aio_pika

from openroute.messaging import MessagingApp, OnOverflow


async def memory_pipeline(count: int, window: int) -> float:
    app = MessagingApp(environ={})
    emitter = app.emitter("in", OnOverflow.BUFFER, buffer_size=window)
    consumed = 0

    @app.incoming("in")
    @app.outgoing("out")
    def process(value: int) -> int:
        return value + 1

    @app.incoming("out")
    def consume(value: int) -> None:
        nonlocal consumed
        consumed += 1

    await app.start()
    started = time.perf_counter()
    for base in range(0, count, window):
        futures = [emitter.send(i) for i in range(base, min(base + window, count))]
        await asyncio.gather(*futures)
    elapsed = time.perf_counter() - started
    await app.stop()
    assert consumed == count, (consumed, count)
    return count / elapsed


async def bare_amqp(url: str, queue: str, count: int, window: int) -> tuple[float, float]:
    connection = await aio_pika.connect(url)
    publish_channel = await connection.channel(publisher_confirms=True, on_return_raises=True)
    await publish_channel.declare_queue(queue, durable=True)
    started = time.perf_counter()
    exchange = publish_channel.default_exchange
    for base in range(0, count, window):  # the same window of unconfirmed publishes as the connector's
        await asyncio.gather(*(exchange.publish(
            aio_pika.Message(str(i).encode(), content_type="application/json",
                             delivery_mode=aio_pika.DeliveryMode.PERSISTENT), queue)
            for i in range(base, min(base + window, count))))
    published = time.perf_counter() - started

    consume_channel = await connection.channel()
    await consume_channel.set_qos(prefetch_count=window)
    declared = await consume_channel.get_queue(queue)
    done = asyncio.Event()
    received = 0

    async def on_message(message: aio_pika.abc.AbstractIncomingMessage) -> None:
        nonlocal received
        int(message.body)
        await message.ack()
        received += 1
        if received == count:
            done.set()

    started = time.perf_counter()
    tag = await declared.consume(on_message)
    await done.wait()
    consumed = time.perf_counter() - started
    await declared.cancel(tag)
    await consume_channel.queue_delete(queue)
    await connection.close()
    return count / published, count / consumed


async def connector_amqp(url: str, queue: str, count: int, window: int) -> tuple[float, float]:
    publisher = MessagingApp({
        "openroute.messaging.outgoing.out.connector": "amqp",
        "openroute.messaging.outgoing.out.url": url,
        "openroute.messaging.outgoing.out.queue": queue,
        "openroute.messaging.outgoing.out.max-inflight": window,
    }, environ={})
    emitter = publisher.emitter("out", OnOverflow.BUFFER, buffer_size=window)
    await publisher.start()
    started = time.perf_counter()
    for base in range(0, count, window):
        await asyncio.gather(*(emitter.send(i) for i in range(base, min(base + window, count))))
    published = time.perf_counter() - started
    await publisher.stop()

    consumer = MessagingApp({
        "openroute.messaging.incoming.in.connector": "amqp",
        "openroute.messaging.incoming.in.url": url,
        "openroute.messaging.incoming.in.queue": queue,
    }, environ={})
    done = asyncio.Event()
    received = 0

    @consumer.incoming("in", concurrency=window)  # demand = window = the bare loop's prefetch
    def consume(value: int) -> None:
        nonlocal received
        received += 1
        if received == count:
            done.set()

    await consumer.start()  # connects and declares; consuming starts on the next loop turn
    started = time.perf_counter()
    await done.wait()
    consumed = time.perf_counter() - started
    await consumer.stop()
    connection = await aio_pika.connect(url)
    channel = await connection.channel()
    await channel.queue_delete(queue)
    await connection.close()
    return count / published, count / consumed


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--memory", type=int, default=200_000)
    parser.add_argument("--amqp", type=int, default=50_000)
    parser.add_argument("--repeat", type=int, default=3, help="interleaved repetitions of bare and connector")
    parser.add_argument("--window", type=int, default=256, help="confirm window / prefetch / emitter batch")
    parser.add_argument("--url", default=os.environ.get("OPENROUTE_TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/"))
    args = parser.parse_args()

    if args.memory > 0:
        rate = await memory_pipeline(args.memory, 1000)
        print(f"memory  emitter->processor->consumer  {args.memory:>7} msgs  {rate:>10,.0f} msgs/s "
              "(POST_PROCESSING acks)")
    if args.amqp <= 0:
        return
    ratios: dict[str, list[float]] = {"publish": [], "consume": [], "overall": []}
    for repetition in range(1, args.repeat + 1):
        prefix = f"openroute-bench-{uuid.uuid4().hex[:8]}"
        bare_pub, bare_con = await bare_amqp(args.url, f"{prefix}-bare", args.amqp, args.window)
        conn_pub, conn_con = await connector_amqp(args.url, f"{prefix}-conn", args.amqp, args.window)
        bare_total = 2 / (1 / bare_pub + 1 / bare_con)
        conn_total = 2 / (1 / conn_pub + 1 / conn_con)
        ratios["publish"].append(conn_pub / bare_pub)
        ratios["consume"].append(conn_con / bare_con)
        ratios["overall"].append(conn_total / bare_total)
        print(f"amqp #{repetition}  publish bare {bare_pub:>7,.0f} connector {conn_pub:>7,.0f} msgs/s "
              f"({conn_pub / bare_pub:.2f}x)   consume bare {bare_con:>7,.0f} connector {conn_con:>7,.0f} msgs/s "
              f"({conn_con / bare_con:.2f}x)   overall (harmonic mean) {conn_total / bare_total:.2f}x", flush=True)
    for kind, values in ratios.items():
        print(f"amqp    {kind:<8} connector / bare min {min(values):.2f} median {statistics.median(values):.2f} "
              f"max {max(values):.2f} ({len(values)} repetitions, {args.amqp} msgs each; goal >= 0.9)")

if __name__ == "__main__":
    asyncio.run(main())
