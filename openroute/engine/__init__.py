"""The message engine: the runtime of routes (accept, queue, claim, process, outcome, retry, repoll).

``core.py`` is the node (:class:`Engine`, assembled around the processing queue, ``queue.py``, and the commit
pipeline, ``pipeline.py``), ``exchange.py`` what one attempt of a route does (:class:`Exchange`), ``outcome.py`` the
rules that decide a message's next state; ``_writer.py`` (internal) groups the writes.
"""

from openroute.engine.accept import AcceptResult
from openroute.engine.core import Engine
from openroute.engine.exchange import AttemptRuntime, ChildMessage, Exchange
from openroute.engine.pipeline import FinalStateHook
from openroute.engine.settings import EngineSettings, EngineStats, default_node_id
from openroute.engine.writes import FinalStatesTxHook, FinalStateTxHook

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
    "FinalStatesTxHook",
    "default_node_id",
]
