"""What the engine's group-commit writer does inside one transaction: claims, outcomes and what goes with them.

A claim takes the funnels of the claimed funnel messages in its own transaction; an outcome that makes a message
final runs the final-state transaction hooks and ends a parent whose last child it was; an outcome that frees a
funnel claims the messages this node postponed for it (:class:`~openroute.engine._funnel_wake.FunnelWake`). Every
method here runs in the writer thread, on the connection of the transaction it joins; the event loop reads what
they leave (:attr:`EngineWrites.funnels_taken`, :attr:`~EngineWrites.preclaimed`,
:attr:`~EngineWrites.completed_parents`) once the commit is known.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import sqlalchemy as sa

from openroute import states
from openroute.clock import Clock
from openroute.engine import outcome as outcomes
from openroute.engine._funnel_wake import FunnelWake
from openroute.engine._writer import Failure
from openroute.errors import IllegalTransitionError, UnknownRouteError
from openroute.persistence import MessageState, MessageStore, StoredMessage
from openroute.route import RouteRegistry

__all__ = ["EngineWrites", "FinalStateTxHook"]

FinalStateTxHook = Callable[[StoredMessage, sa.Connection], None]


@dataclass(frozen=True, eq=False)
class EngineWrites:
    """The transactional work of one node's writer (see the module docstring).

    ``final_state_tx_hooks`` and ``queued`` are the engine's own list and set (read, never replaced);
    ``released_in(message, connection)`` tells the funnel wake that an outcome freed a funnel.
    """

    store: MessageStore
    routes: RouteRegistry
    clock: Clock
    node_id: str
    final_state_tx_hooks: list[FinalStateTxHook]
    queued: set[int]
    released_in: Callable[[StoredMessage, sa.Connection], None]
    #: parent messages a child's final transition completed, by child id
    completed_parents: dict[int, StoredMessage] = field(default_factory=dict)
    #: the holder of the funnel each claimed funnel message met in its claim's transaction (None: it took it)
    funnels_taken: dict[int, int | None] = field(default_factory=dict)
    #: funnel messages claimed in their funnel's release transaction, not yet taken by a worker
    preclaimed: set[int] = field(default_factory=set)

    def claim_many(self, connection: sa.Connection, batch: list[StoredMessage]) -> list[Any]:
        """Claim a group of queued messages with one conditional UPDATE."""
        now = self.clock.now()
        claimable = [m for m in batch if states.is_legal(m.state, MessageState.PROCESSING)]
        won = {m.id: m for m in states.claim(self.store, claimable, self.node_id, now, connection)} if claimable else {}
        if won:
            self._take_funnels(won.values(), now, connection)
        results: list[Any] = []
        for message in batch:
            if not states.is_legal(message.state, MessageState.PROCESSING):
                results.append(Failure(IllegalTransitionError(message.state, MessageState.PROCESSING)))
            else:
                results.append(won.pop(message.id, None))  # a second copy of the same message gets None
        return results

    def _take_funnels(self, claimed: Iterable[StoredMessage], now: datetime, connection: sa.Connection) -> None:
        """In the claim's transaction: take the funnels of the claimed funnel messages (routes without guaranteed
        order), one commit less per message than a transaction of its own; the engine's hold-back reads the outcome.
        In funnel order, so two nodes' claims lock funnel rows in the same order."""
        for message in sorted((m for m in claimed if m.funnel_value is not None),
                              key=lambda m: (m.funnel_value or "", m.id)):
            try:
                route = self.routes.get(message.service, message.operation)
            except UnknownRouteError:
                continue
            if not route.guaranteed_order:
                funnel = message.funnel_value or ""
                self.funnels_taken[message.id] = self.store.funnels.acquire(funnel, message.id, now, connection)

    def claim_woken(self, waiting: list[StoredMessage], connection: sa.Connection) -> list[StoredMessage]:
        """In the transaction that frees a funnel: claim the messages this node postponed for it and take the funnel
        for them, so a woken message runs right after the commit without a claim and a funnel transaction of its
        own. Messages of guaranteed-order routes are only woken (their order check needs a read)."""
        now = self.clock.now()
        result: list[StoredMessage] = []
        for message in waiting:
            try:
                route = self.routes.get(message.service, message.operation)
            except UnknownRouteError:
                continue
            if route.guaranteed_order or message.id in self.queued:
                result.append(message)
                continue
            won = states.claim(self.store, [message], self.node_id, now, connection)
            if won:
                claimed = won[0]
                self.funnels_taken[claimed.id] = self.store.funnels.acquire(
                    claimed.funnel_value or "", claimed.id, now, connection)
                self.preclaimed.add(claimed.id)
                result.append(claimed)
        return result

    def finish_many(self, connection: sa.Connection, batch: list[states.TransitionRequest]) -> list[Any]:
        """Write a group of outcomes; final ones run the transaction hooks in the same commit."""
        results: list[Any] = []
        for request, result in zip(batch, states.transition_many(self.store, batch, connection, node_id=self.node_id),
                                   strict=True):
            if isinstance(result, Exception):
                results.append(Failure(result))
                continue
            if result.funnel_value is not None and FunnelWake.releases(request[0].state, result):
                self.released_in(result, connection)
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
        return updated

    def run_tx_hooks(self, message: StoredMessage, connection: sa.Connection) -> None:
        """The final-state transaction hooks of ``message``, in the transaction that made it final."""
        for hook in self.final_state_tx_hooks:
            hook(message, connection)
