"""Reactive Streams protocol and the Reactive Streams Operators builders (stdlib only).

``from openroute import streams as rs`` then ``await rs.of(1, 2, 3).map(str).to_list()``.
"""

from .builders import Collector, CompletionRunner, ProcessorBuilder, PublisherBuilder, SubscriberBuilder
from .factories import (
    builder,
    concat,
    coupled,
    empty,
    failed,
    from_async_iterable,
    from_completion_stage,
    from_completion_stage_nullable,
    from_iterable,
    from_processor,
    from_publisher,
    from_subscriber,
    generate,
    iterate,
    of,
    of_nullable,
)
from .protocol import UNBOUNDED, Processor, Publisher, StreamCancelledError, Subscriber, Subscription
from .subscribers import CompletionSubscriber

__all__ = [
    "UNBOUNDED",
    "Collector",
    "CompletionRunner",
    "CompletionSubscriber",
    "Processor",
    "ProcessorBuilder",
    "Publisher",
    "PublisherBuilder",
    "StreamCancelledError",
    "Subscriber",
    "SubscriberBuilder",
    "Subscription",
    "builder",
    "concat",
    "coupled",
    "empty",
    "failed",
    "from_async_iterable",
    "from_completion_stage",
    "from_completion_stage_nullable",
    "from_iterable",
    "from_processor",
    "from_publisher",
    "from_subscriber",
    "generate",
    "iterate",
    "of",
    "of_nullable",
]
