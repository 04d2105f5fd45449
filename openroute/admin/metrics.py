"""Prometheus metrics of one node (``/metrics``) and its health check (``/health``).

A scrape costs the same at any store size: the backlog per route and state (non-final messages, the cluster's
truth) is read with a state-indexed query cached for a few seconds; final outcomes are counters this node
increments when a message reaches a final state (sum them over the nodes in Prometheus), like the latencies.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import anyio
import anyio.to_thread
import sqlalchemy as sa
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from openroute.auth.credentials import AdminAuth
from openroute.auth.errors import AuthenticationError, ForbiddenError, TooManyFailedLoginsError, status_and_code
from openroute.engine import Engine
from openroute.jobs.counts import MessageCounts
from openroute.outbound import ExternalCalls
from openroute.persistence import MessageState, StoredMessage
from openroute.persistence.breaker import BreakerState, BreakerStore
from openroute.persistence.outage import StoreOutage
from openroute.runtime.logs import repeated_errors

log = logging.getLogger("openroute.metrics")

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
#: the roles that may read ``/metrics`` when it needs credentials (besides the admin role)
METRICS_ROLES = ("metrics", "web")
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600)


class _EngineCollector(Collector):
    """Reads the store (messages per route and state) and the engine's counters at every scrape."""

    def __init__(
        self, engine: Engine, channel_counters: Callable[[], Mapping[str, int]] | None, counts: MessageCounts,
        channel_deliveries: Callable[[], Mapping[str, Mapping[str, int]]] | None = None,
    ) -> None:
        self.engine = engine
        self.channel_counters = channel_counters
        self.channel_deliveries = channel_deliveries
        self.counts = counts
        #: a scrape while the store is unreachable: one WARNING when it starts, one INFO when it ends, no tracebacks
        self.outage = StoreOutage("message store (/metrics)", "scrapes answer without its figures until it is back")

    def failed(self, error: Exception, reading: str) -> None:
        """A scrape's read of the store failed: an outage is logged once, anything else as an unexpected error."""
        if not self.outage.failed(error, reading):
            repeated_errors.log(log, "cannot read %s for /metrics", reading, error=error)

    def collect(self) -> Iterator[Metric]:
        messages = GaugeMetricFamily(
            "openroute_messages", "Non-final messages in the store per route and state (cached a few seconds)",
            labels=["service", "operation", "state"],
        )
        try:
            for service, operation, state, count in self.counts.open_by_route():
                messages.add_metric([service, operation, state.value], count)
        except Exception as error:  # a scrape must still answer when the database is down (health tells that)
            self.failed(error, "the messages per route")
        else:
            self.outage.succeeded()
        yield messages
        stats = self.engine.stats
        for name, help_text, value in (
            ("openroute_accepted", "Messages accepted (stored NEW) by this node", stats.accepted),
            ("openroute_duplicates", "Duplicate messages answered by this node", stats.duplicates),
            ("openroute_claims", "Messages claimed for processing by this node", stats.claimed),
            ("openroute_lost_claims", "Claims lost to another node", stats.lost_claims),
            ("openroute_retries", "Attempts that ended PARTLY_FAILED (a retry is due)",
             stats.outcomes.get(MessageState.PARTLY_FAILED, 0)),
            ("openroute_reemitted", "Messages re-queued by repoll", stats.reemitted),
            ("openroute_repaired", "Abandoned PROCESSING messages repaired", stats.repaired),
        ):
            family = CounterMetricFamily(name, help_text)
            family.add_metric([], value)
            yield family
        outcomes = CounterMetricFamily(
            "openroute_outcomes", "Processing outcomes of this node by state", labels=["state"]
        )
        for state, count in sorted(stats.outcomes.items()):
            outcomes.add_metric([MessageState(state).value], count)
        yield outcomes
        channel = GaugeMetricFamily("openroute_processing_channel", "The node's processing channel", labels=["kind"])
        channel.add_metric(["queued"], self.engine.queued)
        channel.add_metric(["in_flight"], self.engine.in_flight)
        yield channel
        passed = CounterMetricFamily(
            "openroute_channel_messages", "Messages that passed each channel", labels=["channel"]
        )
        passed.add_metric(["processing"], stats.claimed)
        if self.channel_counters is not None:
            try:
                for name, count in sorted(self.channel_counters().items()):
                    passed.add_metric([name], count)
            except Exception as error:
                repeated_errors.log(log, "channel counters failed", error=error)
        yield passed
        if self.channel_deliveries is not None:
            yield _channel_deliveries(self.channel_deliveries)
        yield from _breaker_metrics(self.engine, self.failed)
        yield from _payload_index_metrics(self.engine, self.failed)


