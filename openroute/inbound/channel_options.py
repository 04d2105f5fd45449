"""The route-binding attributes of one incoming channel (``openroute.messaging.incoming.<channel>.*`` beside the
connector's own): read by :class:`~openroute.inbound.channel.ChannelInbound` for each delivery and described by the
AsyncAPI document (:mod:`openroute.inbound.asyncapi`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from openroute.definitions.errors import ConfigurationError, DeploymentError
from openroute.messaging.config import ChannelConfig

__all__ = ["ChannelOptions"]


@dataclass(frozen=True)
class ChannelOptions:
    """The route-binding attributes of one incoming channel (beside its connector's own attributes)."""

    #: the source system of every delivery without a ``source_system_header`` (None: the header is required)
    source_system: str | None = None
    source_system_header: str = "x-source-system"
    #: a header holding the correlation id; None: the broker message id (AMQP ``message_id``)
    correlation_header: str | None = None
    process_header: str = "x-process-id"
    timestamp_header: str = "x-message-timestamp"
    #: an outgoing channel that receives deliveries that do not validate (with the reason header)
    dead_letter_channel: str | None = None
    #: how a body without a telling content type is read
    format: Literal["auto", "json", "xml"] = "auto"
    #: first and longest pause of the channels after a store failure (seconds; doubled per failure)
    backoff: float = 0.5
    max_backoff: float = 30.0
    #: accepts in flight at once (the prefetch follows it); None: the engine's queue_size + concurrency
    concurrency: int | None = None

    @classmethod
    def of(cls, config: ChannelConfig) -> ChannelOptions:
        """The options in ``config``'s attributes; raises :class:`DeploymentError` naming the channel."""
        try:
            chosen = (config.get_str("format", "auto") or "auto").lower()
            if chosen not in ("auto", "json", "xml"):
                raise ConfigurationError(f"attribute 'format' must be auto, json or xml, got {chosen!r}")
            backoff = config.get_float("backoff", 0.5) or 0.5
            max_backoff = config.get_float("max-backoff", 30.0) or 30.0
            if backoff <= 0 or max_backoff < backoff:
                raise ConfigurationError("attributes 'backoff' / 'max-backoff' must be positive, max >= backoff")
            concurrency = config.get_int("concurrency")
            if concurrency is not None and concurrency < 1:
                raise ConfigurationError(f"attribute 'concurrency' must be positive, got {concurrency}")
            if (config.get_str("failure-strategy", "dead-letter") or "").lower() == "requeue":
                raise ConfigurationError("failure-strategy 'requeue' would requeue an invalid delivery forever: "
                                         "use a dead-letter-channel (the store's failures are requeued anyway)")
            return cls(
                source_system=config.get_str("source-system"),
                source_system_header=(config.get_str("source-system-header") or cls.source_system_header).lower(),
                correlation_header=(config.get_str("correlation-header") or "").lower() or None,
                process_header=(config.get_str("process-header") or cls.process_header).lower(),
                timestamp_header=(config.get_str("timestamp-header") or cls.timestamp_header).lower(),
                dead_letter_channel=config.get_str("dead-letter-channel"),
                format=chosen,  # type: ignore[arg-type]
                backoff=backoff,
                max_backoff=max_backoff,
                concurrency=concurrency,
            )
        except (ConfigurationError, DeploymentError) as error:
            raise DeploymentError(f"incoming channel '{config.channel}': {error}") from None
