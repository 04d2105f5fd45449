"""The read model's view of a message: the JSON forms of a search result and of one message with everything stored
about it (external calls, call records, children, confirmation, transitions).

The admin API answers with them, the console renders them and ``openroute messages`` prints them::

    detail = load_message_detail(store, 42)  # None when there is no message 42
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

import sqlalchemy as sa

from openroute.definitions.errors import OpenrouteError
from openroute.engine.outcome import ends_attempt
from openroute.persistence import (
    ConfirmationStatus,
    MessageStore,
    StoredMessage,
    confirmation_table,
    external_call_table,
    mask_secrets,
    masked_value,
    message_table,
)
from openroute.persistence.call_records import CallRecordStore
from openroute.queries.search import SUMMARY_COLUMNS

__all__ = ["SUMMARY_KEYS", "MessageNotFoundError", "load_message_detail", "message_detail", "message_summary",
           "summaries"]


class MessageNotFoundError(OpenrouteError, LookupError):
    """No message with that id (HTTP 404)."""

    code = "NOT_FOUND"


def _masked(text: str | None) -> str | None:
    """A stored text as shown to operators, its secrets masked (:func:`~openroute.persistence.mask_secrets`): texts
    are stored masked, but a row written before that, or by another writer, is masked here too."""
    return None if text is None else mask_secrets(text)


def _iso(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()


#: the JSON names of :data:`~openroute.queries.search.SUMMARY_COLUMNS`, in their order
SUMMARY_KEYS = ("id", "state", "service", "operation", "sourceSystem", "correlationId", "processId", "objectId",
                "entityType", "funnelValue", "failedCount", "receivedAt", "lastUpdateAt", "nextAttemptAt",
                "lastErrorCode", "parentId", "parkedOn")
_STATE, _RECEIVED, _UPDATED, _NEXT = (SUMMARY_COLUMNS.index(name) for name in
                                      ("state", "receive_ts", "last_update_ts", "next_attempt_at"))


def summaries(rows: Iterable[Sequence[Any]], *, iso_times: bool = True) -> list[dict[str, Any]]:
    """The JSON form of search results from rows of :data:`~openroute.queries.search.SUMMARY_COLUMNS`, in one pass
    (what :func:`message_summary` gives for each message).

    ``iso_times=False`` leaves the times as ``datetime`` for :class:`JsonAnswer`, which writes them as the same ISO
    8601 text: ``isoformat()`` of the 150 times of a page of 50 took most of this function's time."""
    items = []
    for row in rows:
        item = dict(zip(SUMMARY_KEYS, row, strict=True))
        item["state"] = row[_STATE].value
        if iso_times:
            item["receivedAt"] = _iso(row[_RECEIVED])
            item["lastUpdateAt"] = _iso(row[_UPDATED])
            item["nextAttemptAt"] = _iso(row[_NEXT])
        items.append(item)
    return items


def message_summary(message: StoredMessage) -> dict[str, Any]:
    """The JSON form of a message in search results (no payload, headers or custom data)."""
    return summaries([[getattr(message, name) for name in SUMMARY_COLUMNS]])[0]


def message_detail(message: StoredMessage) -> dict[str, Any]:
    """The JSON form of one message with everything stored about it."""
    return {
        **message_summary(message),
        "payload": message.payload,
        "contentType": message.content_type,
        "headers": message.headers,
        "messageTimestamp": _iso(message.msg_ts),
        "startedAt": _iso(message.start_process_ts),
        "nodeId": message.node_id,
        "customData": masked_value(message.custom_data),
        "businessErrors": masked_value(message.business_errors),
        "lastErrorText": _masked(message.last_error_text),
        "lastErrorTrace": _masked(message.last_error_trace),
        "version": message.version,
    }


def load_message_detail(store: MessageStore, message_id: int) -> dict[str, Any] | None:
    """The JSON form of one message with its external calls (calls made and refused by a breaker), children,
    confirmation, state transitions (oldest first) and ``attempts``, its attempts over its whole history (restarts
    included, :func:`~openroute.engine.outcome.ends_attempt`); None when there is no such message. The admin API,
    the console and the CLI show this."""
    with store.engine.connect() as connection:
        message = store.get(message_id, connection)
        if message is None:
            return None
        e = external_call_table.c
        calls = connection.execute(
            sa.select(external_call_table).where(e.message_id == message_id).order_by(e.id)
        ).all()
        children = store.find(message_table.c.parent_id == message_id, connection=connection)
        k = confirmation_table.c
        confirmation = connection.execute(
            sa.select(confirmation_table).where(k.message_id == message_id)
        ).first()
        transitions = store.transitions.of(message_id, connection)
        records = CallRecordStore(store).of_message(message_id, connection)
    body = message_detail(message)
    body["externalCalls"] = [
        {
            "callKey": r.call_key,
            "status": str(r.status),
            # calls made, and calls the circuit breaker refused (not made)
            "attempts": r.attempts,
            "refused": r.refused,
            "result": masked_value(r.result),  # the remote's answer: the route reads it unmasked, operators not
            "lastError": _masked(r.last_error),
            "createdAt": _iso(r.created_at),
            "updatedAt": _iso(r.updated_at),
            "idempotencyKey": r.idempotency_key,
            "nodeId": r.node_id,
            "startedAt": _iso(r.started_at),
            # started, no outcome recorded: the remote may or may not have acted (mark-done / call-again)
            "inDoubt": str(r.status) == "STARTED",
        }
        for r in calls
    ]
    body["callsInDoubt"] = [c["callKey"] for c in body["externalCalls"] if c["inDoubt"]]
    body["callRecords"] = [{**record.to_json(), "request": _masked(record.request),
                            "response": _masked(record.response), "error": _masked(record.error)}
                           for record in records]
    body["children"] = [message_summary(child) for child in children]
    body["confirmation"] = None if confirmation is None else {
        "status": str(confirmation.status),
        "outcomeState": str(confirmation.outcome_state),
        "attempts": confirmation.attempts,
        # only a PENDING confirmation is tried again (a row written before SENT and FAILED cleared it keeps its time)
        "nextAttemptAt": _iso(confirmation.next_attempt_at) if confirmation.status == ConfirmationStatus.PENDING
        else None,
        "lastError": _masked(confirmation.last_error),
        "createdAt": _iso(confirmation.created_at),
        "sentAt": _iso(confirmation.sent_at),
        "confirmationId": confirmation.confirmation_id,
    }
    # over the whole history: failedCount starts again at each restart, the transition rows stay
    body["attempts"] = sum(1 for t in transitions if ends_attempt(t["from_state"], t["error_code"]))
    body["transitions"] = [
        {
            "fromState": None if t["from_state"] is None else str(t["from_state"]),
            "toState": str(t["to_state"]),
            "at": _iso(t["at"]),
            "nodeId": t["node_id"],
            "attempt": t["attempt"],
            "errorCode": t["error_code"],
            "errorText": _masked(t["error_text"]),
            "errorTrace": _masked(t["error_trace"]),
            "cause": t["cause"],
        }
        for t in transitions
    ]
    return body
