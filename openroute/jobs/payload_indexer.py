"""The node's share of indexing payloads for the payload search, behind the commit (PostgreSQL).

Stored messages wait in ``message_payload_pending`` until a node copies their payload into the indexed
``message_payload_text`` (:mod:`openroute.persistence.payload_index`, migration 0018). Every node runs a
:class:`PayloadIndexer` in its lifespan (started by the server, like the counts' fold): every ``interval`` seconds
it moves batches until fewer than a batch are pending. Nodes share the work without waiting for each other, and a
payload search finds a pending message too (it checks their payloads), so the indexer's pace decides how many
payloads a search reads directly, never whether it finds them. ``/metrics`` shows how many are pending
(``openroute_payload_index_pending``)::

    indexer = PayloadIndexer(store)
    moved = indexer.catch_up()  # what one pass does: every pending message copied (0 on SQLite)
"""

from __future__ import annotations

import asyncio
import logging
import threading

from openroute.definitions.errors import ConfigurationError
from openroute.persistence import MessageStore
from openroute.persistence.outage import StoreOutage, run_passes
from openroute.runtime.logs import repeated_errors

log = logging.getLogger(__name__)

#: the log line of a pass that failed for another reason than an unreachable store
FAILURE = "indexing the stored payloads failed; tried again at the next interval"

#: most batches one pass moves before it lets the loop look at its stop event (a pass of a long backlog ends early
#: and the next one goes on)
MAX_BATCHES_PER_PASS = 50


class PayloadIndexer:
    """Copies the pending payloads of ``store`` into the payload search's index every ``interval`` seconds."""

    def __init__(self, store: MessageStore, interval: float = 0.5) -> None:
        if interval <= 0:
            raise ConfigurationError(f"the payload indexer's interval must be > 0 seconds, got {interval}")
        self.store = store
        self.interval = interval
        #: whether the indexing loop finds the store unreachable
        self.outage = StoreOutage.of_loop("payload indexer")
        self._stopping = threading.Event()

    def catch_up(self) -> int:
        """Move batches until fewer than a batch were pending (at most :data:`MAX_BATCHES_PER_PASS`): how many
        messages were copied. Blocking: call it in a worker thread from a loop."""
        index = self.store.payload_index
        if not index.postgresql:
            return 0
        moved = 0
        for _ in range(MAX_BATCHES_PER_PASS):
            taken = index.move()
            moved += taken
            if taken < index.batch or self._stopping.is_set():
                break
        return moved

    async def run(self, stop: asyncio.Event) -> None:
        """:meth:`catch_up` every ``interval`` seconds until ``stop`` is set (in a worker thread; outages logged
        once). Nothing to do on SQLite: returns at once."""
        if not self.store.payload_index.postgresql:
            return
        self._stopping.clear()  # an indexer may run again after a stop (an app's lifespan entered twice)
        watcher = asyncio.create_task(self._watch(stop))
        try:
            # a failure that repeats every pass (a table the store's schema lacks) shows its traceback once a minute
            await run_passes(
                lambda: asyncio.to_thread(self.catch_up),
                self.interval,
                stop,
                self.outage,
                FAILURE,
                log,
                lambda error: repeated_errors.log(log, FAILURE, error=error),
            )
        finally:
            watcher.cancel()

    async def _watch(self, stop: asyncio.Event) -> None:
        """Tell a pass running in its thread that the loop stops, so it ends after its batch."""
        await stop.wait()
        self._stopping.set()
