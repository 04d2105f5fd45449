"""Route steps the pattern tests share."""

from __future__ import annotations

from collections.abc import Callable

from openroute import Exchange


def failing_first_attempt_of(correlation_id: str, error: Exception, ran: list[str]) -> Callable[[Exchange], None]:
    """A step that appends each message's correlation id to ``ran`` and raises ``error`` in the first attempt of
    the message ``correlation_id`` (its later attempts and every other message succeed)."""

    def step(exchange: Exchange) -> None:
        ran.append(exchange.message.correlation_id)
        if exchange.message.correlation_id == correlation_id and exchange.message.failed_count == 0:
            raise error

    return step
