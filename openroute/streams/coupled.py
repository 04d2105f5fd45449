"""The coupled processor: a subscriber takes the input, a publisher gives the output, their lifecycles tied.

The spec's ``ReactiveStreams.coupled(subscriber, publisher)``, with its coupling both ways:

- the upstream completes or fails: the subscriber gets the same signal, the publisher is cancelled and the
  downstream gets the same signal;
- the subscriber cancels its upstream: the publisher is cancelled and the downstream completes;
- the publisher completes or fails: the downstream gets it, the upstream is cancelled and the subscriber gets
  the same signal;
- the downstream cancels: the publisher and the upstream are cancelled and the subscriber completes.
"""

from __future__ import annotations

from typing import Any

from .protocol import (
    NOOP_SUBSCRIPTION,
    Processor,
    Publisher,
    Subscriber,
    Subscription,
    cancel_if_any,
    refuse_none,
    signal_end,
)
from .sources import check_subscriber


class CoupledProcessor(Processor[Any, Any]):
    """Upstream signals go to ``subscriber``; ``publisher``'s signals go downstream; termination is shared."""

    def __init__(self, subscriber: Subscriber[Any], publisher: Publisher[Any]) -> None:
        self._subscriber = subscriber
        self._publisher = publisher
        self._upstream: Subscription | None = None
        self._upstream_done = False  # upstream terminated, or cancelled by us
        self._subscriber_done = False  # the subscriber got its terminal signal
        self._subscriber_started = False  # the subscriber got on_subscribe
        self._downstream: Subscriber[Any] | None = None
        self._publisher_subscription: Subscription | None = None
        self._downstream_done = False
        self._pending_end: tuple[BaseException | None] | None = None  # an end reached before the downstream came

    # -- the upstream side (this processor as a Subscriber) --------------------------------------------------
    def on_subscribe(self, subscription: Subscription) -> None:
        """Take the upstream (a second one is cancelled, rule 2.5) and hand it to the coupled subscriber: its cancel
        also cancels the publisher and completes the downstream."""
        refuse_none(subscription, "on_subscribe")
        if self._upstream is not None or self._upstream_done:
            subscription.cancel()
            return
        self._upstream = subscription
        self._subscriber_started = True
        self._subscriber.on_subscribe(_UpstreamLink(self, subscription))

    def on_next(self, item: Any) -> None:
        """Pass ``item`` to the coupled subscriber while it runs."""
        refuse_none(item, "on_next")
        if not self._subscriber_done:
            self._subscriber.on_next(item)

    def on_error(self, error: BaseException) -> None:
        """The upstream failed: the subscriber gets ``error``, the publisher is cancelled, the downstream gets
        ``error``."""
        refuse_none(error, "on_error")
        self._upstream_ended(error)

    def on_complete(self) -> None:
        """The upstream completed: the subscriber completes, the publisher is cancelled, the downstream completes."""
        self._upstream_ended(None)

    def _upstream_ended(self, error: BaseException | None) -> None:
        """The upstream's terminal signal (``error``, or None for completion) ends both sides, once."""
        if self._upstream_done:
            return
        self._upstream_done = True
        self._upstream = None
        self._end_subscriber(error)
        self._end_downstream(error)

    # -- the downstream side (this processor as a Publisher) -------------------------------------------------
    def subscribe(self, subscriber: Subscriber[Any]) -> None:
        """Subscribe the one downstream to the coupled publisher (a second one gets ``on_error``; ``None`` raises
        TypeError, rule 1.9); an end reached before it came is signalled right after its ``on_subscribe``."""
        check_subscriber(subscriber)
        if self._downstream is not None or self._downstream_done:
            subscriber.on_subscribe(NOOP_SUBSCRIPTION)
            subscriber.on_error(RuntimeError("a coupled processor has one subscriber"))
            return
        self._downstream = subscriber
        if self._pending_end is not None:
            self._downstream_done = True
            subscriber.on_subscribe(NOOP_SUBSCRIPTION)
            signal_end(subscriber, self._pending_end[0])
            return
        self._publisher.subscribe(_PublisherLink(self))

    # -- coupling --------------------------------------------------------------------------------------------
    def _end_subscriber(self, error: BaseException | None) -> None:
        """Terminate the subscriber side (cancelling the upstream if it is still running)."""
        if self._subscriber_done:
            return
        self._subscriber_done = True
        upstream, self._upstream = self._upstream, None
        if not self._upstream_done:
            self._upstream_done = True
            cancel_if_any(upstream)
        if not self._subscriber_started:
            self._subscriber_started = True
            self._subscriber.on_subscribe(NOOP_SUBSCRIPTION)  # rule 1.9: on_subscribe before the terminal signal
        signal_end(self._subscriber, error)

    def _end_downstream(self, error: BaseException | None) -> None:
        """Terminate the publisher side: cancel the publisher and pass ``error`` (or completion) downstream."""
        if self._downstream_done:
            return
        downstream = self._downstream
        if downstream is None:
            self._pending_end = (error,)
            return
        self._downstream_done = True
        self._downstream = None
        subscription = self._take_publisher_subscription()
        if subscription is not None:
            subscription.cancel()
        else:
            # the publisher has not called on_subscribe yet: the downstream still needs its first signal
            downstream.on_subscribe(NOOP_SUBSCRIPTION)
        signal_end(downstream, error)

    def _subscriber_cancelled(self) -> None:
        self._subscriber_done = True  # a subscriber that cancelled gets no more signals
        self._upstream_done = True
        self._end_downstream(None)

    def _downstream_cancelled(self) -> None:
        self._downstream_done = True
        self._downstream = None
        cancel_if_any(self._take_publisher_subscription())
        self._end_subscriber(None)

    def _take_publisher_subscription(self) -> Subscription | None:
        subscription, self._publisher_subscription = self._publisher_subscription, None
        return subscription

    def _publisher_subscribed(self, subscription: Subscription) -> None:
        downstream = self._downstream
        if downstream is None or self._downstream_done or self._publisher_subscription is not None:
            subscription.cancel()
            return
        self._publisher_subscription = subscription
        downstream.on_subscribe(_DownstreamLink(self, subscription))

    def _publisher_next(self, item: Any) -> None:
        downstream = self._downstream
        if downstream is not None and not self._downstream_done:
            downstream.on_next(item)

    def _publisher_ended(self, error: BaseException | None) -> None:
        downstream = self._downstream
        if downstream is None or self._downstream_done:
            return
        self._downstream_done = True
        self._downstream = None
        self._publisher_subscription = None
        signal_end(downstream, error)
        self._end_subscriber(error)