def _channel_deliveries(deliveries: Callable[[], Mapping[str, Mapping[str, int]]]) -> Metric:
    """The deliveries of this node's broker channels (channel-fed routes) by outcome: accepted, duplicate,
    dead_lettered, rejected (no dead-letter channel), requeued (not stored now, given back to the queue)."""
    family = CounterMetricFamily(
        "openroute_channel_deliveries", "Deliveries of the broker channels feeding routes, by channel and outcome",
        labels=["channel", "outcome"],
    )
    try:
        for channel, outcomes in sorted(deliveries().items()):
            for outcome, count in outcomes.items():
                family.add_metric([channel, outcome], count)
    except Exception as error:  # a scrape must still answer
        repeated_errors.log(log, "channel deliveries failed", error=error)
    return family


def _payload_index_metrics(engine: Engine, failed: Callable[[Exception, str], None]) -> Iterator[Metric]:
    """PostgreSQL: how many stored messages wait for the payload search's index (a search reads their payloads
    directly, so a number that keeps growing makes payload searches slower; see docs/console.md)."""
    index = engine.store.payload_index
    if not index.postgresql:
        return
    pending = GaugeMetricFamily(
        "openroute_payload_index_pending", "Stored messages whose payload is not yet in the payload search's index")
    try:
        pending.add_metric([], index.pending())
    except Exception as error:  # a scrape must still answer when the database is down
        failed(error, "the payloads waiting for the index")
    yield pending


def _breaker_metrics(engine: Engine, failed: Callable[[Exception, str], None]) -> Iterator[Metric]:
    """The state of every stored circuit breaker (the cluster's truth) and this node's external calls by outcome."""
    states = GaugeMetricFamily(
        "openroute_circuit_breaker_state", "1 for the current state of each external system's circuit breaker",
        labels=["system", "state"],
    )
    try:
        for row in BreakerStore(engine.store).all():
            for state in BreakerState:
                states.add_metric([row.system, state.value], 1.0 if row.state is state else 0.0)
    except Exception as error:  # a scrape must still answer when the database is down
        failed(error, "the circuit breakers")
    yield states
    parked = GaugeMetricFamily(
        "openroute_parked_messages", "Messages parked on an external system's open circuit breaker",
        labels=["system"],
    )
    try:
        for system, count in sorted(engine.store.parking.counts().items()):
            parked.add_metric([system], count)
    except Exception as error:  # a scrape must still answer when the database is down
        failed(error, "the parked messages")
    yield parked
    calls = CounterMetricFamily(
        "openroute_external_calls", "Calls of this node to external systems by outcome (REFUSED: by the breaker)",
        labels=["system", "outcome"],
    )
    guard = engine.external_calls
    if isinstance(guard, ExternalCalls):
        for (system, outcome), count in sorted(guard.stats.items()):
            calls.add_metric([system, str(outcome)], count)
    yield calls


