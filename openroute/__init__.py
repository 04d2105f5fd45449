"""openroute: asynchronous enterprise messaging on reactive, back-pressured channels.

Route authors import from here alone::

    from openroute import Application, BusinessError, Exchange, RetryPolicy, route, steps

Everything listed in ``__all__`` is public (``tests/test_public_api.py`` pins the list); modules whose name
starts with ``_`` are internal. docs/architecture.md says where each concept lives.
"""

from openroute.binding import ParsedPayload
from openroute.clock import Clock, ManualClock, SystemClock
from openroute.dsl import Application, RouteBuilder, RouteDefinition, Steps, parsed, route, steps
from openroute.engine.core import Engine, EngineSettings
from openroute.engine.exchange import ChildMessage, Exchange
from openroute.errors import (
    BusinessError,
    ConfigurationError,
    DeploymentError,
    MessageDroppedByInterceptor,
    OpenrouteError,
    TechnicalError,
    ValidationError,
)
from openroute.interceptors import InterceptionContext, MessageInterceptor
from openroute.message import InboundMessage
from openroute.persistence import MessageState
from openroute.retry import RetryPolicy
from openroute.route import ExtCallScope, Route, RouteRegistry, Step

__version__ = "0.1.0"

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
