"""RabbitMQ helpers of the channel tests: unique queues, publishing with message ids, counting what is left."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable
from typing import Any

import aio_pika


def unique(prefix: str) -> str:
    """A queue name no other test (or helper running tests at the same time) uses."""
    return f"openroute-test-{prefix}-{uuid.uuid4().hex[:10]}"


async def publish(url: str, queue: str, messages: Iterable[tuple[Any, str | None]], *,
                  content_type: str = "application/json", headers: dict[str, Any] | None = None) -> None:
    """Publish ``(body, message id)`` pairs (a dict body as JSON) to ``queue`` with publisher confirms."""
    connection = await aio_pika.connect(url)
    try:
        channel = await connection.channel(publisher_confirms=True)
        await channel.declare_queue(queue, durable=True)
        for body, message_id in messages:
            data = json.dumps(body).encode() if isinstance(body, dict) else (
                body.encode() if isinstance(body, str) else body)
            await channel.default_exchange.publish(
                aio_pika.Message(data, content_type=content_type, message_id=message_id, headers=headers or {},
                                 delivery_mode=aio_pika.DeliveryMode.PERSISTENT), routing_key=queue)
    finally:
        await connection.close()


async def ready(url: str, queue: str) -> int:
    """Messages ready in ``queue`` (not counting those delivered and not yet settled)."""
    connection = await aio_pika.connect(url)
    try:
        channel = await connection.channel()
        declared = await channel.declare_queue(queue, passive=True)
        return int(declared.declaration_result.message_count or 0)
    finally:
        await connection.close()


async def take_all(url: str, queue: str) -> list[aio_pika.abc.AbstractIncomingMessage]:
    """Every message ready in ``queue``, acked (for the dead-letter queue's checks)."""
    connection = await aio_pika.connect(url)
    taken = []
    try:
        channel = await connection.channel()
        declared = await channel.declare_queue(queue, passive=True)
        while (message := await declared.get(fail=False)) is not None:
            await message.ack()
            taken.append(message)
        return taken
    finally:
        await connection.close()


async def delete(url: str, *queues: str) -> None:
    connection = await aio_pika.connect(url)
    try:
        channel = await connection.channel()
        for queue in queues:
            await channel.queue_delete(queue)
    finally:
        await connection.close()
