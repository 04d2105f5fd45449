"""A reusable chain of processing steps (a sub-route): :func:`steps` starts one, a route ``.call()``\\ s it, and
:class:`~openroute.dsl.RouteBuilder` extends it with what a whole route needs.

::

    from openroute import route, steps

    enrich = steps().process(load_customer).ext_call("crm", fetch_contract)
    set_customer = route("crm", "setCustomer").json().call(enrich).process(store)
"""

from __future__ import annotations

import dataclasses
import inspect
import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, Self

from openroute.definitions.child import ChildMessage
from openroute.definitions.errors import DeploymentError
from openroute.definitions.route import ExtCallScope, Step

__all__ = ["Steps", "steps"]

ChildSpec = ChildMessage | str | Mapping[str, Any]

#: what a step receives: the attempt's :class:`openroute.Exchange` (typed ``Any`` here, as ``Step`` in
#: :mod:`openroute.definitions.route`, so that definitions do not import the runtime)
_Exchange = Any


def _takes_idempotency_key(function: Callable[..., Any]) -> bool:
    """Whether ``function`` has a parameter ``idempotency_key`` that can be passed by keyword."""
    try:
        parameter = inspect.signature(function).parameters.get("idempotency_key")
    except (TypeError, ValueError):
        return False
    return parameter is not None and parameter.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                                        inspect.Parameter.KEYWORD_ONLY)


def _named(function: Callable[..., Any], name: str) -> Callable[..., Any]:
    function.__name__ = name
    function.__qualname__ = name
    return function


