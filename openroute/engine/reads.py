"""The store reads of one node: blocking store work run off the event loop on a small thread pool of its own.

The writes of the hot path go through the commit pipeline (``pipeline.py``); what is read (a message, its children,
the stuck and parked ones) and the node's bookkeeping that needs no group commit (register, heartbeat, parking's
release) run here, so the event loop never waits for the database.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

__all__ = ["StoreReads"]

T = TypeVar("T")


class StoreReads:
    """Runs blocking store work of one node on ``threads`` threads named after the node."""

    def __init__(self, threads: int, node_id: str) -> None:
        self._executor = ThreadPoolExecutor(threads, thread_name_prefix=f"openroute-db-{node_id}")

    async def run(self, work: Callable[[], T]) -> T:
        """Run ``work()`` on one of the threads; its result (or its exception)."""
        return await asyncio.get_running_loop().run_in_executor(self._executor, work)

    def close(self) -> None:
        """Let the work under way finish and stop the threads."""
        self._executor.shutdown(wait=True)
