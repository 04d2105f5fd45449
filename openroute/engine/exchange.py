"""The exchange: one processing attempt of one message, as a route's steps see it (the runtime of a route).

A route (:mod:`openroute.definitions.route`) is pure definition; everything an attempt does against the store
(idempotent external calls, splits into child messages) lives here and reaches the engine only through the narrow
:class:`AttemptRuntime` the engine hands to each exchange.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from types import CodeType, FunctionType
from typing import Any, Literal, Protocol, TypeVar

import sqlalchemy as sa

from openroute.definitions.child import ChildMessage
from openroute.definitions.clock import Clock
from openroute.definitions.errors import (
    BusinessError,
    CircuitOpenError,
    ConfigurationError,
    TechnicalError,
    ValidationError,
)
from openroute.definitions.message import InboundMessage
from openroute.definitions.route import ExtCallScope, Route, RouteRegistry
from openroute.engine.idempotency import (
    CallInDoubtError,
    InDoubt,
    current_idempotency_key,
    entity_idempotency_key,
    message_idempotency_key,
    using_idempotency_key,
)
from openroute.engine.outcome import ErrorCode
from openroute.persistence import (
    CallEnd,
    CallStart,
    EntityCallStatus,
    ExternalCall,
    ExternalCallStatus,
    MessageStore,
    NewMessage,
    StoredMessage,
    mask_secrets,
)
from openroute.persistence.breaker import BreakerOutlook
from openroute.persistence.call_records import CallRecord
from openroute.runtime import tracing

__all__ = ["AttemptRuntime", "CallGuard", "ChildMessage", "Exchange", "ExtCallScope"]

T = TypeVar("T")
log = logging.getLogger("openroute.engine")


class CallGuard(Protocol):
    """What stands around a call to a declared external system (``ext_call(..., system=...)``): its circuit breaker
    and its call records. The application gives one to the engine (:class:`openroute.outbound.ExternalCalls`)."""

    async def guard(self, system: str, key: str, message: StoredMessage, call: Callable[[], Any], *,
                    record: Callable[[CallRecord], Awaitable[object]] | None = None) -> Any:
        """Make ``call`` (sync or async) for ``message`` unless the breaker of ``system`` refuses it
        (:class:`~openroute.definitions.errors.CircuitOpenError`), and return its result. ``record(call_record)``
        stores the call's record when the system's records are on (None: the guard stores it itself)."""
        ...

    def watch(self, listener: Callable[[str], None]) -> None:
        """Have ``listener(system)`` called on the loop after each change this node makes to a breaker."""
        ...

    async def outlook(self, system: str) -> BreakerOutlook | None:
        """What the breaker of ``system`` would say to a call now (no trial place taken); None without a breaker."""
        ...


@dataclass(frozen=True)
class AttemptRuntime:
    """What an exchange needs from the engine that runs it, and nothing more.

    ``run_db(work)`` runs blocking store work off the event loop and returns its result; ``write(operation)`` runs a
    short ``operation(connection)`` in the node's group commit (a transaction shared with other messages' writes)
    and returns its result after the commit. ``start_call`` and ``end_call`` record a call's start and outcome in the
    group commit too, a group's in a few statements (``ExternalCallStore.begin_many``, ``finish_many``): the records
    of a call cost no commit of their own; so do the call records of ``add_call_record``.
    """

    store: MessageStore
    clock: Clock
    routes: RouteRegistry
    #: a claim older than this is considered abandoned (entity calls in progress are taken over after it)
    processing_lease: timedelta
    run_db: Callable[[Callable[[], Any]], Awaitable[Any]]
    write: Callable[[Callable[[sa.Connection], Any]], Awaitable[Any]]
    start_call: Callable[[CallStart], Awaitable[tuple[ExternalCall | None, bool]]]
    end_call: Callable[[CallEnd], Awaitable[None]]
    #: the node the exchange runs on (recorded with the transition rows of the messages it stores)
    node_id: str
    #: breaker and records of calls to declared external systems (None: such calls are made unguarded)
    calls: CallGuard | None = None
    #: stores a call record in the group commit, awaited until it is committed (None: the guard stores it itself)
    add_call_record: Callable[[CallRecord], Awaitable[object]] | None = None


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
    #: the declared external system whose call failed technically in this attempt (None: none did): a technical
    #: outcome of the attempt then also waits for that system (released early when its breaker closes)
    failed_on: str | None = field(default=None, init=False, compare=False)
    _body: Any = field(default=None, init=False, repr=False, compare=False)

    @property
    def body(self) -> Any:
        """The payload bound to the route's model (``.body(Model)``, :mod:`openroute.definitions.body`), parsed at the
        first read of this attempt and kept for its other steps; ``payload`` keeps the raw text.

        Raises :class:`ConfigurationError` when the route declares no model, and
        :class:`~openroute.definitions.body.InvalidBodyError` (a validation error: the message ends FAILED) when the
        stored payload does not match it (e.g. stored before the model changed).
        """
        if self._body is None:
            model = self.route.body if self.route is not None else None
            if model is None:
                raise ConfigurationError(f"route {self.message.service}/{self.message.operation} declares no body "
                                         "model (.body(Model)): read exchange.payload")
            self._body = model.parse(self.payload, self.message.content_type)
        return self._body

    def body_as(self, kind: type[T]) -> T:
        """:attr:`body`, checked to be a ``kind`` (the typed accessor: ``exchange.body_as(Customer)``).

        Raises what :attr:`body` raises, and :class:`TypeError` when the body is bound to another model.
        """
        value = self.body
        if not isinstance(value, kind):
            raise TypeError(f"the body is a {type(value).__name__}, not {kind.__name__}")
        return value

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

    def idempotency_key(self, key: str, *, scope: ExtCallScope | Literal["message", "entity"] | None = None) -> str:
        """The idempotency key of this message's call ``key`` (what ``ext_call(key, ...)`` hands the remote).

        The same on every attempt, on every node and after an operator's restart of the message: derived from the
        message (id, source system, correlation id) and ``key``, or with entity scope (default: the route's
        ``ext_call_scope``) from entity type, object id and ``key``. A UUID string. Raises ``ValueError`` for a
        bad key or scope.
        """
        _check_key(key)
        message = self.message
        if self._entity_scoped(scope):
            assert message.object_id is not None  # noqa: S101  narrows an Optional for mypy: checked above
            return entity_idempotency_key(message.entity_type or message.operation, message.object_id, key)
        return message_idempotency_key(message.id, message.source_system, message.correlation_id, key)

    def _entity_scoped(self, scope: ExtCallScope | Literal["message", "entity"] | None) -> bool:
        if scope is None:
            scope = self.route.ext_call_scope if self.route is not None else "message"
        if scope not in _SCOPES:
            raise ValueError(f"scope must be 'message' or 'entity', got {scope!r}")
        return scope == "entity" and self.message.object_id is not None

    async def call_once(self, key: str, call: Callable[..., Any], *, in_doubt: InDoubt = "repeat") -> Any:
        """Run ``call`` (sync or async) at most once successfully per (message, ``key``) across attempts.

        If an earlier attempt recorded success, ``call`` is skipped and the recorded (JSON) result is returned.
        Before ``call`` runs, a STARTED record (idempotency key, node, time) is committed; ``call`` gets the
        idempotency key (:meth:`idempotency_key`) as its argument when it takes one (a parameter named
        ``idempotency_key``, or a single required positional parameter), and the outbound clients of openroute
        send it on their own (:func:`~openroute.engine.idempotency.current_idempotency_key`).

        A STARTED record found on entry is a call *in doubt*: an earlier attempt began it and recorded no outcome
        (its node died, or the outcome could not be written), so the remote may or may not have acted. With
        ``in_doubt="repeat"`` (default) the call is made again with the same key (a remote that honours the key
        drops the repeat); with ``in_doubt="hold"`` it is not made and :class:`CallInDoubtError` ends the message
        FAILED with error code ``CALL_IN_DOUBT`` for an operator ("mark done" / "call again"). A call that raised
        is recorded FAILED and made again, with the same key, by the next attempt. For an effect in the store's
        own database use :meth:`call_once_in_store`, which is exactly-once.
        """
        return await self._call_once(key, call, in_doubt, None)

    async def _call_once(self, key: str, call: Callable[..., Any], in_doubt: InDoubt, system: str | None) -> Any:
        """:meth:`call_once`; ``system`` names the external system in the call's span."""
        runtime = self._require_runtime()
        _check_key(key)
        hold = _check_in_doubt(in_doubt)
        store = runtime.store
        message_id = self.message.id
        idempotency_key = message_idempotency_key(message_id, self.message.source_system,
                                                  self.message.correlation_id, key)
        previous, started = await runtime.start_call(
            CallStart(message_id, key, idempotency_key, runtime.node_id, runtime.clock.now(), hold))
        if not started:
            assert previous is not None  # noqa: S101  narrows an Optional for mypy: checked above
            if previous.status is ExternalCallStatus.OK:
                return previous.result
            raise CallInDoubtError(key, idempotency_key, f"started by node {previous.node_id} at "
                                   f"{previous.started_at}, no outcome recorded")
        if previous is not None and previous.status is ExternalCallStatus.STARTED:
            log.warning("message %s: call %r was in doubt (started by node %s at %s, no outcome); making it again "
                        "with the same idempotency key %s", message_id, key, previous.node_id, previous.started_at,
                        idempotency_key)
        try:
            result = await _invoke(call, idempotency_key, key, system, message_id)
        except BaseException as error:
            if not isinstance(error, asyncio.CancelledError):  # cancelled: the STARTED record stays (in doubt)
                text = mask_secrets(f"{type(error).__name__}: {error}")  # shown to operators
                ended = runtime.clock.now()
                if isinstance(error, CircuitOpenError):  # refused by the breaker: not made, not an attempt
                    await asyncio.shield(runtime.write(
                        lambda connection: store.calls.refused(message_id, key, ended, text, connection)))
                else:
                    await asyncio.shield(runtime.end_call(CallEnd(message_id, key, False, ended, error=text)))
            raise
        await runtime.end_call(CallEnd(message_id, key, True, runtime.clock.now(), result=_json_or_none(result)))
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
                previous = store.calls.get(self.message.id, key, connection)
                if previous is not None and previous.status is ExternalCallStatus.OK:
                    return previous.result
                result = effect(connection)
                store.calls.record(
                    self.message.id, key, ExternalCallStatus.OK, runtime.clock.now(),
                    result=_json_or_none(result), connection=connection,
                )
                return result

        return await runtime.run_db(work)

    async def ext_call(
        self,
        key: str,
        call: Callable[..., Any],
        *,
        scope: ExtCallScope | Literal["message", "entity"] | None = None,
        in_doubt: InDoubt = "repeat",
        system: str | None = None,
    ) -> Any:
        """Call an external system idempotently: at most one success per (message, ``key``) or per
        (entity type + object id, ``key``) with ``scope="entity"`` (default: the route's ``ext_call_scope``).

        A success recorded by an earlier attempt (of this message, or with entity scope of any message of the
        same entity) is not repeated: its recorded JSON result is returned. The call carries a stable idempotency
        key (:meth:`idempotency_key`; handed to ``call`` when it takes a parameter, see :meth:`call_once`) and is
        recorded as started, committed, before it is made; ``in_doubt`` says what a later attempt does with a call
        that was started and never finished: ``"repeat"`` it with the same key (default) or ``"hold"`` the message
        for an operator (:meth:`call_once`). With entity scope the record is taken IN_PROGRESS before the call, so
        a concurrent duplicate call for the same entity and key is not made: that attempt fails technically (code
        EXT_CALL_IN_PROGRESS) and is retried per the policy; an IN_PROGRESS record left by a dead attempt is the
        call in doubt. A message without an object id has no entity: entity scope then falls back to message scope.

        ``system`` names the external system called (``[external_systems.NAME]``): its circuit breaker may refuse the
        call (:class:`~openroute.definitions.errors.CircuitOpenError`: the message is POSTPONED, no attempt counted) and
        the call is recorded when its call records are on (docs/outage.md).
        """
        if system is not None:
            call = self._guarded(system, key, call)
        entity = self._entity_scoped(scope)
        hold = _check_in_doubt(in_doubt)
        if not entity:
            return await self._call_once(key, call, in_doubt, system)
        runtime = self._require_runtime()
        _check_key(key)
        message = self.message
        entity_type = message.entity_type or message.operation
        object_id = message.object_id
        assert object_id is not None  # noqa: S101  narrows an Optional for mypy: checked above
        idempotency_key = entity_idempotency_key(entity_type, object_id, key)
        store = runtime.store
        now = runtime.clock.now()
        stale_before = now - runtime.processing_lease
        status, recorded = await runtime.run_db(
            lambda: store.calls.begin_entity(entity_type, object_id, key, message.id, now, stale_before,
                                            hold_in_doubt=hold)
        )
        if status == EntityCallStatus.DONE:
            return recorded
        if status == EntityCallStatus.BUSY:
            raise TechnicalError(
                f"call {key!r} for {entity_type} {object_id} is being made by another message",
                code=ErrorCode.EXT_CALL_IN_PROGRESS.value,
            )
        if status == EntityCallStatus.IN_DOUBT:
            raise CallInDoubtError(key, idempotency_key, f"{entity_type} {object_id}: an earlier attempt took the "
                                   "call and recorded no outcome")
        try:
            result = await _invoke(call, idempotency_key, key, system, message.id)
        except BaseException as error:
            text = mask_secrets(f"{type(error).__name__}: {error}")  # shown to operators
            if isinstance(error, CircuitOpenError):  # refused by the breaker: not made, not an attempt
                await asyncio.shield(runtime.run_db(
                    lambda: store.calls.refused_entity(entity_type, object_id, key, message.id,
                                                       runtime.clock.now(), text)))
            else:
                await asyncio.shield(runtime.run_db(
                    lambda: store.calls.finish_entity(entity_type, object_id, key, message.id, False,
                                                     runtime.clock.now(), error=text)))
            raise
        stored = _json_or_none(result)
        await runtime.run_db(
            lambda: store.calls.finish_entity(entity_type, object_id, key, message.id, True, runtime.clock.now(),
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
        # a child's spans hang under the step that split it (tracing off: the parent's stored context, if any)
        traceparent = (tracing.current_traceparent() if tracing.ENABLED else None) or parent.traceparent
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
            ).to_new_message(now, parent_id=parent.id, traceparent=traceparent))
        if not batch:
            return []
        outcomes = await runtime.run_db(lambda: _store_children(runtime.store, batch, runtime.node_id))
        ids = [outcome.message.id for outcome in outcomes]
        self.children.extend(i for i in ids if i not in self.children)
        return ids

    def _guarded(self, system: str, key: str, call: Callable[..., Any]) -> Callable[[], Any]:
        """``call`` behind the breaker and the records of ``system`` (made as it is when the engine has no guard)."""
        if not isinstance(system, str) or not system:
            raise ValueError(f"system must be a non-empty name, got {system!r}")
        runtime = self._require_runtime()
        guard = runtime.calls
        if guard is None:
            _warn_unguarded(system)
            return call
        message = self.message
        record = runtime.add_call_record

        def keyed() -> Any:  # the guard makes a call of no argument: the key is handed on as _invoke would
            how = _key_parameter(call)
            if how is None:
                return call()
            idempotency_key = current_idempotency_key()
            return call(idempotency_key=idempotency_key) if how == "keyword" else call(idempotency_key)

        async def guarded() -> Any:
            try:
                return await guard.guard(system, key, message, keyed, record=record)
            except (BusinessError, ValidationError, CircuitOpenError):
                raise  # an answer, or a call not made: not a failure of the system
            except Exception:
                self.failed_on = system
                raise

        return guarded

    def _require_runtime(self) -> AttemptRuntime:
        if self.runtime is None:
            raise RuntimeError("this exchange is not attached to an engine")
        return self.runtime


