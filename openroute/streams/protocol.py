"""The four Reactive Streams interfaces (https://www.reactive-streams.org), as synchronous Python methods.

Signals are plain method calls. Asynchrony comes from whoever calls them (usually a task or a
``loop.call_soon`` callback on the running asyncio loop), never from the interfaces themselves.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, Final, Generic, TypeVar

T = TypeVar("T")
R = TypeVar("R")

#: Demand of ``2**63 - 1`` or more means "unbounded" (rule 3.17); demand is capped at this value.
UNBOUNDED: Final[int] = 2**63 - 1


class StreamCancelledError(Exception):
    """A closed graph was cancelled before it completed (the spec's ``CancellationException``).

    Distinct from :class:`asyncio.CancelledError`, which stays reserved for task cancellation.
    """


class Subscription(ABC):
    """One subscriber's link to one publisher: it carries demand upstream and cancellation."""

    @abstractmethod
    def request(self, n: int) -> None:
        """Add ``n`` to the demand; ``n <= 0`` makes the publisher signal ``on_error(ValueError)`` (rule 3.9)."""

    @abstractmethod
    def cancel(self) -> None:
        """Ask the publisher to stop signalling and to drop its reference to the subscriber; idempotent."""


class Subscriber(ABC, Generic[T]):
    """Receives ``on_subscribe`` once, then ``on_next`` at most as often as requested, then one terminal signal."""

    @abstractmethod
    def on_subscribe(self, subscription: Subscription) -> None:
        """First signal; the subscriber requests through ``subscription``."""

    @abstractmethod
    def on_next(self, item: T) -> None:
        """One element (never ``None``)."""

    @abstractmethod
    def on_error(self, error: BaseException) -> None:
        """Terminal signal: the stream failed with ``error``."""

    @abstractmethod
    def on_complete(self) -> None:
        """Terminal signal: the stream ended normally."""


class Publisher(ABC, Generic[T]):
    """A possibly unbounded source of elements, emitted according to the demand of each subscriber."""

    @abstractmethod
    def subscribe(self, subscriber: Subscriber[T]) -> None:
        """Start a subscription; ``None`` raises :class:`TypeError` (rule 1.9)."""


class Processor(Subscriber[T], Publisher[R], Generic[T, R]):
    """A processing stage: a subscriber to its upstream and a publisher to its downstream (rule 4.1)."""


def refuse_none(value: object, signal: str) -> None:
    """Rule 2.13: a ``None`` subscription, element or error is refused with :class:`TypeError`."""
    if value is None:
        raise TypeError(f"{signal}(None) (Reactive Streams rule 2.13)")


def first_subscription(held: Subscription | None, offered: Subscription) -> bool:
    """Rules 2.13 and 2.5 for the ``on_subscribe`` of a subscriber with one upstream: True to keep ``offered``;
    a second subscription while one is ``held`` is cancelled (False)."""
    refuse_none(offered, "on_subscribe")
    if held is not None:
        offered.cancel()
        return False
    return True


def signal_end(subscriber: Subscriber[Any], error: BaseException | None) -> None:
    """The terminal signal: ``on_error(error)``, or ``on_complete()`` when ``error`` is None."""
    if error is None:
        subscriber.on_complete()
    else:
        subscriber.on_error(error)


def cancel_if_any(subscription: Subscription | None) -> None:
    """Cancel ``subscription`` unless there is none (its holder lets go of it first: cancelling may re-enter)."""
    if subscription is not None:
        subscription.cancel()


def add_demand(current: int, n: int) -> int:
    """Add ``n`` to ``current`` demand, saturating at :data:`UNBOUNDED` (rule 3.17)."""
    total = current + n
    return UNBOUNDED if total >= UNBOUNDED else total


class _NoopSubscription(Subscription):
    """Handed to subscribers that must get ``on_subscribe`` before being told about an error."""

    def request(self, n: int) -> None:
        pass

    def cancel(self) -> None:
        pass


NOOP_SUBSCRIPTION: Final[Subscription] = _NoopSubscription()
