"""The funnel as a queue: at most one message of a funnel value runs at a time; the others wait in its queue and the
funnel is handed to exactly one of them when it frees.

A message's turn is decided in its claim's transaction (:meth:`FunnelQueue.turn`): it takes the funnel, or it goes
straight to the funnel's queue (POSTPONED, error code FUNNEL, no due time: neither claimable nor due by time) without
running. The transaction that frees the funnel (its holder leaves PROCESSING, or a message of it becomes final)
hands it on (:meth:`FunnelQueue.hand_off`): it claims the oldest waiting message (with guaranteed order: only when
no older message of the value is unfinished) and takes the funnel for it, on whatever node postponed it, and this
node runs it right after the commit. The funnel row's lock orders a release and a concurrent wait, so no waiting
message is missed and none is woken twice: a funnel is a queue, never a herd.

Repoll stays the safety net for queues left without a holder (``Repoll`` hands them on, :meth:`FunnelQueue.hand_on`):
a holder whose node died is repaired after its lease, and the repair's transaction hands the funnel on like any other
release.
"""

from __future__ import annotations

from datetime import datetime
from typing import cast

import sqlalchemy as sa

from openroute.definitions.clock import Clock
from openroute.definitions.errors import UnknownRouteError
from openroute.definitions.route import Route, RouteRegistry
from openroute.engine import outcome as outcomes
from openroute.engine import states
from openroute.persistence import MessageState, MessageStore, StoredMessage

__all__ = ["FunnelQueue"]

#: queue heads tried per release when the head changed meanwhile (cancelled by an operator, say)
_HEADS_TRIED = 3