_SCOPES = tuple(ExtCallScope)  # a tuple: an unhashable scope is refused with the ValueError, not a TypeError


def _store_children(store: MessageStore, batch: list[NewMessage], node_id: str) -> list[Any]:
    """Insert child messages in one transaction (duplicates of an earlier split are reported, not stored)."""
    with store.begin() as connection:
        return list(store.insert_messages(batch, connection, node_id=node_id))


def _check_in_doubt(in_doubt: str) -> bool:
    """True for ``"hold"``, False for ``"repeat"``; ``ValueError`` for anything else."""
    if in_doubt not in ("repeat", "hold"):
        raise ValueError(f"in_doubt must be 'repeat' or 'hold', got {in_doubt!r}")
    return in_doubt == "hold"


# How a plain function takes the key, by its code and its number of defaults (all its signature depends on, unless
# it carries __wrapped__ or __signature__, hence only functions without attributes): a route builds its call as a
# fresh closure per message, and inspect.signature costs ~15 us each time.
_KEY_PARAMETERS: dict[tuple[CodeType, int], str | None] = {}


def _key_parameter(call: Callable[..., Any]) -> str | None:
    """How ``call`` takes the idempotency key: "keyword", "positional" or None (it takes no argument)."""
    if type(call) is FunctionType and not call.__dict__:
        shape = (call.__code__, len(call.__defaults__ or ()))
        try:
            return _KEY_PARAMETERS[shape]
        except KeyError:
            how = _KEY_PARAMETERS[shape] = _read_key_parameter(call)
            return how
    return _read_key_parameter(call)


