"""The exchange: one processing attempt of one message, as a route's steps see it (the runtime of a route).

A route (:mod:`openroute.route`) is pure definition; everything an attempt does against the store (idempotent
external calls, splits into child messages) lives here and reaches the engine only through the narrow
:class:`AttemptRuntime` the engine hands to each exchange.
"""

from __future__ import annotations

import asyncio
import inspect
import json
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from enum import StrEnum
from typing import Any, Literal, TypeVar

import sqlalchemy as sa

from openroute.clock import Clock
from openroute.engine.outcome import ErrorCode
from openroute.errors import BusinessError, ConfigurationError, TechnicalError
from openroute.message import InboundMessage
from openroute.persistence import ExternalCallStatus, MessageStore, NewMessage, StoredMessage
from openroute.route import ExtCallScope, Route, RouteRegistry

__all__ = ["AttemptRuntime", "ChildMessage", "EntityCallStatus", "Exchange", "ExtCallScope"]

T = TypeVar("T")


class EntityCallStatus(StrEnum):
    """What :meth:`MessageStore.begin_entity_call` answers (its plain strings compare equal to these)."""

    #: an earlier call succeeded: its recorded result is returned, the call is not made again
    DONE = "OK"
    #: another message is making the call now (or its claim is not stale yet)
    BUSY = "BUSY"
    #: this message took the call: make it and record the outcome
    RUN = "RUN"


