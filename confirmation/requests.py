"""How a stored message becomes the confirmation its source system is told (:func:`request_from_message`), and which
messages are not told yet (held for an operator)."""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping
from typing import Any

import sqlalchemy as sa
from openroute.confirmation.model import BusinessErrorInfo, ConfirmationRequest, InvalidConfirmationError
from openroute.persistence.models import MessageState
from openroute.persistence.secrets import mask_secrets

__all__ = ["HELD_ERROR_CODE", "confirmation_id_of", "is_held", "request_from_message", "requests_for"]

#: the error code of a message held for an operator (openroute.engine.idempotency.CALL_IN_DOUBT): not confirmed yet
HELD_ERROR_CODE = "CALL_IN_DOUBT"
#: namespace of the confirmation ids derived for rows made before they had one (migration 0006)
_LEGACY_ID_NAMESPACE = uuid.UUID("0b5f6c1e-7d0a-5c55-9e1b-3f2a4c6d8e90")


def _business_errors(raw: object) -> tuple[BusinessErrorInfo, ...]:
    errors = []
    for item in raw or ():  # type: ignore[attr-defined]
        if isinstance(item, dict) and item.get("code"):
            text = mask_secrets(str(item.get("text") or item.get("message") or ""))
            errors.append(BusinessErrorInfo(str(item["code"]), text))
    return tuple(errors)


def is_held(message: Any) -> bool:
    """Whether ``message`` is held for an operator (a call in doubt): its source system is told later."""
    return getattr(message, "last_error_code", None) == HELD_ERROR_CODE


def confirmation_id_of(row: Any) -> str:
    """The confirmation id of a ``confirmation`` row (one derived from the row for rows made before ids existed)."""
    if row.confirmation_id:
        return str(row.confirmation_id)
    return str(uuid.uuid5(_LEGACY_ID_NAMESPACE, f"{row.id}:{row.message_id}:{MessageState(row.outcome_state).value}"))


def request_from_message(
    row: sa.Row[Any], outcome_state: str, confirmation_id: str | None = None
) -> ConfirmationRequest:
    """The confirmation of a message row (``message`` table columns) that ended in ``outcome_state``."""
    return ConfirmationRequest(
        confirmation_id=confirmation_id,
        message_id=row.id,
        correlation_id=row.correlation_id,
        source_system=row.source_system,
        state=outcome_state,
        process_id=row.process_id,
        service=row.service,
        operation=row.operation,
        business_errors=_business_errors(row.business_errors),
        # the final state's error only: an OK message that failed before has no error (its history has them)
        error_code=None if outcome_state == "OK" else row.last_error_code,
        # stored masked; a row from before that is masked here, before it leaves for the source system
        error_text=None if outcome_state == "OK" or row.last_error_text is None else mask_secrets(row.last_error_text),
        finished_at=row.last_update_ts,
        traceparent=getattr(row, "traceparent", None),
    )


def requests_for(rows: Iterable[Any], messages: Mapping[int, Any]) -> dict[int, ConfirmationRequest | str]:
    """What to send for each claimed ``confirmation`` row, by message id: the request built from its message row in
    ``messages``, or why there is none (a text: the attempt fails with it)."""
    result: dict[int, ConfirmationRequest | str] = {}
    for row in rows:
        message = messages.get(row.message_id)
        if message is None:
            result[row.message_id] = f"message {row.message_id} is no longer in the store"
            continue
        try:
            result[row.message_id] = request_from_message(message, MessageState(row.outcome_state).value,
                                                          confirmation_id_of(row))
        except InvalidConfirmationError as error:
            result[row.message_id] = f"message {row.message_id} cannot be confirmed: {error}"
    return result