class FunnelQueue:
    """The funnels of one node's messages (see the module docstring).

    The writer-thread methods (:meth:`turn`, :meth:`hand_off`, :meth:`hand_on`) run in the transaction they are given;
    the message a release claimed waits in :meth:`handed_on` until that transaction is committed, when the commit
    pipeline queues it on this node.
    """

    def __init__(self, store: MessageStore, routes: RouteRegistry, clock: Clock, node_id: str) -> None:
        self.store = store
        self.routes = routes
        self.clock = clock
        self.node_id = node_id
        # the message a release claimed, by the releasing message's id (set by the writer thread)
        self._handed: dict[int, StoredMessage] = {}
        #: releases that handed the funnel to a waiting message
        self.handed = 0

    def _route(self, message: StoredMessage) -> Route | None:
        try:
            return self.routes.get(message.service, message.operation)
        except UnknownRouteError:
            return None

    def applies(self, message: StoredMessage) -> bool:
        """Whether ``message`` takes its turn in a funnel (a funnel value and a route that still exists)."""
        return message.funnel_value is not None and self._route(message) is not None

    # -- writer thread ----------------------------------------------------------------------------------------------
    def turn(self, message: StoredMessage, now: datetime, connection: sa.Connection) -> int | None:
        """In ``message``'s claim transaction, before it is claimed: None when it may run now (it takes the funnel),
        else the id of the message it waits behind (the PROCESSING holder, or with guaranteed order an older
        unfinished message of the value)."""
        funnel = message.funnel_value
        assert funnel is not None  # noqa: S101  narrows an Optional for mypy: the caller checked applies()
        blocker = self.store.funnels.acquire(funnel, message.id, now, connection)
        if blocker is None and self._ordered(message):
            blocker = self.store.funnels.older_unfinished(message, connection)
        return blocker

    def turns(self, heads: list[StoredMessage], now: datetime, connection: sa.Connection) -> dict[str, int | None]:
        """:meth:`turn` for the oldest claimed message of several funnel values at once (one message per value): by
        value, None when that message may run now, else the id of the message it waits behind."""
        blockers = self.store.funnels.acquire_many(
            [(cast(str, message.funnel_value), message.id) for message in heads], now, connection)
        for message in heads:
            value = cast(str, message.funnel_value)
            if blockers[value] is None and self._ordered(message):
                blockers[value] = self.store.funnels.older_unfinished(message, connection)
        return blockers

    def _ordered(self, message: StoredMessage) -> bool:
        route = self._route(message)
        return route is not None and route.guaranteed_order

    @staticmethod
    def queued_behind(message: StoredMessage, blocker: int) -> outcomes.Decision:
        """The decision that puts ``message`` in its funnel's queue behind ``blocker``."""
        return outcomes.held_by_funnel(message.funnel_value or "", blocker)

    @staticmethod
    def releases(previous: MessageState, message: StoredMessage) -> bool:
        """Whether this committed change of a funnel message may free its funnel for the next: it leaves PROCESSING,
        or it becomes final (a message cancelled while an ordered funnel waited for it)."""
        if message.funnel_value is None:
            return False
        if previous is MessageState.PROCESSING:
            return message.state is not MessageState.PROCESSING
        return states.is_final(message.state) and not states.is_final(previous)

    def hand_off(self, released: StoredMessage, connection: sa.Connection) -> StoredMessage | None:
        """In the transaction that frees ``released``'s funnel: claim the message whose turn it is and take the funnel
        for it; it is queued on this node after the commit (:meth:`committed`). Returns it, or None."""
        claimed = self.hand_on(released.funnel_value or "", connection)
        if claimed is not None:
            self._handed[released.id] = claimed
        return claimed

    def hand_off_many(self, released: list[StoredMessage], connection: sa.Connection) -> None:
        """:meth:`hand_off` for the releases of one group commit, in a few statements for the group: the funnels
        left free (read under their rows' locks, in value order), their queues' heads, one claim of the heads and
        one statement that hands them the funnels. A head another writer changed meanwhile is tried again the
        one-message way (:meth:`hand_on`)."""
        releasing: dict[str, StoredMessage] = {}
        for message in released:
            releasing.setdefault(message.funnel_value or "", message)
        funnels = self.store.funnels
        free = funnels.free_of(list(releasing), connection)
        if not free:
            return
        now = self.clock.now()
        heads = funnels.queue_heads(free, connection)
        ready = [head for _value, head in sorted(heads.items())
                 if not (self._ordered(head) and funnels.older_unfinished(head, connection) is not None)]
        won = {message.funnel_value: message for message in states.claim(self.store, ready, self.node_id, now,
                                                                             connection)}
        funnels.hand_to_many([(cast(str, value), message.id) for value, message in won.items()], now, connection)
        for head in ready:
            value = cast(str, head.funnel_value)
            claimed = won.get(value)
            if claimed is None:  # changed meanwhile (an operator's cancel, say): the next head, one at a time
                claimed = self.hand_on(value, connection)
            if claimed is not None:
                self._handed[releasing[value].id] = claimed

    def hand_on(self, funnel: str, connection: sa.Connection) -> StoredMessage | None:
        """In a writer transaction: when no message holds ``funnel``, claim the head of its queue for this node and
        hand it the funnel; returns it (to be queued once the transaction is committed), or None."""
        funnels = self.store.funnels
        if funnels.holder(funnel, connection) is not None:  # read under the funnel row's lock
            return None
        now = self.clock.now()
        for _ in range(_HEADS_TRIED):
            head = funnels.queue_head(funnel, connection)
            if head is None:
                return None
            if self._ordered(head) and funnels.older_unfinished(head, connection) is not None:
                return None  # the older message runs first; its end hands the funnel on
            won = states.claim(self.store, [head], self.node_id, now, connection)
            if won:
                funnels.hand_to(funnel, head.id, now, connection)
                return won[0]
        return None

    # -- event loop -------------------------------------------------------------------------------------------------
    def handed_on(self, message_id: int) -> StoredMessage | None:
        """After the commit of a change of ``message_id``: the message its release claimed (to run here), or None."""
        claimed = self._handed.pop(message_id, None)
        if claimed is not None:
            self.handed += 1
        return claimed

    def discard(self, message_id: int) -> None:
        """The change of ``message_id`` was not committed: forget what its release claimed."""
        self._handed.pop(message_id, None)
