"""The message lifecycle engine: accept, queue, claim, process, outcome, retry, repoll."""

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
from openroute.message import InboundMessage

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
    "InboundMessage",
    "default_node_id",
]
