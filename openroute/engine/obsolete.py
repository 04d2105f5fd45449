"""The obsolete check: a claimed message whose entity already has a newer message that ended OK ends SKIPPED without
running its steps (the funnel's turn is taken earlier, in the claim: ``engine/funnel.py``)."""

from __future__ import annotations

from dataclasses import dataclass

from openroute.definitions.clock import Clock
from openroute.definitions.route import Route
from openroute.engine import outcome as outcomes
from openroute.engine.pipeline import CommitPipeline
from openroute.engine.reads import StoreReads
from openroute.persistence import MessageStore, StoredMessage

__all__ = ["ObsoleteCheck"]


@dataclass(frozen=True, eq=False)
class ObsoleteCheck:
    """The obsolete check of one node: its read runs on the node's ``reads`` threads, a skip goes through the commit
    ``pipeline``."""

    store: MessageStore
    clock: Clock
    reads: StoreReads
    pipeline: CommitPipeline

    @staticmethod
    def applies(message: StoredMessage, route: Route) -> bool:
        """Whether ``message`` is checked: an obsolete-checking route and an object id (most messages are not, and a
        coroutine per message is not free)."""
        return route.obsolete_check and message.object_id is not None

    async def skipped(self, message: StoredMessage) -> StoredMessage | None:
        """The SKIPPED snapshot when a newer message of ``message``'s entity ended OK, else None (it runs)."""
        if not await self.reads.run(lambda: self.store.newer_ok_exists(message)):
            return None
        skipped = await self.pipeline.apply(message, outcomes.obsolete(message), self.clock.now())
        return skipped if skipped is not None else message