@dataclass(frozen=True)
class Steps:
    """A reusable chain of processing steps (a sub-route), inlined where a route ``.call()``\\ s it."""

    #: a whole route (:class:`~openroute.dsl.RouteBuilder`) cannot be called as a sub-route
    is_route: ClassVar[bool] = False

    chain: tuple[Step, ...] = ()
    child_routes: tuple[tuple[str, str], ...] = ()

    @property
    def _what(self) -> str:
        """How error messages name this definition."""
        return "sub-route"

    def _with_step(self, step: Step, child: tuple[str, str] | None = None) -> Self:
        children = self.child_routes + ((child,) if child is not None and child not in self.child_routes else ())
        return dataclasses.replace(self, chain=(*self.chain, step), child_routes=children)

    def process(self, function: Callable[[_Exchange], Any], name: str | None = None) -> Self:
        """A step: ``function(exchange)``, plain or async; its return value becomes ``exchange.result``."""
        if not callable(function):
            raise DeploymentError(f"{self._what}: process: {function!r} is not callable")
        if name is None:
            return self._with_step(function)

        async def step(exchange: _Exchange) -> Any:
            result = function(exchange)
            return await result if inspect.isawaitable(result) else result

        return self._with_step(_named(step, name))

    def ext_call(
        self,
        key: str,
        function: Callable[[_Exchange], Any],
        *,
        scope: ExtCallScope | Literal["message", "entity"] | None = None,
        in_doubt: Literal["repeat", "hold"] = "repeat",
        system: str | None = None,
    ) -> Self:
        """A step calling an external system once (``Exchange.ext_call``): skipped when an earlier attempt
        succeeded. The result is kept in ``exchange.metadata["ext_calls"][key]`` for later steps.

        ``function(exchange)`` gets the call's idempotency key as ``idempotency_key=`` when it has a parameter of
        that name (it can also ask ``exchange.idempotency_key(key)``); ``in_doubt`` says what happens to a call an
        earlier attempt started and never finished: ``"repeat"`` it with the same key or ``"hold"`` the message for
        an operator. ``system`` names the system called (``[external_systems.NAME]`` in openroute.toml): its circuit
        breaker and call records apply (docs/outage.md)."""
        if not isinstance(key, str) or not key or len(key) > 255:
            raise DeploymentError(f"{self._what}: ext_call: the key must be a non-empty string of at most 255 "
                                  f"characters: {key!r}")
        if not callable(function):
            raise DeploymentError(f"{self._what}: ext_call {key!r}: {function!r} is not callable")
        if scope is not None and scope not in tuple(ExtCallScope):
            raise DeploymentError(f"{self._what}: ext_call {key!r}: scope must be 'message' or 'entity', got {scope!r}")
        if system is not None and (not isinstance(system, str) or not system or len(system) > 100):
            raise DeploymentError(f"{self._what}: ext_call {key!r}: system must be a name of 1-100 characters, "
                                  f"got {system!r}")
        if in_doubt not in ("repeat", "hold"):
            raise DeploymentError(f"{self._what}: ext_call {key!r}: in_doubt must be 'repeat' or 'hold', "
                                  f"got {in_doubt!r}")
        takes_key = _takes_idempotency_key(function)

        async def step(exchange: _Exchange) -> Any:
            call: Callable[..., Any] = (
                (lambda idempotency_key: function(exchange, idempotency_key=idempotency_key))  # type: ignore[call-arg]
                if takes_key
                else (lambda: function(exchange))
            )
            result = await exchange.ext_call(key, call, scope=scope, in_doubt=in_doubt, system=system)
            exchange.metadata.setdefault("ext_calls", {})[key] = result
            return result

        return self._with_step(_named(step, f"ext_call:{key}"))

    def split(self, function: Callable[[_Exchange], Iterable[ChildSpec]], *, into: str | tuple[str, str],
              service: str | None = None) -> Self:
        """A step that splits the message into child messages of the route ``into`` (an operation of the same
        service, or (service, operation)). ``function(exchange)`` returns the children: :class:`ChildMessage`,
        a payload string, or a mapping (sent as JSON). The parent waits for them (see ``Exchange.split``)."""
        if not callable(function):
            raise DeploymentError(f"{self._what}: split: {function!r} is not callable")
        if isinstance(into, tuple):
            if len(into) != 2 or not all(isinstance(part, str) and part for part in into):
                raise DeploymentError(f"{self._what}: split: into must be an operation or (service, operation), "
                                      f"got {into!r}")
            target_service: str | None = into[0]
            operation = into[1]
        elif isinstance(into, str) and into:
            target_service, operation = service, into
        else:
            raise DeploymentError(f"{self._what}: split: into must be an operation or (service, operation), "
                                  f"got {into!r}")

        async def step(exchange: _Exchange) -> list[int]:
            produced = function(exchange)
            if inspect.isawaitable(produced):
                produced = await produced
            chosen = target_service or exchange.message.service
            children = [_child(item, chosen, operation) for item in produced]
            ids: list[int] = await exchange.split(children)
            return ids

        return self._with_step(_named(step, f"split:{operation}"), (target_service or "", operation))

    def call(self, sub_route: Steps) -> Self:
        """Inline the steps of ``sub_route`` (built with :func:`steps`) here."""
        if not isinstance(sub_route, Steps) or sub_route.is_route:
            raise DeploymentError(f"{self._what}: call: expected a sub-route made with steps(), got {sub_route!r}")
        children = self.child_routes + tuple(c for c in sub_route.child_routes if c not in self.child_routes)
        return dataclasses.replace(self, chain=(*self.chain, *sub_route.chain), child_routes=children)


def _child(item: ChildSpec, service: str, operation: str) -> ChildMessage:
    if isinstance(item, ChildMessage):
        return item if item.service else dataclasses.replace(item, service=service)
    if isinstance(item, str):
        return ChildMessage(payload=item, operation=operation, service=service)
    if isinstance(item, Mapping):
        return ChildMessage(payload=json.dumps(item), operation=operation, service=service,
                            content_type="application/json")
    raise TypeError(f"a split function must produce ChildMessage, str or mapping items, got {type(item).__name__}")


def steps() -> Steps:
    """Start a reusable sub-route: ``enrich = steps().process(load).process(check)``; use it with ``.call()``."""
    return Steps()