class _Link(Subscription):
    """A subscription the coupled processor hands on: requests pass through while its side runs."""

    __slots__ = ("_owner", "_subscription")

    def __init__(self, owner: CoupledProcessor, subscription: Subscription) -> None:
        self._owner = owner
        self._subscription = subscription

    def _side_done(self) -> bool:
        raise NotImplementedError

    def request(self, n: int) -> None:
        if not self._side_done():
            self._subscription.request(n)


class _UpstreamLink(_Link):
    """The subscription the coupled subscriber sees: its cancel also ends the publisher side."""

    __slots__ = ()

    def _side_done(self) -> bool:
        return self._owner._subscriber_done

    def cancel(self) -> None:
        owner = self._owner
        if owner._subscriber_done:
            return
        owner._upstream = None
        self._subscription.cancel()
        owner._subscriber_cancelled()


class _DownstreamLink(_Link):
    """The subscription the downstream sees: its cancel also ends the subscriber side."""

    __slots__ = ()

    def _side_done(self) -> bool:
        return self._owner._downstream_done

    def cancel(self) -> None:
        if not self._owner._downstream_done:
            self._owner._downstream_cancelled()


class _PublisherLink(Subscriber[Any]):
    """Subscribed to the coupled publisher; forwards to the owner."""

    __slots__ = ("_owner",)

    def __init__(self, owner: CoupledProcessor) -> None:
        self._owner = owner

    def on_subscribe(self, subscription: Subscription) -> None:
        refuse_none(subscription, "on_subscribe")
        self._owner._publisher_subscribed(subscription)

    def on_next(self, item: Any) -> None:
        refuse_none(item, "on_next")
        self._owner._publisher_next(item)

    def on_error(self, error: BaseException) -> None:
        refuse_none(error, "on_error")
        self._owner._publisher_ended(error)

    def on_complete(self) -> None:
        self._owner._publisher_ended(None)
