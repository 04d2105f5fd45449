"""The patterns that hold a claimed message back before its steps run: the obsolete check (a newer message of the
same entity already ended OK: SKIPPED) and the funnel (another message of its funnel value is PROCESSING, or, with
guaranteed order, an older one is not final: POSTPONED until the funnel frees)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from openroute.clock import Clock
from openroute.engine import outcome as outcomes
from openroute.engine._funnel_wake import FunnelWake
from openroute.engine._writer import GroupCommitWriter
from openroute.engine.writes import EngineWrites
from openroute.persistence import MessageStore, StoredMessage
from openroute.route import Route

__all__ = ["HoldBack"]

#: ``apply(message, decision, now)``: the engine writes a decision; None when another writer was first
Apply = Callable[[StoredMessage, outcomes.Decision, datetime], Awaitable[StoredMessage | None]]


@dataclass(frozen=True, eq=False)
class HoldBack:
    """Obsolete check and funnel of one node; ``run_db`` runs a read on the engine's database threads."""

    store: MessageStore
    clock: Clock
    postpone_interval: timedelta
    writes: EngineWrites
    writer: GroupCommitWriter
    funnel_wake: FunnelWake
    run_db: Callable[[Callable[[], Any]], Awaitable[Any]]
    apply: Apply

    async def check(self, message: StoredMessage, route: Route) -> StoredMessage | None:
        """Obsolete check and funnel, before the steps: the new snapshot if the message does not run now.

        The engine calls it only when one of them applies (an obsolete-checking route and an object id, or a
        funnel value): most messages have neither, and a coroutine per message is not free."""
        now = self.clock.now()
        if (route.obsolete_check and message.object_id is not None
                and await self.run_db(lambda: self.store.newer_ok_exists(message))):
            self.writes.funnels_taken.pop(message.id, None)  # SKIPPED frees the funnel it may have taken
            return await self.apply(message, outcomes.obsolete(message), now)
        funnel = message.funnel_value
        if funnel is None:
            return None
        blocker: int | None = None
        if message.id in self.writes.funnels_taken:  # taken in the claim's transaction
            blocker = self.writes.funnels_taken.pop(message.id)
        else:
            if route.guaranteed_order:
                blocker = await self.run_db(lambda: self.store.funnels.older_unfinished(message))
            if blocker is None:
                blocker = await self.writer.submit(lambda c: self.store.funnels.acquire(funnel, message.id, now, c))
        if blocker is None:
            return None
        decision = outcomes.held_by_funnel(funnel, blocker, now, self.postpone_interval)
        held = await self.apply(message, decision, now)
        if held is None:
            return message
        self.funnel_wake.held(held, blocker)
        return held

    async def unclaim_woken(self, message: StoredMessage) -> None:
        """A message claimed by its funnel's release could not be queued (no room, stopping): POSTPONED again, due at
        once, for repoll."""
        if message.id not in self.writes.preclaimed:
            return
        self.writes.preclaimed.discard(message.id)
        self.writes.funnels_taken.pop(message.id, None)
        now = self.clock.now()
        decision = outcomes.held_by_funnel(message.funnel_value or "", message.id, now, timedelta(0))
        await self.apply(message, decision, now)
