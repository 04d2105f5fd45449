"""A verification kit for Reactive Streams implementations, in the spirit of the spec's TCK (plain asyncio).

Pass it a factory and it checks every applicable rule; a failed check raises :class:`AssertionError` whose
message starts with the rule number::

    from openroute.streams.tck import verify_publisher
    await verify_publisher(lambda n: MyPublisher(range(n)))

``make_publisher(n)`` must return a fresh publisher of exactly ``n`` elements followed by completion. Each
rule is also a method of :class:`PublisherVerification` / :class:`SubscriberVerification` /
:class:`ProcessorVerification` named after it (``rule_1_9_...``), so a test suite can run one rule per test.

Waits are bounded by ``timeout``. Checks that something does *not* happen (rule 1.1: no element beyond the
demand) wait ``quiet_timeout`` for a signal that must not come.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from ..protocol import Processor, Publisher, Subscriber
from .probes import ProbeSubscriber, RuleNotApplicable, rule_names, run_all
from .processor import ProcessorVerification
from .publisher import PublisherVerification
from .subscriber import SubscriberVerification

__all__ = [
    "ProbeSubscriber",
    "ProcessorVerification",
    "PublisherVerification",
    "RuleNotApplicable",
    "SubscriberVerification",
    "rule_names",
    "verify_processor",
    "verify_publisher",
    "verify_subscriber",
]


async def verify_publisher(
    make_publisher: Callable[[int], Publisher[Any] | Awaitable[Publisher[Any]]],
    *,
    max_elements: int | None = None,
    make_failed_publisher: Callable[[], Publisher[Any]] | None = None,
    completes: bool = True,
    timeout: float = 5.0,
) -> list[str]:
    """Check every publisher rule; returns the rules that did not apply, raises AssertionError on a violation."""
    return await run_all(
        PublisherVerification(
            make_publisher, max_elements=max_elements, make_failed_publisher=make_failed_publisher,
            completes=completes, timeout=timeout,
        )
    )


async def verify_subscriber(
    make_subscriber: Callable[[], Subscriber[Any]], *, requests_on_subscribe: bool = True, timeout: float = 5.0
) -> list[str]:
    """Check every subscriber rule; returns the rules that did not apply, raises AssertionError on a violation."""
    return await run_all(
        SubscriberVerification(make_subscriber, requests_on_subscribe=requests_on_subscribe, timeout=timeout)
    )


async def verify_processor(
    make_processor: Callable[[], Processor[Any, Any]], *, recovers: bool = False, timeout: float = 5.0
) -> list[str]:
    """Check the processor rules (4.1 through every publisher and subscriber rule, 4.2); raises AssertionError."""
    return await run_all(ProcessorVerification(make_processor, recovers=recovers, timeout=timeout))
