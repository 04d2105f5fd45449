"""What the engine's group-commit writer does inside one transaction: claims, outcomes and what goes with them.

A claim decides the funnel turn of each funnel message in its own transaction (it takes the funnel, or it waits in
the funnel's queue without running, :class:`~openroute.engine.funnel.FunnelQueue`); the feeder's claim reads the
ready messages in the same transaction; an outcome that makes a message final runs the final-state transaction hooks
and ends a parent whose last child it was; an outcome that frees a funnel hands it to the next message. Every method
here runs in the writer thread, on the connection of the transaction it joins; the event loop reads what they leave
(:attr:`EngineWrites.completed_parents`, the funnel's hand-offs) once the commit is known.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import sqlalchemy as sa

from openroute import states
from openroute.clock import Clock
from openroute.engine import outcome as outcomes
from openroute.engine._writer import Failure
from openroute.engine.funnel import FunnelQueue
from openroute.errors import IllegalTransitionError
from openroute.persistence import MessageState, MessageStore, StoredMessage

__all__ = ["EngineWrites", "FinalStateTxHook"]

FinalStateTxHook = Callable[[StoredMessage, sa.Connection], None]


@dataclass(frozen=True, eq=False)
class EngineWrites:
    """The transactional work of one node's writer (see the module docstring).

    ``final_state_tx_hooks`` is the engine's own list (read, never replaced).
    """

    store: MessageStore
    clock: Clock
    node_id: str
    final_state_tx_hooks: list[FinalStateTxHook]
    funnel: FunnelQueue
    #: parent messages a child's final transition completed, by child id
    completed_parents: dict[int, StoredMessage] = field(default_factory=dict)

    def claim_many(self, connection: sa.Connection, batch: list[StoredMessage]) -> list[Any]:
        """Claim a group of queued messages: one conditional UPDATE for those without a funnel; a funnel message takes
        its turn first and is claimed alone, or goes to its funnel's queue (its result is then the POSTPONED
        snapshot). A message another writer changed first gets None."""
        now = self.clock.now()
        claimable = [m for m in batch if states.is_legal(m.state, MessageState.PROCESSING)]
        funnelled = [m for m in claimable if m.funnel_value is not None and self.funnel.applies(m)]
        plain = claimable
        if funnelled:
            turns = {id(m) for m in funnelled}
            plain = [m for m in claimable if id(m) not in turns]
        won = {m.id: m for m in states.claim(self.store, plain, self.node_id, now, connection)} if plain else {}
        if funnelled:
            won.update(self._take_turns(funnelled, now, connection))
        results: list[Any] = []
        for message in batch:
            if not states.is_legal(message.state, MessageState.PROCESSING):
                results.append(Failure(IllegalTransitionError(message.state, MessageState.PROCESSING)))
            else:
                results.append(won.pop(message.id, None))  # a second copy of the same message gets None
        return results

    def _take_turns(self, funnelled: list[StoredMessage], now: datetime,
                    connection: sa.Connection) -> dict[int, StoredMessage]:
        """The funnel messages of a claim, in funnel order (two nodes' claims lock funnel rows in the same order), each
        claimed right after its turn so that the next message of the same funnel sees it PROCESSING."""
        taken: dict[int, StoredMessage] = {}
        for message in sorted(funnelled, key=lambda m: (m.funnel_value or "", m.id)):
            if message.id in taken:
                continue
            blocker = self.funnel.turn(message, now, connection)
            if blocker is None:
                won = states.claim(self.store, [message], self.node_id, now, connection)
                if won:
                    taken[message.id] = won[0]
                continue
            decision = self.funnel.queued_behind(message, blocker)
            waiting = states.transition_many(
                self.store, [(message, decision.target, now, decision.changes)], connection, node_id=self.node_id)[0]
            if isinstance(waiting, StoredMessage):
                taken[message.id] = waiting
        return taken

    def claim_ready(self, connection: sa.Connection, now: datetime, new_cutoff: datetime | None,
                    limit: int) -> list[tuple[MessageState, StoredMessage]]:
        """The feeder's claim: the ready messages (due, then NEW received by ``new_cutoff``; ``MessageStore.ready``)
        claimed for this node in this transaction, as (state before, new snapshot): PROCESSING ones to queue, and
        funnel messages that went to their funnel's queue instead (POSTPONED)."""
        ready = self.store.ready(now, new_cutoff, limit, connection)
        if not ready:
            return []
        results = self.claim_many(connection, ready)
        return [(message.state, result) for message, result in zip(ready, results, strict=True)
                if isinstance(result, StoredMessage)]

    def finish_many(self, connection: sa.Connection, batch: list[states.TransitionRequest]) -> list[Any]:
        """Write a group of outcomes; final ones run the transaction hooks in the same commit."""
        results: list[Any] = []
        for request, result in zip(batch, states.transition_many(self.store, batch, connection, node_id=self.node_id),
                                   strict=True):
            if isinstance(result, Exception):
                results.append(Failure(result))
                continue
            if result.funnel_value is not None and FunnelQueue.releases(request[0].state, result):
                self.funnel.hand_off(result, connection)
            if states.is_final(result.state):
                self.run_tx_hooks(result, connection)
                if result.parent_id is not None:
                    parent = self.complete_parent(result.parent_id, result.last_update_ts, connection)
                    if parent is not None:
                        self.completed_parents[result.id] = parent
            results.append(result)
        return results

    def complete_parent(self, parent_id: int, now: datetime, connection: sa.Connection) -> StoredMessage | None:
        """In a child's final transaction: end the waiting parent when its children decide it (row-locked)."""
        parent = self.store.lock_message(parent_id, connection)
        if parent is None or parent.state is not MessageState.WAITING_FOR_CHILDREN:
            return None
        decision = outcomes.parent_outcome(parent, self.store.children_of(parent_id, connection))
        if decision is None:
            return None
        updated = states.transition(self.store, parent, decision.target, now, dict(decision.changes), connection,
                                    node_id=self.node_id)
        self.run_tx_hooks(updated, connection)
        if updated.funnel_value is not None:  # a guaranteed-order funnel may have waited for the parent to end
            self.funnel.hand_off(updated, connection)
        return updated

    def run_tx_hooks(self, message: StoredMessage, connection: sa.Connection) -> None:
        """The final-state transaction hooks of ``message``, in the transaction that made it final."""
        for hook in self.final_state_tx_hooks:
            hook(message, connection)
