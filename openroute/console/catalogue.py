"""The console's error code catalogue: the codes openroute defines and those found on stored messages, with how many
messages have each now.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from dataclasses import dataclass

import sqlalchemy as sa

from openroute.definitions import errors as core_errors
from openroute.engine.outcome import ErrorCode as EngineErrorCode
from openroute.persistence import message_table
from openroute.persistence.store import MessageStore


@dataclass(frozen=True)
class ErrorCode:
    """One entry of the error code catalogue."""

    code: str
    name: str
    meaning: str
    #: how many messages have it as their last error code
    messages: int = 0


#: what the codes the engine writes itself (:class:`~openroute.engine.outcome.ErrorCode`) mean
ENGINE_CODE_MEANINGS = {
    "CANCELLED": "an operator cancelled the message (console, admin API or CLI)",
    "CHILD_FAILED": "a child message of a split ended FAILED, so its parent did too",
    "DROPPED": "an interceptor dropped the message",
    "EXT_CALL_IN_PROGRESS": "another message of the same entity was making the same external call",
    "FUNNEL": "another message with the same funnel value was processing (or older, with guaranteed order)",
    "OBSOLETE": "a newer message of the same entity had already ended OK (SKIPPED)",
    "PROCESSING_ABANDONED": "the node processing the message died; repoll gave it back to the queue",
    "TECHNICAL_ERROR": "a step raised a TechnicalError without a code; retried per the route's retry policy",
    "VALIDATION_ERROR": "the message was invalid when processed (FAILED at once)",
}


def _error_classes() -> Iterator[type[BaseException]]:
    seen: set[type[BaseException]] = set()
    pending: list[type[BaseException]] = [core_errors.OpenrouteError]
    while pending:
        cls = pending.pop()
        if cls in seen:
            continue
        seen.add(cls)
        yield cls
        pending.extend(cls.__subclasses__())


def error_catalogue(store: MessageStore) -> list[ErrorCode]:
    """The error codes openroute defines (error classes with a ``code``, the engine's own codes) and every other
    code found as a message's current error (business error codes of the routes), with how many messages have it
    now (a message that ended OK has none: its earlier errors are in its transition history)."""
    import openroute.auth.cross_site  # load the error classes the catalogue lists
    import openroute.auth.errors
    import openroute.queries.messages
    import openroute.queries.status  # noqa: F401

    c = message_table.c
    with store.engine.connect() as connection:
        seen = {code: int(count) for code, count in connection.execute(
            sa.select(c.last_error_code, sa.func.count()).where(c.last_error_code.is_not(None))
            .group_by(c.last_error_code)
        )}
    entries: dict[str, ErrorCode] = {}
    for cls in _error_classes():
        code = cls.__dict__.get("code")
        if isinstance(code, str) and code not in entries:
            doc = (inspect.getdoc(cls) or "").split("\n\n")[0].replace("\n", " ")
            entries[code] = ErrorCode(code, cls.__name__, doc, seen.get(code, 0))
    for code in [*(c.value for c in EngineErrorCode), "TECHNICAL_ERROR"]:
        meaning = ENGINE_CODE_MEANINGS.get(code, "written by the engine")
        entries.setdefault(code, ErrorCode(code, "engine", meaning, seen.get(code, 0)))
    for code, count in seen.items():
        entries.setdefault(code, ErrorCode(code, "route", "set by a route (business or technical error code)", count))
    return sorted(entries.values(), key=lambda e: e.code)