def _read_key_parameter(call: Callable[..., Any]) -> str | None:
    try:
        parameters = inspect.signature(call).parameters
    except (TypeError, ValueError):  # a builtin without a signature: called without the key
        return None
    named = parameters.get("idempotency_key")
    if named is not None and named.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY):
        return "keyword"
    positional = [p for p in parameters.values()
                  if p.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
                  and p.default is inspect.Parameter.empty]
    return "positional" if len(positional) == 1 else None


async def _invoke(call: Callable[..., Any], idempotency_key: str, key: str, system: str | None,
                  message_id: int) -> Any:
    """Run ``call`` (sync or async) with ``idempotency_key`` as the current key, handed to it if it takes it; while
    tracing is on, in the span of call ``key`` to ``system`` (the shipped clients send it as the traceparent)."""
    if tracing.ENABLED:
        with tracing.call_span(key, system, idempotency_key, message_id):
            return await _invoke_keyed(call, idempotency_key)
    return await _invoke_keyed(call, idempotency_key)


async def _invoke_keyed(call: Callable[..., Any], idempotency_key: str) -> Any:
    with using_idempotency_key(idempotency_key):
        how = _key_parameter(call)
        if how == "keyword":
            result = call(idempotency_key=idempotency_key)
        elif how == "positional":
            result = call(idempotency_key)
        else:
            result = call()
        if inspect.isawaitable(result):
            result = await result
    return result


_UNGUARDED: set[str] = set()


def _warn_unguarded(system: str) -> None:
    if system not in _UNGUARDED:
        _UNGUARDED.add(system)
        logging.getLogger("openroute.outbound").warning(
            "calls to %s are made without breaker or records: the engine has no external systems (external_calls)",
            system)


def _check_key(key: str) -> None:
    if not isinstance(key, str) or not key or len(key) > 255:
        raise ValueError(f"a call key must be a non-empty string of at most 255 characters, got {key!r}")


def _json_or_none(value: Any) -> Any:
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return None
    return value
