"""What the engine's group-commit writer does inside one transaction: inserts (claimed for this node in the same
transaction when the accept had room for them), claims, outcomes and what goes with them (funnels, parents, call
records).

A claim decides the funnel turn of each funnel message in its own transaction (it takes the funnel, or it waits in
the funnel's queue without running, :class:`~openroute.engine.funnel.FunnelQueue`); the feeder's claim reads the
ready messages in the same transaction; an outcome that makes a message final runs the final-state transaction hooks
and ends a parent whose last child it was; an outcome that frees a funnel hands it to the next message. Every method
here runs in the writer thread, on the connection of the transaction it joins; the event loop reads what they leave
(:attr:`EngineWrites.completed_parents`, the funnel's hand-offs) once the commit is known.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import sqlalchemy as sa

from openroute.definitions.clock import Clock
from openroute.definitions.errors import IllegalTransitionError
from openroute.engine import outcome as outcomes
from openroute.engine import states
from openroute.engine._writer import Failure
from openroute.engine.funnel import FunnelQueue
from openroute.persistence import (
    FINAL_STATES,
    CallEnd,
    CallStart,
    ExternalCall,
    FunnelShare,
    MessageState,
    MessageStore,
    NewMessage,
    StoredMessage,
)

__all__ = ["EngineWrites", "FinalStateTxHook", "FinalStatesTxHook"]

FinalStateTxHook = Callable[[StoredMessage, sa.Connection], None]
#: a hook hearing every message one transaction made final, in the order they were made final (see run_tx_hooks)
FinalStatesTxHook = Callable[[Sequence[StoredMessage], sa.Connection], None]


@dataclass(frozen=True, eq=False)
class EngineWrites:
    """The transactional work of one node's writer (see the module docstring).

    ``final_state_tx_hooks`` is the engine's own list (read, never replaced).
    """

    store: MessageStore
    clock: Clock
    node_id: str
    final_state_tx_hooks: list[FinalStatesTxHook]
    funnel: FunnelQueue
    #: parent messages a child's final transition completed, by child id
    completed_parents: dict[int, StoredMessage] = field(default_factory=dict)

    def insert_many(self, connection: sa.Connection, batch: list[NewMessage]) -> list[tuple[StoredMessage, bool]]:
        """Store a group of accepted messages as NEW; each one's (message, duplicate): a duplicate names the message
        stored before (``MessageStore.insert_snapshots``)."""
        return self.store.insert_snapshots(batch, connection, node_id=self.node_id)

    def insert_claimed_many(self, connection: sa.Connection,
                            batch: list[NewMessage]) -> list[tuple[StoredMessage, bool]]:
        """Store a group of accepted messages claimed for this node in the same transaction (PROCESSING, both
        transition rows: ``MessageStore.insert_snapshots`` with ``claimed_at``); a duplicate is not claimed. The
        accept chose them: no funnel to take a turn in, and room in this node's queue (``Engine._accept``)."""
        return self.store.insert_snapshots(batch, connection, node_id=self.node_id, claimed_at=self.clock.now())

    def begin_calls(self, connection: sa.Connection,
                    starts: list[CallStart]) -> list[tuple[ExternalCall | None, bool]]:
        """Record the starts of a group of external calls (``ExternalCallStore.begin_many``)."""
        return self.store.calls.begin_many(connection, starts)

    def finish_calls(self, connection: sa.Connection, ends: list[CallEnd]) -> list[None]:
        """Record the outcomes of a group of external calls (``ExternalCallStore.finish_many``)."""
        return self.store.calls.finish_many(connection, ends)

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
        """The funnel messages of a claim: the oldest claimed of each value takes its turn (all values at once,
        :meth:`FunnelQueue.turns`, which locks the funnel rows in value order, as two nodes' claims must), the
        winners are claimed together, and every other message goes to its funnel's queue behind the holder; a value
        whose winner another writer changed first takes its turns one message at a time, as before the group."""
        by_value: dict[str, list[StoredMessage]] = {}
        for message in {m.id: m for m in sorted(funnelled, key=lambda m: (m.funnel_value or "", m.id))}.values():
            by_value.setdefault(message.funnel_value or "", []).append(message)
        blockers = self.funnel.turns([group[0] for group in by_value.values()], now, connection)
        winners = [group[0] for value, group in by_value.items() if blockers[value] is None]
        won = {m.id: m for m in states.claim(self.store, winners, self.node_id, now, connection)} if winners else {}
        taken: dict[int, StoredMessage] = dict(won)
        queued: list[states.TransitionRequest] = []
        one_by_one: list[StoredMessage] = []
        for value, group in by_value.items():
            blocker = blockers[value]
            if blocker is None:
                if group[0].id not in won:
                    one_by_one.extend(group[1:])
                    continue
                blocker = group[0].id
                group = group[1:]
            for message in group:
                decision = self.funnel.queued_behind(message, blocker)
                queued.append((message, decision.target, now, decision.changes))
        if queued:
            for request, result in zip(queued, states.transition_many(self.store, queued, connection,
                                                                      node_id=self.node_id), strict=True):
                if isinstance(result, StoredMessage):
                    taken[request[0].id] = result
        for message in one_by_one:
            turned = self._take_turn(message, now, connection)
            if turned is not None:
                taken[message.id] = turned
        return taken

    def _take_turn(self, message: StoredMessage, now: datetime, connection: sa.Connection) -> StoredMessage | None:
        """One funnel message's turn: claimed (PROCESSING) when it takes the funnel, else put in the funnel's queue
        (POSTPONED); None when another writer changed it first."""
        blocker = self.funnel.turn(message, now, connection)
        if blocker is None:
            claimed = states.claim(self.store, [message], self.node_id, now, connection)
            return claimed[0] if claimed else None
        decision = self.funnel.queued_behind(message, blocker)
        waiting = states.transition_many(
            self.store, [(message, decision.target, now, decision.changes)], connection, node_id=self.node_id)[0]
        return waiting if isinstance(waiting, StoredMessage) else None

    def claim_ready(self, connection: sa.Connection, now: datetime, new_cutoff: datetime | None,
                    limit: int, share: FunnelShare | None = None) -> list[tuple[MessageState, StoredMessage]]:
        """The feeder's claim: the ready messages (due, then NEW received by ``new_cutoff``; ``MessageStore.ready``)
        claimed for this node in this transaction, as (state before, new snapshot): PROCESSING ones to queue, and
        funnel messages that went to their funnel's queue instead (POSTPONED); with a ``share``, the due funnel
        messages of this node's share of the funnel values first (``FunnelShare``)."""
        ready = self.store.ready(now, new_cutoff, limit, connection, share=share)
        if not ready:
            return []
        results = self.claim_many(connection, ready)
        return [(message.state, result) for message, result in zip(ready, results, strict=True)
                if isinstance(result, StoredMessage)]

    def finish_many(self, connection: sa.Connection, batch: list[states.TransitionRequest]) -> list[Any]:
        """Write a group of outcomes; final ones run the transaction hooks in the same commit."""
        results: list[Any] = states.transition_many(self.store, batch, connection, node_id=self.node_id)
        releases: list[StoredMessage] = []
        finals: list[StoredMessage] = []
        for index, result in enumerate(results):  # an error is replaced by its Failure in place
            if isinstance(result, Exception):
                results[index] = Failure(result)
                continue
            if result.funnel_value is not None and FunnelQueue.releases(batch[index][0].state, result):
                releases.append(result)
            if result.state in FINAL_STATES:  # a member (transition_many's target): states.is_final's first test
                finals.append(result)
                if result.parent_id is not None:
                    parent = self._end_parent(result.parent_id, result.last_update_ts, connection)
                    if parent is not None:
                        finals.append(parent)  # after its last child, as it was made final
                        self.completed_parents[result.id] = parent
        if finals:
            self.run_tx_hooks(finals, connection)
        if releases:
            self.funnel.hand_off_many(releases, connection)
        return results

    def complete_parent(self, parent_id: int, now: datetime, connection: sa.Connection) -> StoredMessage | None:
        """In a child's final transaction: end the waiting parent when its children decide it (row-locked), its
        final-state transaction hooks run."""
        parent = self._end_parent(parent_id, now, connection)
        if parent is not None:
            self.run_tx_hooks([parent], connection)
        return parent

    def _end_parent(self, parent_id: int, now: datetime, connection: sa.Connection) -> StoredMessage | None:
        parent = self.store.lock_message(parent_id, connection)
        if parent is None or parent.state is not MessageState.WAITING_FOR_CHILDREN:
            return None
        decision = outcomes.parent_outcome(parent, self.store.children_of(parent_id, connection))
        if decision is None:
            return None
        updated = states.transition(self.store, parent, decision.target, now, dict(decision.changes), connection,
                                    node_id=self.node_id)
        if updated.funnel_value is not None:  # a guaranteed-order funnel may have waited for the parent to end
            self.funnel.hand_off(updated, connection)
        return updated

    def run_tx_hooks(self, messages: Sequence[StoredMessage], connection: sa.Connection) -> None:
        """The final-state transaction hooks of ``messages`` (the ones a group commit made final, in the order they
        were), in that transaction: each hook once for all of them (a confirmation row each in one INSERT)."""
        for hook in self.final_state_tx_hooks:
            hook(messages, connection)
