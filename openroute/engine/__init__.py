"""The message lifecycle engine: accept, queue, claim, process, outcome, retry, repoll."""

from openroute.engine.core import (
    AcceptResult,
    Engine,
    EngineSettings,
    EngineStats,
    FinalStateHook,
    FinalStateTxHook,
    InboundMessage,
    default_node_id,
)

__all__ = [
    "AcceptResult",
    "Engine",
    "EngineSettings",
    "EngineStats",
    "FinalStateHook",
    "FinalStateTxHook",
    "InboundMessage",
    "default_node_id",
]
