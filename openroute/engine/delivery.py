"""Delivery of one attempt: the route's steps run on an exchange, wrapped by the interceptor chains.

A step's exception is the attempt's outcome, except a business error of a route that continues on them, which is
recorded on the exchange (``exchange.business_errors``) before the next step runs.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable
from typing import Any

from openroute.definitions.errors import BusinessError, MessageDroppedByInterceptor
from openroute.definitions.interceptors import InterceptionContext, MessageInterceptor, run_chain
from openroute.definitions.route import Route
from openroute.engine.exchange import Exchange
from openroute.runtime import tracing

__all__ = ["deliver"]


def deliver(route: Route, exchange: Exchange,
            engine_interceptors: tuple[MessageInterceptor, ...]) -> Awaitable[None] | None:
    """Run the route's steps, wrapped by the interceptor chains (engine-wide first, then the route's): None when they
    ran to their end here (no interceptor and no step that waits: no coroutine for most attempts), else the awaitable
    of the rest of the delivery. A step's error that ends the attempt is raised by this call or by that awaitable."""
    if engine_interceptors or route.interceptors or tracing.ENABLED:
        interceptors = (*engine_interceptors, *route.interceptors)
        if tracing.ENABLED:  # the step spans sit innermost, around the step alone
            interceptors = (*interceptors, tracing.STEP_SPANS)
        return _intercepted(route, exchange, interceptors)
    # the common case: nothing to wrap, so no chain and no closure per step
    for index, step in enumerate(route.steps):
        try:
            result = step(exchange)
            if result is not None and inspect.isawaitable(result):
                return _rest(route, exchange, index, result)
            exchange.result = result
        except Exception as caught:
            _continue_or_raise(caught, route, exchange)
    return None


async def _rest(route: Route, exchange: Exchange, index: int, waiting: Awaitable[Any]) -> None:
    """The rest of an unintercepted delivery from step ``index``, whose result ``waiting`` is to be awaited."""
    try:
        exchange.result = await waiting
    except Exception as caught:
        _continue_or_raise(caught, route, exchange)
    for step in route.steps[index + 1:]:
        try:
            result = step(exchange)
            if result is not None and inspect.isawaitable(result):
                result = await result
            exchange.result = result
        except Exception as caught:
            _continue_or_raise(caught, route, exchange)


async def _intercepted(route: Route, exchange: Exchange, interceptors: tuple[MessageInterceptor, ...]) -> None:
    """The steps of ``route`` wrapped by the ``interceptors``' chains."""

    async def run_steps() -> None:
        for index, step in enumerate(route.steps):
            async def run_one(step: Any = step) -> Any:
                result = step(exchange)
                if inspect.isawaitable(result):
                    result = await result
                return result

            context = InterceptionContext(exchange.message, exchange, route, _step_name(step, index),
                                          exchange.metadata)
            try:
                exchange.result = await run_chain(interceptors, "around_step", context, run_one)
            except Exception as caught:
                _continue_or_raise(caught, route, exchange)

    context = InterceptionContext(exchange.message, exchange, route, None, exchange.metadata)
    await run_chain(interceptors, "around_delivery", context, run_steps)


def _step_name(step: Any, index: int) -> str:
    return str(getattr(step, "step_name", None) or getattr(step, "__name__", None) or f"step-{index + 1}")


def _continue_or_raise(caught: Exception, route: Route, exchange: Exchange) -> None:
    """A step failed with ``caught``: record a business error the route continues on, raise anything else."""
    if isinstance(caught, MessageDroppedByInterceptor):
        raise caught
    business = _as_business_error(caught, route)
    if business is None:
        raise caught
    if not route.continue_on_business_error:
        raise business from caught
    exchange.business_errors.append(business.to_dict())


def _as_business_error(error: BaseException, route: Route) -> BusinessError | None:
    if isinstance(error, BusinessError):
        return error
    if route.business_exceptions and isinstance(error, route.business_exceptions):
        return BusinessError(type(error).__name__, str(error))
    return None
