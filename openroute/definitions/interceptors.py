"""Message interceptors (the Revents model): an ordered chain around every delivery and around each step.

An interceptor subclasses :class:`MessageInterceptor` and overrides what it needs::

    class Audit(MessageInterceptor):
        async def around_delivery(self, context, call_next):
            context.metadata["received-by"] = "audit"      # enrich: later interceptors and steps see it
            if context.message.source_system == "blocked":
                context.drop("source system is blocked")  # the message ends SKIPPED, code DROPPED
            await call_next()                              # the rest of the chain, then the route's steps
            log.info("delivered %s", context.message.id)   # after

        async def around_step(self, context, call_next):
            started = time.perf_counter()
            try:
                return await call_next()
            finally:
                timings[context.step_name] = time.perf_counter() - started

The engine-wide interceptors (``Engine(..., interceptors=[...])``) run first, then the route's own, in the
order given. An exception raised by an interceptor is a technical error of the attempt (retried per policy).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NoReturn

from openroute.definitions.errors import MessageDroppedByInterceptor

if TYPE_CHECKING:
    from openroute.persistence import StoredMessage

CallNext = Callable[[], Awaitable[Any]]


@dataclass
class InterceptionContext:
    """What an interceptor sees: the message, its exchange and route, the step (None around the delivery).

    ``exchange`` is the attempt's :class:`openroute.Exchange` and ``route`` its :class:`openroute.Route`, typed
    ``Any`` here: interceptors are definitions (a route lists them), and definitions import neither the runtime
    nor, from this module, the route that imports it (no cycle).
    """

    message: StoredMessage
    exchange: Any
    route: Any
    step_name: str | None = None
    #: shared by every interceptor and step of one delivery (also reachable as ``exchange.metadata``)
    metadata: dict[str, Any] = field(default_factory=dict)

    def drop(self, reason: str) -> NoReturn:
        """Stop this delivery: the message ends SKIPPED with error code DROPPED and ``reason`` stored."""
        if not isinstance(reason, str) or not reason.strip():
            raise ValueError("a drop needs a reason (it is stored with the message)")
        raise MessageDroppedByInterceptor(reason)


class MessageInterceptor:
    """Base class of interceptors; both hooks pass through unless overridden."""

    async def around_delivery(self, context: InterceptionContext, call_next: CallNext) -> None:
        """Wraps the whole run of the route's steps for one attempt of one message."""
        await call_next()

    async def around_step(self, context: InterceptionContext, call_next: CallNext) -> Any:
        """Wraps one step; returns the step's result (an interceptor may replace it)."""
        return await call_next()


def check_interceptors(interceptors: Sequence[Any], where: str) -> tuple[MessageInterceptor, ...]:
    """Validate a sequence of interceptors (``where`` names the owner in the error)."""
    from openroute.definitions.errors import ConfigurationError

    if isinstance(interceptors, str | bytes) or not isinstance(interceptors, Sequence):
        raise ConfigurationError(f"{where}: interceptors must be a sequence of MessageInterceptor")
    for interceptor in interceptors:
        if not isinstance(interceptor, MessageInterceptor):
            raise ConfigurationError(f"{where}: {interceptor!r} is not a MessageInterceptor")
    return tuple(interceptors)


async def run_chain(
    interceptors: Sequence[MessageInterceptor],
    hook: str,
    context: InterceptionContext,
    last: CallNext,
) -> Any:
    """Call ``hook`` of each interceptor in order, each wrapping the next; ``last`` is the wrapped work."""

    async def call(index: int) -> Any:
        if index == len(interceptors):
            return await last()
        return await getattr(interceptors[index], hook)(context, lambda: call(index + 1))

    return await call(0)
