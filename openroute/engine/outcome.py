"""Outcome rules: which state a message goes to next, and what changes with it (pure functions, no store).

This is the one place that answers "when is a message FAILED?". A message ends FAILED when

- a step raises a :class:`~openroute.definitions.errors.BusinessError` (or one of the route's business exceptions,
  unless the route continues on business errors) or a :class:`~openroute.definitions.errors.ValidationError`
  (its route is gone, or its custom data is not JSON), at once, without retries;
- a technical failure (any other exception, or its node dying while it was PROCESSING) brings its failed
  count to the retry policy's ``max_attempts``; before that it is PARTLY_FAILED and due again after the
  policy's delay (an attempt that declared no effect retries without counting);
- an error the route names in ``.on_error(...)`` (:class:`~openroute.definitions.retry.ErrorPolicy`, the first that
  names it) follows that policy instead: retried per its own retry policy (a business error too), never retried (FAILED
  after this attempt, failed count + 1), or FAILED at once as a business error;
- one of its child messages ends FAILED or CANCEL (the parent of a split);
- a call in doubt of a route that holds such calls (:class:`~openroute.engine.idempotency.CallInDoubtError`):
  FAILED at once with error code ``CALL_IN_DOUBT``, failed count unchanged, held for an operator ("mark done" /
  "call again", both restart it); the source system is not confirmed until it reaches its real outcome.

A call that meets an open circuit breaker (:class:`~openroute.definitions.errors.CircuitOpenError`) fails nothing: the
message parks on the external system (POSTPONED, ``parked_on`` the system, no due time, its failed count unchanged)
until the engine releases it when the breaker lets calls through again (``engine/parking.py``).

The engine asks these functions for a :class:`Decision` and applies it through the state machine
(:mod:`openroute.engine.states`); nothing here touches the database, so every rule is tested without one.
"""

from __future__ import annotations

import json
import traceback
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum
from types import MappingProxyType
from typing import Any, Protocol

from openroute.definitions.errors import BusinessError, CircuitOpenError, ValidationError, is_expected_error
from openroute.definitions.retry import ErrorAction, ErrorPolicy, RetryPolicy, error_code, policy_for
from openroute.engine.idempotency import CallInDoubtError
from openroute.persistence import FINAL_STATES, MessageState, StoredMessage, mask_secrets, masked_value

__all__ = [
    "MAX_ERROR_TEXT",
    "NOT_ATTEMPTS",
    "Decision",
    "ErrorCode",
    "abandoned",
    "after_attempt",
    "cancelled",
    "clip",
    "dropped",
    "ends_attempt",
    "error_trace",
    "handed_back",
    "held_by_funnel",
    "is_expected_error",
    "obsolete",
    "parent_outcome",
    "parked",
    "restarted",
    "succeeded",
]

#: longest ``last_error_text`` stored (longer texts are clipped with "...")
MAX_ERROR_TEXT = 4000
#: longest ``last_error_trace`` stored (the traceback of an unexpected error; its end, where the error was raised, kept)
MAX_ERROR_TRACE = 8000
#: the current error of a state that has none (an attempt that succeeded ends every earlier error)
NO_ERROR: Mapping[str, Any] = {"last_error_code": None, "last_error_text": None, "last_error_trace": None}


class ErrorCode(StrEnum):
    """The ``last_error_code`` values the engine itself writes (a step's errors bring their own codes)."""

    VALIDATION_ERROR = "VALIDATION_ERROR"
    PROCESSING_ABANDONED = "PROCESSING_ABANDONED"
    CHILD_FAILED = "CHILD_FAILED"
    OBSOLETE = "OBSOLETE"
    FUNNEL = "FUNNEL"
    DROPPED = "DROPPED"
    CANCELLED = "CANCELLED"
    EXT_CALL_IN_PROGRESS = "EXT_CALL_IN_PROGRESS"
    #: held for an operator: a call an earlier attempt started has no recorded outcome (see CallInDoubtError)
    CALL_IN_DOUBT = "CALL_IN_DOUBT"
    CIRCUIT_OPEN = "CIRCUIT_OPEN"


#: the codes of changes out of PROCESSING that ended no attempt: the message was held back before its steps (a
#: funnel, a newer message) or a call of it was refused by a circuit breaker (no attempt counted)
NOT_ATTEMPTS = frozenset({ErrorCode.FUNNEL.value, ErrorCode.OBSOLETE.value, ErrorCode.CIRCUIT_OPEN.value})


