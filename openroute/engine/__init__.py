"""The message engine: the runtime of routes (accept, queue, claim, process, outcome, retry, repoll).

``core.py`` is the node (:class:`Engine`), ``exchange.py`` what one attempt of a route does (:class:`Exchange`),
``outcome.py`` the rules that decide a message's next state; ``_writer.py`` (internal) groups the writes.
"""

from openroute.engine.core import (
    AcceptResult,
    Engine,
    EngineSettings,
    EngineStats,
    FinalStateHook,
    FinalStateTxHook,
    default_node_id,
)
from openroute.engine.exchange import AttemptRuntime, ChildMessage, Exchange

__all__ = [
    "AcceptResult",
    "AttemptRuntime",
    "ChildMessage",
    "Engine",
    "EngineSettings",
    "EngineStats",
    "Exchange",
    "FinalStateHook",
    "FinalStateTxHook",
    "default_node_id",
]