@dataclass(frozen=True)
class AttemptRuntime:
    """What an exchange needs from the engine that runs it, and nothing more.

    ``run_db(work)`` runs blocking store work off the event loop and returns its result.
    """

    store: MessageStore
    clock: Clock
    routes: RouteRegistry
    #: a claim older than this is considered abandoned (entity calls in progress are taken over after it)
    processing_lease: timedelta
    run_db: Callable[[Callable[[], Any]], Awaitable[Any]]
    #: the node the exchange runs on (recorded with the transition rows of the messages it stores)
    node_id: str


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
    #: what the exchange may ask of the engine running it (set by the engine; None: not attached)
    runtime: AttemptRuntime | None = field(default=None, repr=False, compare=False)

    def ext_call_result(self, key: str, kind: type[T]) -> T:
        """The result of this route's ``ext_call`` step ``key`` in this attempt, checked to be a ``kind``.

        Raises :class:`KeyError` when that step has not run (yet) and :class:`TypeError` when its result is not
        a ``kind`` (a result recorded by an earlier attempt comes back as JSON: dict, list, str, int, ...).
        """
        results = self.metadata.get("ext_calls", {})
        if key not in results:
            raise KeyError(f"no result of external call {key!r} in this attempt (has its step run?)")
        value = results[key]
        if not isinstance(value, kind):
            raise TypeError(f"external call {key!r} returned {type(value).__name__}, not {kind.__name__}")
        return value

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
        runtime = self._require_runtime()
        _check_key(key)
        previous = await runtime.run_db(lambda: runtime.store.get_external_call(self.message.id, key))
        if previous is not None and previous.status is ExternalCallStatus.OK:
            return previous.result
        try:
            result = call()
            if inspect.isawaitable(result):
                result = await result
        except BaseException as error:
            if not isinstance(error, asyncio.CancelledError):
                text = f"{type(error).__name__}: {error}"
                await runtime.run_db(
                    lambda: runtime.store.record_external_call(
                        self.message.id, key, ExternalCallStatus.FAILED, runtime.clock.now(), error=text
                    )
                )
            raise
        stored = _json_or_none(result)
        await runtime.run_db(
            lambda: runtime.store.record_external_call(
                self.message.id, key, ExternalCallStatus.OK, runtime.clock.now(), result=stored
            )
        )
        return result

    async def call_once_in_store(self, key: str, effect: Callable[[sa.Connection], Any]) -> Any:
        """Apply ``effect(connection)`` and record the call ``key`` in one transaction of the store: exactly once.

        On a later attempt (after a crash or a technical error further down the route) the recorded
        result is returned and ``effect`` is not run again.
        """
        runtime = self._require_runtime()
        _check_key(key)
        store = runtime.store

        def work() -> Any:
            with store.begin() as connection:
                previous = store.get_external_call(self.message.id, key, connection)
                if previous is not None and previous.status is ExternalCallStatus.OK:
                    return previous.result
                result = effect(connection)
                store.record_external_call(
                    self.message.id, key, ExternalCallStatus.OK, runtime.clock.now(),
                    result=_json_or_none(result), connection=connection,
                )
                return result

        return await runtime.run_db(work)

    async def ext_call(
        self, key: str, call: Callable[[], Any], *, scope: ExtCallScope | Literal["message", "entity"] | None = None
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
        if scope not in tuple(ExtCallScope):
            raise ValueError(f"scope must be 'message' or 'entity', got {scope!r}")
        message = self.message
        if scope == "message" or message.object_id is None:
            return await self.call_once(key, call)
        runtime = self._require_runtime()
        _check_key(key)
        entity_type = message.entity_type or message.operation
        object_id = message.object_id
        store = runtime.store
        now = runtime.clock.now()
        stale_before = now - runtime.processing_lease
        status, recorded = await runtime.run_db(
            lambda: store.begin_entity_call(entity_type, object_id, key, message.id, now, stale_before)
        )
        if status == EntityCallStatus.DONE:
            return recorded
        if status == EntityCallStatus.BUSY:
            raise TechnicalError(
                f"call {key!r} for {entity_type} {object_id} is being made by another message",
                code=ErrorCode.EXT_CALL_IN_PROGRESS.value,
            )
        try:
            result = call()
            if inspect.isawaitable(result):
                result = await result
        except BaseException as error:
            text = f"{type(error).__name__}: {error}"
            await asyncio.shield(runtime.run_db(
                lambda: store.finish_entity_call(entity_type, object_id, key, message.id, False,
                                                 runtime.clock.now(), error=text)
            ))
            raise
        stored = _json_or_none(result)
        await runtime.run_db(
            lambda: store.finish_entity_call(entity_type, object_id, key, message.id, True, runtime.clock.now(),
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
        runtime = self._require_runtime()
        if isinstance(children, str | bytes) or not isinstance(children, Sequence):
            raise TypeError("split takes a sequence of ChildMessage")
        parent = self.message
        now = runtime.clock.now()
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
            runtime.routes.get(service, child.operation)  # UnknownRouteError (check() at start rules it out)
            suffix = child.key if child.key is not None else str(index + 1)
            batch.append(InboundMessage(
                service=service,
                operation=child.operation,
                payload=child.payload,
                content_type=child.content_type or parent.content_type,
                correlation_id=f"{parent.correlation_id}:{suffix}"[:255],
                source_system=parent.source_system,
                process_id=parent.process_id,
                headers=parent.headers,
                object_id=child.object_id,
                entity_type=child.entity_type,
                funnel_value=child.funnel_value,
            ).to_new_message(now, parent_id=parent.id))
        if not batch:
            return []
        outcomes = await runtime.run_db(lambda: _store_children(runtime.store, batch, runtime.node_id))
        ids = [outcome.message.id for outcome in outcomes]
        self.children.extend(i for i in ids if i not in self.children)
        return ids

    def _require_runtime(self) -> AttemptRuntime:
        if self.runtime is None:
            raise RuntimeError("this exchange is not attached to an engine")
        return self.runtime


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


def _store_children(store: MessageStore, batch: list[NewMessage], node_id: str) -> list[Any]:
    """Insert child messages in one transaction (duplicates of an earlier split are reported, not stored)."""
    with store.begin() as connection:
        return list(store.insert_messages(batch, connection, node_id=node_id))


def _check_key(key: str) -> None:
    if not isinstance(key, str) or not key or len(key) > 255:
        raise ValueError(f"a call key must be a non-empty string of at most 255 characters, got {key!r}")


def _json_or_none(value: Any) -> Any:
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return None
    return value
