"""Messaging throughput.

1. In memory: 200,000 messages emitter -> processor -> consumer, POST_PROCESSING acks (each send's future
   completes when the consumer acked the processor's output, which acks the emitter's message).
2. RabbitMQ: 50,000 messages published with publisher confirms and consumed with manual acks, with a bare
   aio-pika loop and through the amqp connector (same confirm window, same prefetch), interleaved ``--repeat``
   times (bare, connector, bare, ...); the ratios connector / bare are printed per repetition and as
   min / median / max.

3. With ``--cpu N``: the process CPU time per message of the same consume and publish loops, bare and connector,
   against broker-free fakes that keep the broker's flow (prefetch window, a task per delivery, an ack or confirm
   one writer step later); best of ``--repeat``. Load-independent enough to compare changes on a busy machine.

Usage: python benchmarks/messaging_bench.py [--memory N] [--amqp N] [--repeat R] [--url URL] [--window W] [--cpu N]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import statistics
import time
import uuid
from collections.abc import Callable
from typing import Any

import aio_pika

from openroute.messaging import MessagingApp, OnOverflow
from openroute.messaging.amqp import AmqpConnector, AmqpSink, AmqpSource
from openroute.messaging.config import ChannelConfig


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


async def publish_through(app: MessagingApp, count: int, window: int, clock: Callable[[], float]) -> float:
    """Start ``app``, send 0..count-1 to its channel ``out`` in windows of ``window`` messages (each window awaited
    whole, as the bare loop's confirms), stop it; the ``clock`` time the sending took."""
    emitter = app.emitter("out", OnOverflow.BUFFER, buffer_size=window)
    await app.start()
    started = clock()
    for base in range(0, count, window):
        await asyncio.gather(*(emitter.send(i) for i in range(base, min(base + window, count))))
    elapsed = clock() - started
    await app.stop()
    return elapsed


async def connector_amqp(url: str, queue: str, count: int, window: int) -> tuple[float, float]:
    publisher = MessagingApp({
        "openroute.messaging.outgoing.out.connector": "amqp",
        "openroute.messaging.outgoing.out.url": url,
        "openroute.messaging.outgoing.out.queue": queue,
        "openroute.messaging.outgoing.out.max-inflight": window,
    }, environ={})
    published = await publish_through(publisher, count, window, time.perf_counter)

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


# -- CPU per message without a broker (load-independent-ish: process time, best of --repeat) -----------------------
class _FakeBroker:
    """Delivers ``count`` messages to one consumer callback as RabbitMQ would: at most ``prefetch`` unacked, a task per
    delivery (aiormq) and one for the callback (aio-pika); an ack is a write taken by a writer task."""

    def __init__(self, count: int) -> None:
        self.count, self.sent, self.unacked, self.acked, self.prefetch = count, 0, 0, 0, 0
        self.callback: Any = None
        self.outstanding: set[int] = set()  # delivered, not acked: what a basic.ack with multiple covers
        self.writes: asyncio.Queue[tuple[asyncio.Future[None], list[int]]] = asyncio.Queue()
        self.done = asyncio.Event()
        self.writer = asyncio.ensure_future(self._write())

    async def _write(self) -> None:
        while True:
            written, tags = await self.writes.get()
            for tag in tags:
                if tag in self.outstanding:
                    self.outstanding.discard(tag)
                    self.unacked -= 1
                    self.acked += 1
            written.set_result(None)
            if self.acked == self.count:
                self.done.set()
            self.pump()

    def pump(self) -> None:
        loop = asyncio.get_running_loop()
        while self.callback is not None and self.sent < self.count and self.unacked < self.prefetch:
            self.sent += 1
            self.unacked += 1
            self.outstanding.add(self.sent)
            loop.create_task(self._deliver(_FakeIncoming(self, self.sent)))

    async def _deliver(self, message: _FakeIncoming) -> None:
        await asyncio.get_running_loop().create_task(self.callback(message))

    # the AMQP channel and queue the connector's source uses
    is_closed = False

    async def basic_ack(self, delivery_tag: int, multiple: bool = False) -> None:
        """One write, as one ``basic.ack`` frame is: with ``multiple`` it covers every delivery up to the tag."""
        tags = [tag for tag in self.outstanding if tag <= delivery_tag] if multiple else [delivery_tag]
        written = asyncio.get_running_loop().create_future()
        await self.writes.put((written, tags))
        await written

    async def set_qos(self, prefetch_count: int, global_: bool = False) -> None:
        self.prefetch = prefetch_count
        self.pump()

    async def consume(self, callback: Any) -> str:
        self.callback = callback
        self.pump()
        return "fake"

    async def cancel(self, tag: str) -> None:
        self.callback = None


class _FakeIncoming:
    content_type, headers, exchange, routing_key = "application/json", None, "", "fake"
    correlation_id = message_id = None
    redelivered = False

    def __init__(self, broker: _FakeBroker, tag: int) -> None:
        self.broker, self.delivery_tag, self.body = broker, tag, str(tag).encode()
        self.channel = broker  # the connector acks through the channel (basic.ack with multiple)

    async def ack(self) -> None:
        await self.broker.basic_ack(self.delivery_tag)

    async def reject(self, requeue: bool = False) -> None:
        await self.ack()


class _FakeExchange:
    """Confirms each publish one writer step later."""

    def __init__(self) -> None:
        self.pending: asyncio.Queue[asyncio.Future[None]] = asyncio.Queue()
        self.confirmer = asyncio.ensure_future(self._confirm())

    async def _confirm(self) -> None:
        while True:
            (await self.pending.get()).set_result(None)

    async def publish(self, message: aio_pika.Message, routing_key: str) -> None:
        confirmed = asyncio.get_running_loop().create_future()
        self.pending.put_nowait(confirmed)
        await confirmed


async def fake_consume(count: int, window: int, connector: bool) -> float:
    broker = _FakeBroker(count)
    if not connector:
        async def on_message(message: _FakeIncoming) -> None:
            int(message.body)
            await message.ack()

        broker.prefetch = window
        started = time.process_time()
        broker.callback = on_message
        broker.pump()
        await broker.done.wait()
        return time.process_time() - started

    class FakeAmqp(AmqpConnector):
        async def create_publisher(self, config: ChannelConfig) -> AmqpSource:
            return AmqpSource(self, config, broker, broker)  # type: ignore[arg-type]

    app = MessagingApp({"openroute.messaging.incoming.in.connector": "fake-amqp",
                        "openroute.messaging.incoming.in.queue": "fake"}, environ={},
                       connectors={"fake-amqp": FakeAmqp()})

    @app.incoming("in", concurrency=window)
    def consume(value: int) -> None:
        pass

    await app.start()
    started = time.process_time()
    await broker.done.wait()
    elapsed = time.process_time() - started
    await app.stop()
    return elapsed


async def fake_publish(count: int, window: int, connector: bool) -> float:
    exchange = _FakeExchange()
    if not connector:
        started = time.process_time()
        for base in range(0, count, window):
            await asyncio.gather(*(exchange.publish(
                aio_pika.Message(str(i).encode(), content_type="application/json",
                                 delivery_mode=aio_pika.DeliveryMode.PERSISTENT), "fake")
                for i in range(base, min(base + window, count))))
        return time.process_time() - started

    class FakeAmqp(AmqpConnector):
        async def create_subscriber(self, config: ChannelConfig) -> AmqpSink:
            return AmqpSink(config, exchange, "fake")  # type: ignore[arg-type]

    app = MessagingApp({"openroute.messaging.outgoing.out.connector": "fake-amqp",
                        "openroute.messaging.outgoing.out.max-inflight": window}, environ={},
                       connectors={"fake-amqp": FakeAmqp()})
    return await publish_through(app, count, window, time.process_time)


async def _measured(run: Any, count: int, window: int, connector: bool) -> float:
    """Seconds of process time of one fake run; the fakes' own tasks are cancelled afterwards."""
    before = asyncio.all_tasks()
    elapsed: float = await run(count, window, connector)
    for task in asyncio.all_tasks() - before:
        task.cancel()
    await asyncio.sleep(0)
    return elapsed


async def cpu_per_message(count: int, window: int, repeat: int) -> None:
    """Best-of-``repeat`` process time per message, bare and connector interleaved, against the fakes above."""
    for name, run in (("consume", fake_consume), ("publish", fake_publish)):
        best = {"bare": float("inf"), "connector": float("inf")}
        for _ in range(repeat):
            for side in best:
                gc.collect()
                best[side] = min(best[side], await _measured(run, count, window, side == "connector") / count * 1e6)
        print(f"cpu     {name:<8} bare {best['bare']:6.1f} us/msg  connector {best['connector']:6.1f} us/msg  "
              f"(extra {best['connector'] - best['bare']:.1f} us/msg; broker-free fake, best of {repeat} x {count})",
              flush=True)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--memory", type=int, default=200_000)
    parser.add_argument("--amqp", type=int, default=50_000)
    parser.add_argument("--repeat", type=int, default=3, help="interleaved repetitions of bare and connector")
    parser.add_argument("--window", type=int, default=256, help="confirm window / prefetch / emitter batch")
    parser.add_argument("--cpu", type=int, default=0,
                        help="also: process CPU per message, bare vs connector, against broker-free fakes (N msgs)")
    parser.add_argument("--url", default=os.environ.get("OPENROUTE_TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/"))
    args = parser.parse_args()

    if args.memory > 0:
        rate = await memory_pipeline(args.memory, 1000)
        print(f"memory  emitter->processor->consumer  {args.memory:>7} msgs  {rate:>10,.0f} msgs/s "
              "(POST_PROCESSING acks)")
    if args.cpu > 0:
        await cpu_per_message(args.cpu, args.window, args.repeat)
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