def ends_attempt(from_state: MessageState | str | None, error_code: str | None) -> bool:
    """Does a state change (a ``message_transition`` row) end an attempt, a run of the route's steps? Every change
    out of PROCESSING does, except those of :data:`NOT_ATTEMPTS`. Counted over a message's transitions, this is its
    number of attempts over its whole history: the failed count starts again at each restart, the history does
    not (the admin API's message detail and the Spark audit count them so)."""
    return from_state == MessageState.PROCESSING and error_code not in NOT_ATTEMPTS


#: the default of ``Decision.changes``: each decision without changes gets a dict of its own
_NO_CHANGES: Mapping[str, Any] = MappingProxyType({})


@dataclass(frozen=True)
class Decision:
    """The next state of a message and the columns that change with it (for ``states.transition``)."""

    target: MessageState
    changes: Mapping[str, Any] = field(default_factory=dict)

    def __init__(self, target: MessageState, changes: Mapping[str, Any] = _NO_CHANGES) -> None:
        # written out: a frozen dataclass's own __init__ sets each field through object.__setattr__ (about 1,300
        # instructions a field), and every attempt decides once (tests/engine/test_written_out_inits.py holds it to
        # them); the fields put in its __dict__ in one update (item by item, 3.11 does not specialise reads of them)
        self.__dict__.update({"target": target, "changes": {} if changes is _NO_CHANGES else changes})

    @property
    def final(self) -> bool:
        """True for OK, FAILED, SKIPPED and CANCEL."""
        return self.target in FINAL_STATES


def clip(text: str) -> str:
    """``text`` as an error text is stored: its secrets masked (:func:`~openroute.persistence.mask_secrets`), so a
    search by error text finds only what is shown, and cut to :data:`MAX_ERROR_TEXT` characters (the end replaced
    by "...")."""
    text = mask_secrets(text)
    return text if len(text) <= MAX_ERROR_TEXT else text[: MAX_ERROR_TEXT - 3] + "..."


def error_trace(error: BaseException) -> str | None:
    """The traceback text of an unexpected ``error`` (its last :data:`MAX_ERROR_TRACE` characters, its secrets
    masked), None for an expected one (see :func:`is_expected_error`)."""
    if is_expected_error(error):
        return None
    text = mask_secrets("".join(traceback.format_exception(error)).rstrip())
    return text if len(text) <= MAX_ERROR_TRACE else "..." + text[-(MAX_ERROR_TRACE - 3):]


def _cleared(message: StoredMessage) -> Mapping[str, Any]:
    """The changes that end ``message``'s current error (none when it has none: most messages)."""
    if message.last_error_code is None and message.last_error_text is None and message.last_error_trace is None:
        return {}
    return NO_ERROR


