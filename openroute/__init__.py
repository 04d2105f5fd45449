"""openroute: asynchronous enterprise messaging on reactive, back-pressured channels.

Route authors import from here alone::

    from openroute import Application, BusinessError, Exchange, RetryPolicy, route, steps

Everything listed in ``__all__`` is public (``tests/test_public_api.py`` pins the list); modules whose name
starts with ``_`` are internal. docs/architecture.md says where each concept lives.

The names are loaded on first use (module ``__getattr__``): ``import openroute`` itself imports nothing, so
``import openroute.streams`` (the standard-library-only bottom layer) loads no third-party module.

The root of the package holds the application's entry points (``cli``, ``server``, ``loading``, ``__main__``) and
the DSL (``dsl``); the rest sits in the package of its layer: ``definitions`` (what a route author declares),
``engine`` and ``runtime`` (what runs it), ``wire`` (the HTTP server's protocol), the edges (``inbound``,
``outbound``, ``admin``, ``console``, ``spark``, ``alerts``), ``messaging`` and ``streams``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from openroute.definitions.binding import ParsedPayload
    from openroute.definitions.child import ChildMessage
    from openroute.definitions.clock import Clock, ManualClock, SystemClock
    from openroute.definitions.errors import (
        BusinessError,
        ConfigurationError,
        DeploymentError,
        MessageDroppedByInterceptor,
        OpenrouteError,
        TechnicalError,
        ValidationError,
    )
    from openroute.definitions.interceptors import InterceptionContext, MessageInterceptor
    from openroute.definitions.message import InboundMessage
    from openroute.definitions.retry import RetryPolicy
    from openroute.definitions.route import ExtCallScope, Route, RouteRegistry, Step
    from openroute.definitions.sub_route import Steps, steps
    from openroute.dsl import Application, RouteBuilder, RouteDefinition, parsed, route
    from openroute.engine.core import Engine
    from openroute.engine.exchange import Exchange
    from openroute.engine.settings import EngineSettings
    from openroute.persistence import MessageState
    from openroute.runtime import tracing as tracing  # `from openroute import tracing` (docs/operations.md)

__version__ = "0.1.0"

#: public name -> the module it lives in (loaded by ``__getattr__`` on first use, then cached here)
_HOMES = {
    "ParsedPayload": "openroute.definitions.binding",
    "ChildMessage": "openroute.definitions.child",
    **dict.fromkeys(("Clock", "ManualClock", "SystemClock"), "openroute.definitions.clock"),
    **dict.fromkeys(("Application", "RouteBuilder", "RouteDefinition", "parsed", "route"), "openroute.dsl"),
    "Engine": "openroute.engine.core",
    "EngineSettings": "openroute.engine.settings",
    "Exchange": "openroute.engine.exchange",
    **dict.fromkeys(("BusinessError", "ConfigurationError", "DeploymentError", "MessageDroppedByInterceptor",
                     "OpenrouteError", "TechnicalError", "ValidationError"), "openroute.definitions.errors"),
    **dict.fromkeys(("InterceptionContext", "MessageInterceptor"), "openroute.definitions.interceptors"),
    "InboundMessage": "openroute.definitions.message",
    "MessageState": "openroute.persistence",
    "RetryPolicy": "openroute.definitions.retry",
    **dict.fromkeys(("ExtCallScope", "Route", "RouteRegistry", "Step"), "openroute.definitions.route"),
    **dict.fromkeys(("Steps", "steps"), "openroute.definitions.sub_route"),
}

__all__ = [
    "Application",
    "BusinessError",
    "ChildMessage",
    "Clock",
    "ConfigurationError",
    "DeploymentError",
    "Engine",
    "EngineSettings",
    "Exchange",
    "ExtCallScope",
    "InboundMessage",
    "InterceptionContext",
    "ManualClock",
    "MessageDroppedByInterceptor",
    "MessageInterceptor",
    "MessageState",
    "OpenrouteError",
    "ParsedPayload",
    "RetryPolicy",
    "Route",
    "RouteBuilder",
    "RouteDefinition",
    "RouteRegistry",
    "Step",
    "Steps",
    "SystemClock",
    "TechnicalError",
    "ValidationError",
    "__version__",
    "parsed",
    "route",
    "steps",
]


#: modules used on their own that the docs import from the root (``from openroute import tracing``)
_MODULES = {"tracing": "openroute.runtime.tracing"}


def __getattr__(name: str) -> Any:
    """Load a public name from its home module on first use (``AttributeError`` for an unknown name)."""
    if name in _MODULES:
        value: Any = importlib.import_module(_MODULES[name])
        globals()[name] = value
        return value
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))

