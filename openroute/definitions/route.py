"""What a route is: the definition the engine runs and the registry that finds it (pure data, no runtime).

A :class:`Route` is (service, operation, steps, retry policy, validator, processing patterns); a step is
``step(exchange)`` returning anything or an awaitable. What one attempt does at runtime (the exchange, its
external calls and splits) lives in :mod:`openroute.engine.exchange`; route authors import both from
``openroute``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Literal

from openroute.definitions.body import Body
from openroute.definitions.errors import ConfigurationError, DeploymentError, UnknownRouteError
from openroute.definitions.interceptors import MessageInterceptor, check_interceptors
from openroute.definitions.message import InboundMessage
from openroute.definitions.retry import ErrorPolicy, RetryPolicy, check_error_policies

__all__ = ["ExtCallScope", "Route", "RouteRegistry", "Step"]

#: a processing step: ``step(exchange)`` returning anything or an awaitable (the exchange is
#: :class:`openroute.Exchange`; typed ``Any`` here so definitions do not import the runtime)
Step = Callable[[Any], Any]



class ExtCallScope(StrEnum):
    """How often an external call of a route is made: once per message, or once per entity (type + object id)."""

    MESSAGE = "message"
    ENTITY = "entity"


@dataclass(frozen=True)
class Route:
    """What to do with messages of one (service, operation).

    ``steps`` run in order for every attempt; ``retry_policy`` overrides the engine's default, and
    ``error_policies`` (:class:`~openroute.definitions.retry.ErrorPolicy`, the first that names the error wins) give the
    errors they name a policy of their own, or none;
    ``validator`` runs at accept time and raises :class:`~openroute.definitions.errors.ValidationError` to refuse
    a message before it is stored.

    The processing patterns (docs/patterns.md):

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
      (:meth:`RouteRegistry.check` checks they exist).

    ``body`` (a :class:`~openroute.definitions.body.Body`) types the payload: accept refuses a payload that does not
    match its model (nothing stored) and the steps read it bound as ``exchange.body``.
    """

    service: str
    operation: str
    steps: Sequence[Step]
    retry_policy: RetryPolicy | None = None
    error_policies: tuple[ErrorPolicy, ...] = ()
    validator: Callable[[InboundMessage], None] | None = None
    obsolete_check: bool = False
    guaranteed_order: bool = False
    continue_on_business_error: bool = False
    business_exceptions: tuple[type[BaseException], ...] = ()
    ext_call_scope: ExtCallScope | Literal["message", "entity"] = ExtCallScope.MESSAGE
    interceptors: Sequence[MessageInterceptor] = ()
    child_routes: tuple[tuple[str, str], ...] = ()
    body: Body | None = None

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
        if self.ext_call_scope not in tuple(ExtCallScope):
            raise ConfigurationError(f"route {self.key}: ext_call_scope must be 'message' or 'entity', "
                                     f"got {self.ext_call_scope!r}")
        exceptions = tuple(self.business_exceptions)
        if not all(isinstance(e, type) and issubclass(e, BaseException) for e in exceptions):
            raise ConfigurationError(f"route {self.key}: business_exceptions must be exception classes")
        object.__setattr__(self, "error_policies", tuple(self.error_policies))
        problems = check_error_policies(self.error_policies, exceptions)
        if problems:
            raise ConfigurationError(f"route {self.service}/{self.operation}: " + "; ".join(problems))
        if self.body is not None and not isinstance(self.body, Body):
            raise ConfigurationError(f"route {self.key}: body must be a Body (made by .body(Model)), got {self.body!r}")
        children = tuple(tuple(key) for key in self.child_routes)
        if not all(len(key) == 2 and all(isinstance(part, str) and part for part in key) for key in children):
            raise ConfigurationError(f"route {self.key}: child_routes must be (service, operation) pairs")
        object.__setattr__(self, "ext_call_scope", ExtCallScope(self.ext_call_scope))
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

    def check(self) -> None:
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
