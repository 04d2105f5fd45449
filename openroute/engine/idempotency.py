"""Idempotency keys of the calls that leave the process, and the key of the call running now.

Every ``Exchange.ext_call`` / ``Exchange.call_once`` gets one key, derived only from what never changes for that
call: the message (store id, source system and correlation id) and the call key, or, for an entity-scoped call,
the entity type, object id and call key. The same call therefore carries the same key on every attempt, on every
node, after any crash, and after an operator's restart of a FAILED message (a restart is not a new call: a remote
that already acted on the key drops the repeat). The key is a UUID string, so it fits an HTTP ``Idempotency-Key``
header and a WS-Addressing ``MessageID`` (``urn:uuid:<key>``) alike.

While a call runs, :func:`current_idempotency_key` answers its key, so the outbound clients openroute ships
(``SoapService``, an HTTP client) send it without the route passing it on.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from contextvars import ContextVar
from typing import Literal

from openroute.definitions.errors import TechnicalError

__all__ = [
    "CALL_IN_DOUBT",
    "KEY_NAMESPACE",
    "CallInDoubtError",
    "InDoubt",
    "current_idempotency_key",
    "entity_idempotency_key",
    "message_idempotency_key",
    "using_idempotency_key",
]

#: the UUID namespace of openroute's idempotency keys (fixed: changing it would change every key)
KEY_NAMESPACE = uuid.UUID("6f8c0f3e-2a8e-5b7e-9d61-0c1f2b3a4d5e")

#: the error code of a message held for an operator because a call is in doubt
CALL_IN_DOUBT = "CALL_IN_DOUBT"

#: what an attempt does with a call in doubt: make it again with the same key, or hold the message for an operator
InDoubt = Literal["repeat", "hold"]


class CallInDoubtError(TechnicalError):
    """An earlier attempt started call ``call_key`` and recorded no outcome, and the route holds such calls.

    The message ends FAILED with error code ``CALL_IN_DOUBT`` (no attempt counted, no confirmation sent yet); an
    operator resolves it with "mark done" (the call is recorded as succeeded and skipped) or "call again" (the call
    is made again with the same idempotency key), both of which restart the message.
    """

    def __init__(self, call_key: str, idempotency_key: str, detail: str) -> None:
        super().__init__(
            f"call {call_key!r} (idempotency key {idempotency_key}) is in doubt: {detail}; held for an operator "
            "(mark done / call again)", code=CALL_IN_DOUBT,
        )
        self.call_key = call_key
        self.idempotency_key = idempotency_key


_current: ContextVar[str | None] = ContextVar("openroute_idempotency_key", default=None)


def message_idempotency_key(message_id: int, source_system: str, correlation_id: str, call_key: str) -> str:
    """The key of call ``call_key`` of one message (UUID text, 36 characters).

    The source system and correlation id make it unique beyond one database (two stores never hand a remote the
    same key for different messages even when their ids coincide).
    """
    name = "\x1f".join(("message", str(message_id), source_system, correlation_id, call_key))
    return str(uuid.uuid5(KEY_NAMESPACE, name))


def entity_idempotency_key(entity_type: str, object_id: str, call_key: str) -> str:
    """The key of the entity-scoped call ``call_key`` of one entity (whichever message makes it)."""
    name = "\x1f".join(("entity", entity_type, object_id, call_key))
    return str(uuid.uuid5(KEY_NAMESPACE, name))


def current_idempotency_key() -> str | None:
    """The idempotency key of the ``ext_call`` / ``call_once`` running in this task now (None outside one)."""
    return _current.get()


@contextlib.contextmanager
def using_idempotency_key(key: str) -> Iterator[str]:
    """Make ``key`` the :func:`current_idempotency_key` inside the block (the exchange wraps each call in it)."""
    token = _current.set(key)
    try:
        yield key
    finally:
        _current.reset(token)