def after_attempt(
    message: StoredMessage,
    error: BaseException | None,
    *,
    custom_data: Any,
    business_errors: Sequence[Mapping[str, Any]],
    no_effect: bool,
    postponed_for: timedelta | None,
    has_children: bool,
    policy: RetryPolicy,
    postpone_interval: timedelta,
    now: datetime,
    error_policies: Sequence[ErrorPolicy] = (),
    failed_on: str | None = None,
) -> Decision:
    """The outcome of one processing attempt of ``message`` that ended with ``error`` (None: the steps ran).

    Success: POSTPONED when the route postponed it (``postponed_for`` negative: ``postpone_interval``),
    WAITING_FOR_CHILDREN when it split, else OK; each clears the current error (earlier failures stay in the
    message's transition rows). A business or validation error: FAILED at once. Any other
    error is technical (a call held in doubt: FAILED at once, code CALL_IN_DOUBT; a :class:`CircuitOpenError`:
    parked on its system, no attempt counted, see :func:`parked`): PARTLY_FAILED with the failed count + 1
    (unchanged when ``no_effect``) and due per ``policy``, or FAILED when that count exhausts the policy (a failed
    call of the declared system ``failed_on`` also makes the PARTLY_FAILED message wait for that system: released
    at once when its breaker closes, whatever its due time). An error one of the route's ``error_policies`` names
    (besides those the engine decides: validation, call in doubt, open breaker) follows that policy instead.
    Custom data or business errors that are not JSON turn the attempt into a validation error (the message keeps
    its previous custom data).
    """
    if error is None and postponed_for is None and not has_children and _changes_nothing(message, custom_data,
                                                                                         business_errors):
        return _PLAIN_OK
    try:
        # empty containers (most attempts) are JSON as they are: no need to serialise them to know it
        if custom_data or custom_data.__class__ is not dict:
            json.dumps(custom_data)
        if business_errors:
            json.dumps(list(business_errors))
    except (TypeError, ValueError) as bad:
        custom_data = message.custom_data
        error = ValidationError(f"custom data or business errors are not JSON: {bad}")
    # business errors go to operators and in the confirmation to the source system: stored masked
    kept = masked_value(list(business_errors)) if business_errors else []
    changes: dict[str, Any] = {"custom_data": custom_data, "business_errors": kept, "parked_on": None}
    if error is None:
        changes.update(_cleared(message))
        if postponed_for is not None:
            delay = postponed_for if postponed_for >= timedelta(0) else postpone_interval
            changes["next_attempt_at"] = now + delay
            return Decision(_POSTPONED, changes)
        changes["next_attempt_at"] = None
        return Decision(_WAITING if has_children else _OK, changes)
    chosen = None if isinstance(error, _DECIDED_HERE) else policy_for(error, error_policies)
    if chosen is not None:
        return _by_error_policy(message, error, chosen, changes, policy, no_effect, now, failed_on)
    if isinstance(error, BusinessError):
        changes["business_errors"].append(masked_value(error.to_dict()))
        changes.update(last_error_code=error.code, last_error_text=clip(error.text), next_attempt_at=None,
                       last_error_trace=None)
        return Decision(MessageState.FAILED, changes)
    if isinstance(error, ValidationError):
        changes.update(last_error_code=ErrorCode.VALIDATION_ERROR.value, last_error_text=clip(str(error)),
                       next_attempt_at=None, last_error_trace=None)
        return Decision(MessageState.FAILED, changes)
    if isinstance(error, CallInDoubtError):
        # not retried on its own: the next attempt would find the same doubt; an operator decides (no count)
        changes.update(last_error_code=ErrorCode.CALL_IN_DOUBT.value, last_error_text=clip(error.text),
                       next_attempt_at=None)
        return Decision(MessageState.FAILED, changes)
    if isinstance(error, CircuitOpenError):
        changes.update(parked(error, now))
        return Decision(MessageState.POSTPONED, changes)
    return _technical(message, error, changes, policy, no_effect, now, failed_on)


# the outcomes of a successful attempt: Python 3.11's EnumType.__getattr__ makes each ``MessageState.X`` a lookup of
# about 900 instructions, a module name costs a tenth of that (every attempt decides once)
_OK, _POSTPONED, _WAITING = MessageState.OK, MessageState.POSTPONED, MessageState.WAITING_FOR_CHILDREN
#: the errors whose outcome is decided here whatever the route's error policies say
_DECIDED_HERE = (ValidationError, CallInDoubtError, CircuitOpenError)
#: the policy of an error that is never retried: the attempt that met it is the last
_NEVER = RetryPolicy(max_attempts=1)


#: the OK of an attempt that changes nothing but the state (see _changes_nothing): one immutable decision for all of
#: them, not a Decision and a dict each
_PLAIN_OK = Decision(_OK, MappingProxyType({}))


def succeeded(message: StoredMessage, custom_data: Any, business_errors: Sequence[Mapping[str, Any]]) -> Decision:
    """:func:`after_attempt` of an attempt of ``message`` whose steps ran to their end, neither postponed nor split:
    OK (FAILED when its custom data or business errors are not JSON). One positional call: every attempt that
    succeeds decides here, and a call with after_attempt's keywords costs as much as the decision."""
    if _changes_nothing(message, custom_data, business_errors):
        return _PLAIN_OK
    # neither the policies nor the time are read for an attempt without error that is not postponed
    return after_attempt(message, None, custom_data=custom_data, business_errors=business_errors, no_effect=False,
                         postponed_for=None, has_children=False, policy=_NEVER, postpone_interval=timedelta(0),
                         now=message.last_update_ts)


