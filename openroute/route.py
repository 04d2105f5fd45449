"""The minimal route definition the engine runs, the registry that finds it, and the exchange a step sees.

The route DSL (builder, external calls, splitter, funnel ...) builds on these three: a :class:`Route` is
(service, operation, steps, retry policy, validator); a step is ``step(exchange)`` returning anything or an
awaitable; the :class:`Exchange` carries the message through one processing attempt.
"""

from __future__ import annotations

import asyncio
import inspect
import json
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa

from openroute.errors import BusinessError, ConfigurationError, UnknownRouteError
from openroute.retry import RetryPolicy
from persistence import ExternalCallStatus, StoredMessage

if TYPE_CHECKING:
    from openroute.engine import InboundMessage
    from openroute.engine.core import Engine

Step = Callable[["Exchange"], Any]


@dataclass(frozen=True)
class Route:
    """What to do with messages of one (service, operation).

    ``steps`` run in order for every attempt; ``retry_policy`` overrides the engine's default;
    ``validator`` runs at accept time and raises :class:`~openroute.errors.ValidationError` to refuse
    a message before it is stored.
    """

    service: str
    operation: str
    steps: Sequence[Step]
    retry_policy: RetryPolicy | None = None
    validator: Callable[[InboundMessage], None] | None = None

    def __post_init__(self) -> None:
        if not self.service or not self.operation:
            raise ConfigurationError(
                f"a route needs a service and an operation, got {self.service!r}/{self.operation!r}"
            )
        if isinstance(self.steps, str | bytes) or not isinstance(self.steps, Sequence) or not self.steps:
            raise ConfigurationError(f"route {self.key}: steps must be a non-empty sequence of callables")
        for step in self.steps:
            if not callable(step):
                raise ConfigurationError(f"route {self.key}: step {step!r} is not callable")
        if self.retry_policy is not None and not isinstance(self.retry_policy, RetryPolicy):
            raise ConfigurationError(f"route {self.key}: retry_policy must be a RetryPolicy")
        object.__setattr__(self, "steps", tuple(self.steps))

    @property
    def key(self) -> tuple[str, str]:
        """(service, operation)."""
        return (self.service, self.operation)


class RouteRegistry:
    """The routes of one application, found by (service, operation)."""

    def __init__(self, routes: Sequence[Route] = ()) -> None:
        self._routes: dict[tuple[str, str], Route] = {}
        for route in routes:
            self.register(route)

    def register(self, route: Route) -> Route:
        """Add ``route``; a second route for the same (service, operation) is a ConfigurationError."""
        if not isinstance(route, Route):
            raise ConfigurationError(f"expected a Route, got {route!r}")
        if route.key in self._routes:
            raise ConfigurationError(f"a route for {route.service}/{route.operation} is already registered")
        self._routes[route.key] = route
        return route

    def get(self, service: str, operation: str) -> Route:
        """The route of (service, operation); raises :class:`UnknownRouteError` if there is none."""
        try:
            return self._routes[(service, operation)]
        except KeyError:
            raise UnknownRouteError(service, operation) from None

    def __contains__(self, key: object) -> bool:
        return key in self._routes

    def __iter__(self) -> Iterator[Route]:
        return iter(self._routes.values())

    def __len__(self) -> int:
        return len(self._routes)


@dataclass
class Exchange:
    """One processing attempt of one message, as the route's steps see it.

    ``custom_data`` (JSON-serialisable) is persisted with the outcome and handed to the next attempt;
    ``business_errors`` are kept with the message for the confirmation. Setting ``no_effect`` declares
    that this attempt did nothing: a technical failure then does not count against the retry policy.
    """

    message: StoredMessage
    payload: str
    headers: dict[str, str]
    custom_data: dict[str, Any]
    business_errors: list[dict[str, Any]] = field(default_factory=list)
    no_effect: bool = False
    result: Any = None
    postponed_for: timedelta | None = None
    _engine: Engine | None = field(default=None, repr=False)

    def add_business_error(self, code: str, text: str) -> None:
        """Record a business error without stopping the route (it is reported with the outcome)."""
        self.business_errors.append(BusinessError(code, text).to_dict())

    def postpone(self, delay: timedelta | None = None) -> None:
        """End this attempt POSTPONED (tried again after ``delay`` or the engine's postpone interval).

        A postponed attempt counts as no effect: the failed count does not change.
        """
        if delay is not None and delay < timedelta(0):
            raise ValueError(f"postpone delay must not be negative, got {delay}")
        self.postponed_for = delay if delay is not None else timedelta(-1)  # -1: the engine's default
        self.no_effect = True

    async def call_once(self, key: str, call: Callable[[], Any]) -> Any:
        """Run ``call`` (sync or async) at most once successfully per (message, ``key``) across attempts.

        If an earlier attempt recorded success, ``call`` is skipped and the recorded (JSON) result is
        returned. The call and its record are not one transaction: a node dying after the remote system
        acted but before the record is committed makes the next attempt call again, so the remote side
        should treat ``(message id, key)`` as an idempotency key. For an effect in the store's own
        database use :meth:`call_once_in_store`, which is exactly-once.
        """
        engine = self._require_engine()
        _check_key(key)
        previous = await engine._run_db(lambda: engine.store.get_external_call(self.message.id, key))
        if previous is not None and previous.status is ExternalCallStatus.OK:
            return previous.result
        try:
            result = call()
            if inspect.isawaitable(result):
                result = await result
        except BaseException as error:
            if not isinstance(error, asyncio.CancelledError):
                text = f"{type(error).__name__}: {error}"
                await engine._run_db(
                    lambda: engine.store.record_external_call(
                        self.message.id, key, ExternalCallStatus.FAILED, engine.clock.now(), error=text
                    )
                )
            raise
        stored = _json_or_none(result)
        await engine._run_db(
            lambda: engine.store.record_external_call(
                self.message.id, key, ExternalCallStatus.OK, engine.clock.now(), result=stored
            )
        )
        return result

    async def call_once_in_store(self, key: str, effect: Callable[[sa.Connection], Any]) -> Any:
        """Apply ``effect(connection)`` and record the call ``key`` in one transaction of the store: exactly once.

        On a later attempt (after a crash or a technical error further down the route) the recorded
        result is returned and ``effect`` is not run again.
        """
        engine = self._require_engine()
        _check_key(key)
        store = engine.store

        def work() -> Any:
            with store.begin() as connection:
                previous = store.get_external_call(self.message.id, key, connection)
                if previous is not None and previous.status is ExternalCallStatus.OK:
                    return previous.result
                result = effect(connection)
                store.record_external_call(
                    self.message.id, key, ExternalCallStatus.OK, engine.clock.now(),
                    result=_json_or_none(result), connection=connection,
                )
                return result

        return await engine._run_db(work)

    def _require_engine(self) -> Engine:
        if self._engine is None:
            raise RuntimeError("this exchange is not attached to an engine")
        return self._engine


def _check_key(key: str) -> None:
    if not isinstance(key, str) or not key or len(key) > 255:
        raise ValueError(f"a call key must be a non-empty string of at most 255 characters, got {key!r}")


def _json_or_none(value: Any) -> Any:
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return None
    return value


StepResult = Any | Awaitable[Any]
