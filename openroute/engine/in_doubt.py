"""An operator's answer to calls in doubt: "mark done" or "call again", then the message is restarted.

A call is in doubt when an attempt recorded it STARTED and no outcome followed (its node died, or the outcome could
not be written): the remote may or may not have acted. A route that holds such calls (``in_doubt="hold"``) ends the
message FAILED with error code ``CALL_IN_DOUBT``; the admin API (``POST /admin/messages/{id}/mark-done`` /
``call-again``), ``openroute messages mark-done|call-again`` and the console act through :func:`resolve_in_doubt`:

* ``mark-done``: the operator checked the remote and the call did happen: it is recorded OK (no result) and the
  restarted message skips it;
* ``call-again``: the call did not happen (or the remote honours the key): it is recorded FAILED and the restarted
  message makes it again, with the same idempotency key.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Literal

from openroute.definitions.errors import OpenrouteError
from openroute.engine import states
from openroute.engine.core import Engine
from openroute.persistence import MessageState, StoredMessage

__all__ = ["InDoubtAction", "NoCallInDoubtError", "Resolution", "resolve_in_doubt"]

#: the two answers an operator gives to a message's calls in doubt
InDoubtAction = Literal["mark-done", "call-again"]


class NoCallInDoubtError(OpenrouteError, LookupError):
    """The message has no call in doubt (nothing was changed; HTTP 409)."""

    code = "NO_CALL_IN_DOUBT"


@dataclass(frozen=True)
class Resolution:
    """What :func:`resolve_in_doubt` did: the call keys resolved and the restarted message."""

    call_keys: tuple[str, ...]
    message: StoredMessage
    previous_state: MessageState


async def resolve_in_doubt(engine: Engine, message_id: int, action: InDoubtAction, cause: str) -> Resolution:
    """Resolve every call in doubt of ``message_id`` per ``action``, then restart the message (``cause`` recorded).

    The message must be restartable (FAILED or CANCEL) and have a call in doubt; otherwise nothing changes.
    Raises :class:`LookupError` (no such message), :class:`~openroute.definitions.errors.IllegalTransitionError` (not
    FAILED or CANCEL), :class:`NoCallInDoubtError`, :class:`ValueError` (unknown action) or
    :class:`~openroute.definitions.errors.StaleMessageError` (changed meanwhile; the calls stay resolved, restart it
    again).
    """
    if action not in ("mark-done", "call-again"):
        raise ValueError(f"action must be 'mark-done' or 'call-again', got {action!r}")
    store = engine.store
    message = await asyncio.to_thread(store.get, message_id)
    if message is None:
        raise LookupError(f"no message {message_id}")
    states.check_trigger("restart", message.state)
    now = engine.clock.now()
    keys = await asyncio.to_thread(
        lambda: store.calls.resolve_in_doubt(message_id, action == "mark-done", now, note=cause)
    )
    if not keys:
        raise NoCallInDoubtError(f"message {message_id} has no call in doubt")
    restarted = await engine.restart(message_id, cause=f"{cause} ({action}: {', '.join(keys)})"[:255])
    return Resolution(tuple(keys), restarted, message.state)