def _changes_nothing(message: StoredMessage, custom_data: Any, business_errors: Sequence[Mapping[str, Any]]) -> bool:
    """Whether the OK of an attempt of ``message`` that left ``custom_data`` and ``business_errors`` changes nothing
    but its state: no custom data and no business errors, as the snapshot, which has no error to clear, nothing
    due and is not parked (most attempts). Its changes are then empty: the writer's comparison of them with the
    snapshot (``states._changed``) would find nothing to write either."""
    if business_errors or custom_data.__class__ is not dict or custom_data:
        return False
    # the snapshot's __dict__ holds every field (StoredMessage.from_values), and a read of it costs a third of an
    # attribute's (a __dict__ written whole is a plain dict, which 3.11 does not specialise attribute reads for)
    fields = message.__dict__
    return (not fields["custom_data"] and not fields["business_errors"] and fields["last_error_code"] is None
            and fields["last_error_text"] is None and fields["last_error_trace"] is None
            and fields["next_attempt_at"] is None and fields["parked_on"] is None)


def _technical(message: StoredMessage, error: BaseException, changes: dict[str, Any], policy: RetryPolicy,
               no_effect: bool, now: datetime, failed_on: str | None) -> Decision:
    """A technical failure: PARTLY_FAILED due per ``policy`` with the failed count + 1, FAILED once exhausted."""
    changes.update(last_error_code=error_code(error)[:100], last_error_text=clip(f"{type(error).__name__}: {error}"),
                   last_error_trace=error_trace(error))
    if no_effect:
        # the route declared this attempt did nothing: retry, but it does not count
        changes["next_attempt_at"] = now + policy.delay(max(message.failed_count, 1))
        return Decision(MessageState.PARTLY_FAILED, changes)
    failed = message.failed_count + 1
    due = policy.next_attempt(failed, now)
    # a failed call of a declared system: retried when due, or as soon as that system's breaker closes
    changes.update(failed_count=failed, next_attempt_at=due, parked_on=failed_on if due is not None else None)
    return Decision(MessageState.PARTLY_FAILED if due is not None else MessageState.FAILED, changes)


def parked(error: CircuitOpenError, now: datetime) -> dict[str, Any]:
    """The changes of a message whose call ``error`` refused: the call was not made, so no attempt is counted.

    Refused by an OPEN or HALF_OPEN breaker, it parks on the system: no due time, released when the breaker lets
    calls through again. Refused because nodes raced for the breaker's row (``contended``), it is due again at the
    error's ``retry_at``."""
    changes: dict[str, Any] = {"last_error_code": ErrorCode.CIRCUIT_OPEN.value, "last_error_text": clip(str(error)),
                               "last_error_trace": None}
    if error.parks:
        changes.update(next_attempt_at=None, parked_on=error.system)
    else:
        changes["next_attempt_at"] = max(error.retry_at, now)
    return changes


def _by_error_policy(message: StoredMessage, error: BaseException, chosen: ErrorPolicy, changes: dict[str, Any],
                     route_policy: RetryPolicy, no_effect: bool, now: datetime, failed_on: str | None) -> Decision:
    """The outcome of an error the route's ``chosen`` error policy names."""
    if chosen.action is ErrorAction.FAIL:
        failure = error if isinstance(error, BusinessError) else BusinessError(
            error_code(error)[:100], str(error) or type(error).__name__)
        changes["business_errors"].append(masked_value(failure.to_dict()))
        changes.update(last_error_code=failure.code, last_error_text=clip(failure.text), next_attempt_at=None,
                       last_error_trace=None)
        return Decision(MessageState.FAILED, changes)
    if chosen.action is ErrorAction.NEVER_RETRY:
        return _technical(message, error, changes, _NEVER, False, now, None)
    return _technical(message, error, changes, chosen.retry or route_policy, no_effect, now, failed_on)


def abandoned(message: StoredMessage, policy: RetryPolicy, now: datetime) -> Decision:
    """A PROCESSING message whose node died (or ran past the lease): a technical failure, due now if retried."""
    failed = message.failed_count + 1
    due = policy.next_attempt(failed, now)
    return Decision(MessageState.PARTLY_FAILED if due is not None else MessageState.FAILED, {
        "failed_count": failed,
        "next_attempt_at": now if due is not None else None,
        "parked_on": None,
        "last_error_code": ErrorCode.PROCESSING_ABANDONED.value,
        "last_error_text": clip(f"node {message.node_id} did not finish processing "
                                f"(started {message.start_process_ts})"),
        "last_error_trace": None,
    })