class Metrics:
    """The metrics of one node in their own registry (so several apps in one process never collide).

    ``channel_counters`` is e.g. ``MessagingApp.counters``; ``channel_deliveries`` gives ``{channel: {outcome:
    count}}`` of the channels feeding routes (:meth:`ChannelInbound.deliveries
    <openroute.inbound.channel.ChannelInbound.deliveries>`), exposed as ``openroute_channel_deliveries_total``.
    Register :meth:`on_final_state` as an engine final-state hook (``create_app`` does) and :meth:`observe_request`
    as the inbound request observer.
    """

    def __init__(
        self,
        engine: Engine,
        channel_counters: Callable[[], Mapping[str, int]] | None = None,
        counts: MessageCounts | None = None,
        *,
        auth: AdminAuth | None = None,
        channel_deliveries: Callable[[], Mapping[str, Mapping[str, int]]] | None = None,
    ) -> None:
        self.engine = engine
        #: with users here, ``/metrics`` needs one with a role of :data:`METRICS_ROLES` (``[admin] metrics_auth``)
        self.auth = auth
        self.counts = counts if counts is not None else MessageCounts(engine.store)
        self.registry = CollectorRegistry(auto_describe=False)
        self.finals = Counter(
            "openroute_final_messages", "Messages this node brought to a final state, by route and state",
            ["service", "operation", "state"], registry=self.registry,
        )
        self.requests = Counter(
            "openroute_inbound_requests", "Inbound requests by endpoint and outcome", ["endpoint", "outcome"],
            registry=self.registry,
        )
        self.request_seconds = Histogram(
            "openroute_inbound_request_seconds", "Time to answer an inbound request", ["endpoint"],
            buckets=LATENCY_BUCKETS, registry=self.registry,
        )
        self.latency = Histogram(
            "openroute_message_latency_seconds", "From receipt to the final state",
            ["service", "operation", "state"], buckets=LATENCY_BUCKETS, registry=self.registry,
        )
        self.processing = Histogram(
            "openroute_message_processing_seconds", "Duration of the last processing attempt",
            ["service", "operation", "state"], buckets=LATENCY_BUCKETS, registry=self.registry,
        )
        self.registry.register(_EngineCollector(engine, channel_counters, self.counts, channel_deliveries))
        self._request_children: dict[tuple[str, str], tuple[Any, Any]] = {}
        self._final_children: dict[tuple[str, str, MessageState], list[Any]] = {}

    def observe_request(self, endpoint: str, outcome: str, _status: int, seconds: float) -> None:
        """Count one inbound request and its duration."""
        # the labelled children are kept: prometheus_client's labels() checks and locks on every call
        children = self._request_children.get((endpoint, outcome))
        if children is None:
            children = self._request_children[(endpoint, outcome)] = (
                self.requests.labels(endpoint, outcome), self.request_seconds.labels(endpoint)
            )
        children[0].inc()
        children[1].observe(seconds)

    async def on_final_state(self, message: StoredMessage) -> None:
        """Engine final-state hook: observe the message's latency and last processing time."""
        # the labelled children are kept, as observe_request's (labels() checks and locks on every call: three
        # calls a message cost more than the observations)
        key = (message.service, message.operation, message.state)
        children = self._final_children.get(key)
        if children is None:
            labels = (message.service, message.operation, message.state.value)
            # the processing time's series only once a message of these labels was processed (a cancelled one never
            # was): /metrics shows no empty series
            children = self._final_children[key] = [self.finals.labels(*labels), self.latency.labels(*labels), None]
        children[0].inc()
        children[1].observe(max((message.last_update_ts - message.receive_ts).total_seconds(), 0.0))
        if message.start_process_ts is not None:
            seconds = (message.last_update_ts - message.start_process_ts).total_seconds()
            processing = children[2]
            if processing is None:
                processing = children[2] = self.processing.labels(message.service, message.operation,
                                                                  message.state.value)
            processing.observe(max(seconds, 0.0))

    def render(self) -> bytes:
        """The Prometheus text exposition (reads the store: call it off the event loop)."""
        return generate_latest(self.registry)

    async def endpoint(self, request: Request) -> Response:
        """``GET /metrics``; with :attr:`auth` only for a user with one of :data:`METRICS_ROLES` (else 401 / 403 /
        429 as the admin API answers)."""
        if self.auth is not None:
            try:
                self.auth.authorize(request.headers, [*METRICS_ROLES, self.auth.role],
                                    request.client.host if request.client else None)
            except (AuthenticationError, ForbiddenError, TooManyFailedLoginsError) as error:
                status, code = status_and_code(error)
                headers = {}
                if isinstance(error, AuthenticationError):
                    headers["WWW-Authenticate"] = 'Basic realm="openroute metrics"'
                elif isinstance(error, TooManyFailedLoginsError):
                    headers["Retry-After"] = str(error.retry_after)
                return JSONResponse({"error": code, "reason": str(error)}, status, headers=headers)
        return Response(await anyio.to_thread.run_sync(self.render), media_type=CONTENT_TYPE)

    def routes(self) -> list[Route]:
        """``GET /metrics``."""
        return [Route("/metrics", self.endpoint, methods=["GET"])]


def health_route(engine: Engine, timeout: float = 5.0,
                 channels: Callable[[], Mapping[str, str]] | None = None) -> Route:
    """``GET /health``: 200 when the database answers (and the engine runs), 503 with the reason otherwise.

    The body lists the external systems that hold messages back (``breakers``: each breaker that is not CLOSED and
    each system with parked messages, ``BreakerStore.holding_back``); they do not change the status: the node works.

    With ``channels`` (``{channel: "connected" | ...}``, e.g. :meth:`ChannelInbound.health
    <openroute.inbound.channel.ChannelInbound.health>`) the body has ``channels``, and a channel that is not
    connected makes the status ``degraded`` (still 200: the HTTP endpoints work)."""

    def ping() -> list[dict[str, Any]]:
        with engine.store.engine.connect() as connection:
            connection.execute(sa.text("SELECT 1"))
            return [held.to_json() for held in BreakerStore(engine.store).holding_back(connection)]

    async def health(_request: Request) -> Response:
        body: dict[str, Any] = {"engine": "running" if engine.running else "stopped", "node": engine.node_id}
        try:
            with anyio.fail_after(timeout):
                body["breakers"] = await anyio.to_thread.run_sync(ping, abandon_on_cancel=True)
            body["database"] = "ok"
        except Exception as error:
            body["database"] = f"unavailable: {type(error).__name__}"
            body["status"] = "unavailable"
            return JSONResponse(body, 503)
        body["status"] = "ok" if engine.running else "degraded"
        if channels is not None:
            body["channels"] = dict(channels())
            if engine.running and any(state != "connected" for state in body["channels"].values()):
                body["status"] = "degraded"
        return JSONResponse(body, 200 if engine.running else 503)

    return Route("/health", health, methods=["GET"])
