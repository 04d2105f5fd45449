"""What follows a committed state change on the event loop: counters, transition listeners, final-state hooks, and
the parent a child's final change completed, the message a funnel's release handed the funnel to."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from openroute.definitions.errors import StaleMessageError
from openroute.engine import states
from openroute.engine.funnel import FunnelQueue
from openroute.engine.settings import EngineStats
from openroute.engine.writes import EngineWrites
from openroute.persistence import MessageState, StoredMessage
from openroute.runtime.logs import repeated_errors

__all__ = ["AfterCommit", "FinalStateHook", "TransitionListener"]

log = logging.getLogger("openroute.engine")

FinalStateHook = Callable[[StoredMessage], Awaitable[None]]
#: ``listener(previous_state, message)`` after a committed change (previous None: just accepted)
TransitionListener = Callable[["MessageState | None", StoredMessage], None]


@dataclass(frozen=True, eq=False)
class AfterCommit:
    """The follow-up of one node's committed changes; ``final_state_hooks`` and ``transition_listeners`` are the
    engine's own lists (read at each change, so hooks added later are heard)."""

    stats: EngineStats
    writes: EngineWrites
    funnel: FunnelQueue
    final_state_hooks: list[FinalStateHook]
    transition_listeners: list[TransitionListener]

    async def written(
        self, message: StoredMessage, target: MessageState, written: asyncio.Future[StoredMessage]
    ) -> StoredMessage | None:
        """The rest of a transition once ``written`` (the writer's future of it) is settled: counters, listeners,
        final-state hooks, a parent the change completed; None when another writer changed the message first."""
        final = states.is_final(target)
        try:
            updated = await written
        except StaleMessageError:
            # a repoll on another node repaired it meanwhile (lease too short for this route?)
            self.writes.completed_parents.pop(message.id, None)  # left by a group that was rolled back
            self.funnel.discard(message.id)
            self.stats.stale_writes += 1
            log.warning("outcome %s of message %s lost: another writer changed it first", target.value, message.id)
            return None
        except BaseException:
            self.writes.completed_parents.pop(message.id, None)
            self.funnel.discard(message.id)
            raise
        self.stats.outcomes[target] += 1
        self.notify(message.state, updated)
        if updated.funnel_value is not None:
            self.funnel.committed(updated)
        parent = self.writes.completed_parents.pop(updated.id, None)
        if final:
            await self.run_final_hooks(updated)
        if parent is not None:
            await self.parent_completed(parent)
        return updated

    async def parent_completed(self, parent: StoredMessage) -> None:
        """A parent left WAITING_FOR_CHILDREN for its final state (committed)."""
        self.stats.outcomes[parent.state] += 1
        self.notify(MessageState.WAITING_FOR_CHILDREN, parent)
        if parent.funnel_value is not None:
            self.funnel.committed(parent)
        await self.run_final_hooks(parent)

    def notify(self, previous: MessageState | None, message: StoredMessage) -> None:
        """Tell the transition listeners (a failing listener is logged, the others still hear it)."""
        for listener in self.transition_listeners:
            try:
                listener(previous, message)
            except Exception as error:  # a listener's bug would fail every message: its traceback once a minute
                repeated_errors.log(log, "transition listener %r failed for message %s", listener, message.id,
                                    error=error)

    async def run_final_hooks(self, message: StoredMessage) -> None:
        """Await the final-state hooks of ``message`` (a failing hook is logged, the others still run)."""
        for hook in self.final_state_hooks:
            try:
                await hook(message)
            except Exception as error:
                repeated_errors.log(log, "final-state hook %r failed for message %s", hook, message.id, error=error)