def parent_outcome(parent: StoredMessage, children: Sequence[StoredMessage]) -> Decision | None:
    """A parent WAITING_FOR_CHILDREN: FAILED as soon as a child is FAILED or CANCEL (their business errors
    join the parent's), OK when every child is OK or SKIPPED, None while some child is not final."""
    failed = [c for c in children if c.state in (MessageState.FAILED, MessageState.CANCEL)]
    if failed:
        errors = list(parent.business_errors)
        for child in failed:
            errors.extend(child.business_errors)
        return Decision(MessageState.FAILED, {
            "next_attempt_at": None, "business_errors": errors, "last_error_code": ErrorCode.CHILD_FAILED.value,
            "last_error_text": "child messages ended FAILED or CANCEL: " + ", ".join(str(c.id) for c in failed),
        })
    if all(c.state in (MessageState.OK, MessageState.SKIPPED) for c in children):
        return Decision(MessageState.OK, {"next_attempt_at": None, **_cleared(parent)})
    return None


class OfEntity(Protocol):
    """What :func:`obsolete` reads of a message: its entity (a :class:`StoredMessage`, or a reprocessing plan's row)."""

    @property
    def entity_type(self) -> str | None: ...

    @property
    def object_id(self) -> str | None: ...


def obsolete(message: OfEntity) -> Decision:
    """A newer message of the same entity already ended OK: this one ends SKIPPED without running."""
    return Decision(MessageState.SKIPPED, {
        "next_attempt_at": None, "last_error_code": ErrorCode.OBSOLETE.value,
        "last_error_text": clip(f"a newer message for {message.entity_type} {message.object_id} ended OK"),
        "last_error_trace": None,
    })


def held_by_funnel(funnel: str, blocker: int) -> Decision:
    """Message ``blocker`` holds the funnel value (or, with guaranteed order, is older and not final): the message
    waits in the funnel's queue, POSTPONED with no due time, until the funnel is handed to it
    (``engine/funnel.py``)."""
    return Decision(MessageState.POSTPONED, {
        "next_attempt_at": None, "last_error_code": ErrorCode.FUNNEL.value,
        "last_error_text": clip(f"waits for funnel {funnel!r}, held by message {blocker}"),
        "last_error_trace": None,
    })


def handed_back(message: StoredMessage, now: datetime) -> Decision:
    """A message claimed for a node that stopped before it ran: POSTPONED, due at once for any node, out of the
    funnel's queue and off any parking (it never ran on this claim, so nothing else changes)."""
    changes: dict[str, Any] = {"next_attempt_at": now, "parked_on": None}
    if message.last_error_code == ErrorCode.FUNNEL.value:
        changes.update(last_error_code=None, last_error_text=None, last_error_trace=None)
    return Decision(MessageState.POSTPONED, changes)


def dropped(message: StoredMessage, reason: str, custom_data: Any) -> Decision:
    """An interceptor dropped the message: SKIPPED, the reason recorded (custom data kept if it is JSON)."""
    try:
        json.dumps(custom_data)
    except (TypeError, ValueError):
        custom_data = message.custom_data
    return Decision(MessageState.SKIPPED, {
        "next_attempt_at": None, "custom_data": custom_data,
        "last_error_code": ErrorCode.DROPPED.value, "last_error_text": clip(reason),
        "last_error_trace": None,
    })


def cancelled(reason: str | None = None) -> Decision:
    """An operator cancelled the message: CANCEL (final), nothing due, error code CANCELLED with ``reason``."""
    return Decision(MessageState.CANCEL, {
        "next_attempt_at": None, "parked_on": None, "last_error_code": ErrorCode.CANCELLED.value,
        "last_error_text": clip(reason or "cancelled"),
        "last_error_trace": None,
    })


def restarted(now: datetime) -> Decision:
    """An operator restarted a FAILED or CANCEL message: PARTLY_FAILED, due now, a new attempt history (failed count
    back to 0, the earlier attempts' business errors cleared: the transition rows keep them)."""
    return Decision(MessageState.PARTLY_FAILED, {"next_attempt_at": now, "failed_count": 0, "business_errors": []})
