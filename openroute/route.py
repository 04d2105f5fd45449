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
from typing import TYPE_CHECKING, Any, Literal

import sqlalchemy as sa

from openroute.errors import BusinessError, ConfigurationError, DeploymentError, TechnicalError, UnknownRouteError
from openroute.interceptors import MessageInterceptor, check_interceptors
from openroute.persistence import ExternalCallStatus, NewMessage, StoredMessage
from openroute.retry import RetryPolicy

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

    The processing patterns (docs: "Processing patterns" in the README):

    - ``obsolete_check``: before the steps run, a message for which a *newer* message (receive time) of the
      same entity type + object id already ended OK ends SKIPPED (never when it has no object id);
    - ``guaranteed_order``: messages with a funnel value are always funnelled (at most one PROCESSING per
      value); with guaranteed order an older unfinished message also holds newer ones POSTPONED;
    - ``continue_on_business_error`` / ``business_exceptions``: a :class:`BusinessError` (or an expected
      exception type, stored with code = class name) is kept with the message; the route then goes on with
      the next step (and ends OK with the errors) or ends FAILED at once;
    - ``ext_call_scope``: the default scope of :meth:`Exchange.ext_call` (per message or per entity);
    - ``interceptors``: run around every delivery and each step, after the engine-wide ones;
    - ``child_routes``: the (service, operation) of child messages its split steps create
      (:meth:`RouteRegistry.validate` checks they exist).
    """

    service: str
    operation: str
    steps: Sequence[Step]
    retry_policy: RetryPolicy | None = None
    validator: Callable[[InboundMessage], None] | None = None
    obsolete_check: bool = False
    guaranteed_order: bool = False
    continue_on_business_error: bool = False
    business_exceptions: tuple[type[BaseException], ...] = ()
    ext_call_scope: Literal["message", "entity"] = "message"
    interceptors: Sequence[MessageInterceptor] = ()
    child_routes: tuple[tuple[str, str], ...] = ()

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
        if self.ext_call_scope not in ("message", "entity"):
            raise ConfigurationError(f"route {self.key}: ext_call_scope must be 'message' or 'entity'")
        exceptions = tuple(self.business_exceptions)
        if not all(isinstance(e, type) and issubclass(e, BaseException) for e in exceptions):
            raise ConfigurationError(f"route {self.key}: business_exceptions must be exception classes")
        children = tuple(tuple(key) for key in self.child_routes)
        if not all(len(key) == 2 and all(isinstance(part, str) and part for part in key) for key in children):
            raise ConfigurationError(f"route {self.key}: child_routes must be (service, operation) pairs")
        object.__setattr__(self, "steps", tuple(self.steps))
        object.__setattr__(self, "business_exceptions", exceptions)
        object.__setattr__(self, "child_routes", children)
        object.__setattr__(self, "interceptors", check_interceptors(self.interceptors, f"route {self.key}"))

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
        """Add ``route``; a second route for the same (service, operation) is a :class:`DeploymentError`."""
        if not isinstance(route, Route):
            raise DeploymentError(f"expected a Route, got {route!r}")
        if route.key in self._routes:
            raise DeploymentError(f"a route for {route.service}/{route.operation} is already registered")
        self._routes[route.key] = route
        return route

    def validate(self) -> None:
        """Raise one :class:`DeploymentError` listing every unreachable definition (e.g. a split to no route)."""
        problems = [
            f"route {route.service}/{route.operation} splits into {service}/{operation}, which has no route"
            for route in self._routes.values()
            for service, operation in route.child_routes
            if (service, operation) not in self._routes
        ]
        if problems:
            raise DeploymentError(problems)

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
    #: shared with the interceptors of this delivery (they may enrich it)
    metadata: dict[str, Any] = field(default_factory=dict)
    #: ids of the child messages stored by :meth:`split` in this attempt
    children: list[int] = field(default_factory=list)
    route: Route | None = field(default=None, repr=False)
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

    async def ext_call(
        self, key: str, call: Callable[[], Any], *, scope: Literal["message", "entity"] | None = None
    ) -> Any:
        """Call an external system idempotently: at most one success per (message, ``key``) or per
        (entity type + object id, ``key``) with ``scope="entity"`` (default: the route's ``ext_call_scope``).

        A success recorded by an earlier attempt (of this message, or with entity scope of any message of the
        same entity) is not repeated: its recorded JSON result is returned. With entity scope the record is
        taken IN_PROGRESS before the call, so a concurrent duplicate call for the same entity and key is not
        made: that attempt fails technically (code EXT_CALL_IN_PROGRESS) and is retried per the policy. A
        message without an object id has no entity: entity scope then falls back to message scope.
        """
        if scope is None:
            scope = self.route.ext_call_scope if self.route is not None else "message"
        if scope not in ("message", "entity"):
            raise ValueError(f"scope must be 'message' or 'entity', got {scope!r}")
        message = self.message
        if scope == "message" or message.object_id is None:
            return await self.call_once(key, call)
        engine = self._require_engine()
        _check_key(key)
        entity_type = message.entity_type or message.operation
        object_id = message.object_id
        store = engine.store
        now = engine.clock.now()
        stale_before = now - engine.settings.processing_lease
        status, recorded = await engine._run_db(
            lambda: store.begin_entity_call(entity_type, object_id, key, message.id, now, stale_before)
        )
        if status == "OK":
            return recorded
        if status == "BUSY":
            raise TechnicalError(
                f"call {key!r} for {entity_type} {object_id} is being made by another message", "EXT_CALL_IN_PROGRESS"
            )
        try:
            result = call()
            if inspect.isawaitable(result):
                result = await result
        except BaseException as error:
            text = f"{type(error).__name__}: {error}"
            await asyncio.shield(engine._run_db(
                lambda: store.finish_entity_call(entity_type, object_id, key, message.id, False,
                                                 engine.clock.now(), error=text)
            ))
            raise
        stored = _json_or_none(result)
        await engine._run_db(
            lambda: store.finish_entity_call(entity_type, object_id, key, message.id, True, engine.clock.now(),
                                             result=stored)
        )
        return result

    async def split(self, children: Sequence[ChildMessage]) -> list[int]:
        """Store ``children`` as NEW child messages of this one; returns their ids, in order.

        After the route's steps end, the parent waits (WAITING_FOR_CHILDREN) until every child is final: it
        ends OK when all are OK, FAILED as soon as one is FAILED. The children are processed one after the
        other, in order, on this first attempt; a child that fails is retried on its own (any order). A child's
        correlation id is ``<parent correlation id>:<key or position>``, so a split run again by a later attempt
        stores nothing twice.
        """
        engine = self._require_engine()
        if isinstance(children, str | bytes) or not isinstance(children, Sequence):
            raise TypeError("split takes a sequence of ChildMessage")
        parent = self.message
        now = engine.clock.now()
        batch: list[NewMessage] = []
        for index, child in enumerate(children):
            if not isinstance(child, ChildMessage):
                raise TypeError(f"split takes ChildMessage objects, got {type(child).__name__}")
            service = child.service or parent.service
            if self.route is not None and (service, child.operation) not in self.route.child_routes:
                raise ConfigurationError(
                    f"route {parent.service}/{parent.operation} splits into {service}/{child.operation}, "
                    "which is not among its child_routes"
                )
            engine.routes.get(service, child.operation)  # UnknownRouteError (validate() at start rules it out)
            suffix = child.key if child.key is not None else str(index + 1)
            batch.append(NewMessage(
                service=service,
                operation=child.operation,
                payload=child.payload,
                content_type=child.content_type or parent.content_type,
                correlation_id=f"{parent.correlation_id}:{suffix}"[:255],
                source_system=parent.source_system,
                receive_ts=now,
                process_id=parent.process_id,
                headers=dict(parent.headers),
                object_id=child.object_id,
                entity_type=child.entity_type or (child.operation if child.object_id is not None else None),
                funnel_value=child.funnel_value,
                parent_id=parent.id,
            ))
        if not batch:
            return []
        outcomes = await engine._run_db(lambda: store_children(engine, batch))
        ids = [outcome.message.id for outcome in outcomes]
        self.children.extend(i for i in ids if i not in self.children)
        return ids

    def _require_engine(self) -> Engine:
        if self._engine is None:
            raise RuntimeError("this exchange is not attached to an engine")
        return self._engine


@dataclass(frozen=True)
class ChildMessage:
    """One child message a split step creates (see :meth:`Exchange.split`).

    ``service`` and ``content_type`` default to the parent's; ``entity_type`` defaults to ``operation`` when
    the child has an ``object_id``; ``key`` names the child in its correlation id (default: its position).
    """

    payload: str
    operation: str
    service: str | None = None
    content_type: str | None = None
    object_id: str | None = None
    entity_type: str | None = None
    funnel_value: str | None = None
    key: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.payload, str):
            raise TypeError(f"a child payload must be text, got {type(self.payload).__name__}")
        if not isinstance(self.operation, str) or not self.operation:
            raise ValueError("a child message needs an operation")


def store_children(engine: Engine, batch: list[NewMessage]) -> list[Any]:
    """Insert child messages in one transaction (duplicates of an earlier split are reported, not stored)."""
    with engine.store.begin() as connection:
        return engine.store.insert_messages(batch, connection, node_id=engine.node_id)


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
