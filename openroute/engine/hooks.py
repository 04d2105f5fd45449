"""What a node's parts hear of its committed changes, registered by method: :class:`EngineHooks`, which
:class:`~openroute.engine.Engine` is."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

import sqlalchemy as sa

from openroute.engine.pipeline import FinalStateHook, TransitionListener
from openroute.engine.writes import FinalStatesTxHook, FinalStateTxHook
from openroute.persistence import StoredMessage

__all__ = ["EngineHooks"]


class EngineHooks:
    """The hooks of one engine, each registered by a method that returns the function removing it again.

    The lists are the engine's own: its writes and its after-commit follow-up read them at every change, so a hook
    registered while the engine runs is heard from the next change on."""

    def __init__(self) -> None:
        self._final_state_hooks: list[FinalStateHook] = []
        self._final_state_tx_hooks: list[FinalStatesTxHook] = []
        self._transition_listeners: list[TransitionListener] = []

    def on_final_state(self, hook: FinalStateHook) -> Callable[[], None]:
        """Await ``hook(message)`` once per message after the commit that made it final (OK, FAILED, SKIPPED,
        CANCEL)."""
        self._final_state_hooks.append(hook)
        return functools.partial(self._final_state_hooks.remove, hook)

    def on_final_state_in_transaction(self, hook: FinalStateTxHook) -> Callable[[], None]:
        """Call ``hook(message, connection)`` inside the very transaction that makes a message final (e.g. to insert
        its confirmation row): it commits or fails with it."""

        def each(messages: Sequence[StoredMessage], connection: sa.Connection) -> None:
            for message in messages:
                hook(message, connection)

        return self.on_final_states_in_transaction(each)

    def on_final_states_in_transaction(self, hook: FinalStatesTxHook) -> Callable[[], None]:
        """Call ``hook(messages, connection)`` once per transaction that makes messages final, with all of them in
        the order they were made final (a group commit makes many): what
        :meth:`on_final_state_in_transaction` does, for a hook that writes their rows in one statement."""
        self._final_state_tx_hooks.append(hook)
        return functools.partial(self._final_state_tx_hooks.remove, hook)

    def on_transition(self, listener: TransitionListener) -> Callable[[], None]:
        """Call ``listener(previous_state, message)`` on the event loop after every committed state change of this
        node (previous None: just accepted; tracing, demos, the transition log)."""
        self._transition_listeners.append(listener)
        return functools.partial(self._transition_listeners.remove, listener)
