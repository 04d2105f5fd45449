"""The outcome rules (openroute/engine/outcome.py): when a message is FAILED, without a database."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from openroute.persistence import MessageState, StoredMessage

from openroute.definitions.errors import BusinessError, CircuitOpenError, TechnicalError, ValidationError
from openroute.definitions.retry import ENGINE_DECIDED_CODES, ErrorAction, ErrorPolicy, RetryPolicy
from openroute.engine import outcome
from openroute.engine.idempotency import CallInDoubtError
from openroute.engine.outcome import ErrorCode

NOW = datetime(2026, 11, 23, 10, 0, tzinfo=UTC)
POLICY = RetryPolicy(max_attempts=3, interval=timedelta(seconds=10), backoff=2.0)
POSTPONE = timedelta(seconds=30)


def message(**changes: Any) -> StoredMessage:
    values: dict[str, Any] = dict(
        id=7, correlation_id="c-1", source_system="crm", process_id=None, service="crm", operation="setCustomer",
        object_id="42", entity_type="customer", funnel_value=None, payload="{}", content_type="application/json",
        headers={}, state=MessageState.PROCESSING, failed_count=0, receive_ts=NOW, msg_ts=None,
        start_process_ts=NOW, last_update_ts=NOW, next_attempt_at=None, node_id="node-a",
        custom_data={"seen": 1}, business_errors=[], last_error_code=None, last_error_text=None,
        parent_id=None, version=2,
    )
    values.update(changes)
    return StoredMessage(**values)


def attempt(error: BaseException | None, msg: StoredMessage | None = None, **options: Any) -> outcome.Decision:
    settings: dict[str, Any] = dict(custom_data={"seen": 2}, business_errors=[], no_effect=False, postponed_for=None,
                                    has_children=False, policy=POLICY, postpone_interval=POSTPONE, now=NOW)
    settings.update(options)
    return outcome.after_attempt(msg or message(), error, **settings)


def test_steps_that_run_through_end_ok_with_their_custom_data() -> None:
    decision = attempt(None)
    assert decision.target is MessageState.OK and decision.final
    assert decision.changes == {"custom_data": {"seen": 2}, "business_errors": [], "next_attempt_at": None,
                                "parked_on": None}


def test_a_split_waits_for_its_children_and_a_postponed_attempt_is_due_after_its_delay() -> None:
    assert attempt(None, has_children=True).target is MessageState.WAITING_FOR_CHILDREN
    later = attempt(None, postponed_for=timedelta(seconds=5))
    assert later.target is MessageState.POSTPONED and later.changes["next_attempt_at"] == NOW + timedelta(seconds=5)
    default = attempt(None, postponed_for=timedelta(-1))  # the exchange's "engine default" marker
    assert default.changes["next_attempt_at"] == NOW + POSTPONE
    assert not default.final


def test_a_business_error_fails_at_once_and_is_kept_with_the_message() -> None:
    error = BusinessError("NO_CREDIT", "customer has no credit")
    decision = attempt(error, business_errors=[{"code": "A", "text": "a"}])
    assert decision.target is MessageState.FAILED
    assert decision.changes["business_errors"] == [{"code": "A", "text": "a"},
                                                   {"code": "NO_CREDIT", "text": "customer has no credit"}]
    assert decision.changes["last_error_code"] == "NO_CREDIT" and "failed_count" not in decision.changes


def test_a_validation_error_fails_at_once_without_counting() -> None:
    decision = attempt(ValidationError("bad customer id"))
    assert decision.target is MessageState.FAILED
    assert decision.changes["last_error_code"] == ErrorCode.VALIDATION_ERROR == "VALIDATION_ERROR"
    assert decision.changes["next_attempt_at"] is None and "failed_count" not in decision.changes


def test_custom_data_that_is_not_json_is_a_validation_error_keeping_the_old_data() -> None:
    decision = attempt(None, custom_data={"when": object()})
    assert decision.target is MessageState.FAILED
    assert decision.changes["custom_data"] == {"seen": 1}
    assert "not JSON" in decision.changes["last_error_text"]


def test_a_technical_error_counts_and_is_retried_until_the_policy_is_exhausted() -> None:
    first = attempt(TechnicalError("billing down", code="BILLING_DOWN"))
    assert first.target is MessageState.PARTLY_FAILED
    assert first.changes["failed_count"] == 1
    assert first.changes["next_attempt_at"] == NOW + timedelta(seconds=10)
    assert first.changes["last_error_code"] == "BILLING_DOWN"
    second = attempt(ConnectionError("refused"), message(failed_count=1))
    assert second.changes["next_attempt_at"] == NOW + timedelta(seconds=20)
    assert second.changes["last_error_code"] == "ConnectionError"
    last = attempt(ConnectionError("refused"), message(failed_count=2))
    assert last.target is MessageState.FAILED and last.final
    assert last.changes["failed_count"] == 3 and last.changes["next_attempt_at"] is None


def test_an_attempt_without_effect_retries_without_counting() -> None:
    decision = attempt(ConnectionError("refused"), message(failed_count=2), no_effect=True)
    assert decision.target is MessageState.PARTLY_FAILED
    assert "failed_count" not in decision.changes
    assert decision.changes["next_attempt_at"] == NOW + timedelta(seconds=20)


def test_long_error_texts_are_clipped() -> None:
    decision = attempt(TechnicalError("x" * 10_000))
    assert len(decision.changes["last_error_text"]) == outcome.MAX_ERROR_TEXT
    assert decision.changes["last_error_text"].endswith("...")


@pytest.mark.parametrize(("failed_count", "target"), [(0, MessageState.PARTLY_FAILED), (2, MessageState.FAILED)])
def test_an_abandoned_message_is_a_technical_failure_due_now(failed_count: int, target: MessageState) -> None:
    decision = outcome.abandoned(message(failed_count=failed_count), POLICY, NOW)
    assert decision.target is target
    assert decision.changes["failed_count"] == failed_count + 1
    assert decision.changes["next_attempt_at"] == (NOW if target is MessageState.PARTLY_FAILED else None)
    assert decision.changes["last_error_code"] == "PROCESSING_ABANDONED"
    assert "node-a" in decision.changes["last_error_text"]


def test_a_parent_fails_with_its_failed_childrens_errors_and_ends_ok_when_all_are_done() -> None:
    parent = message(state=MessageState.WAITING_FOR_CHILDREN, business_errors=[{"code": "P", "text": "p"}])
    ok = message(id=8, state=MessageState.OK)
    skipped = message(id=9, state=MessageState.SKIPPED)
    failed = message(id=10, state=MessageState.FAILED, business_errors=[{"code": "C", "text": "c"}])
    running = message(id=11, state=MessageState.PROCESSING)
    assert outcome.parent_outcome(parent, [ok, running]) is None
    assert outcome.parent_outcome(parent, [ok, skipped]) == outcome.Decision(MessageState.OK, {"next_attempt_at": None})
    decision = outcome.parent_outcome(parent, [ok, failed, running])
    assert decision is not None and decision.target is MessageState.FAILED
    assert decision.changes["business_errors"] == [{"code": "P", "text": "p"}, {"code": "C", "text": "c"}]
    assert decision.changes["last_error_code"] == "CHILD_FAILED" and "10" in decision.changes["last_error_text"]
    cancelled = outcome.parent_outcome(parent, [message(id=12, state=MessageState.CANCEL)])
    assert cancelled is not None and cancelled.target is MessageState.FAILED


def test_obsolete_funnel_dropped_cancel_and_restart_decisions() -> None:
    assert outcome.obsolete(message()).target is MessageState.SKIPPED
    assert outcome.obsolete(message()).changes["last_error_code"] == "OBSOLETE"
    held = outcome.held_by_funnel("customer-42", 3)
    assert held.target is MessageState.POSTPONED and held.changes["next_attempt_at"] is None, "not due by time"
    assert held.changes["last_error_code"] == "FUNNEL" and "message 3" in held.changes["last_error_text"]
    dropped = outcome.dropped(message(), "spam", {"bad": object()})
    assert dropped.target is MessageState.SKIPPED and dropped.changes["custom_data"] == {"seen": 1}
    assert dropped.changes["last_error_code"] == "DROPPED" and dropped.changes["last_error_text"] == "spam"
    assert outcome.cancelled() == outcome.Decision(MessageState.CANCEL, {
        "next_attempt_at": None, "parked_on": None, "last_error_code": "CANCELLED", "last_error_text": "cancelled",
        "last_error_trace": None})
    assert outcome.cancelled("asked by crm").changes["last_error_text"] == "asked by crm"
    assert outcome.restarted(NOW) == outcome.Decision(  # a new attempt history: no business errors carried over
        MessageState.PARTLY_FAILED, {"next_attempt_at": NOW, "failed_count": 0, "business_errors": []})


def test_success_ends_the_current_error_and_history_keeps_it() -> None:
    """Issue 26: an attempt that succeeds after failures leaves no current error (the transition rows keep them)."""
    failed_before = message(failed_count=1, last_error_code="HLR_DOWN", last_error_text="hlr is down",
                            state=MessageState.PROCESSING)
    decision = attempt(None, failed_before)
    assert decision.target is MessageState.OK
    assert (decision.changes["last_error_code"], decision.changes["last_error_text"],
            decision.changes["last_error_trace"]) == (None, None, None)
    assert "last_error_code" not in attempt(None).changes  # nothing to clear: nothing written
    parent = message(state=MessageState.WAITING_FOR_CHILDREN, last_error_code="FUNNEL", last_error_text="held")
    done = outcome.parent_outcome(parent, [message(id=8, state=MessageState.OK)])
    assert done is not None and done.changes["last_error_code"] is None


@pytest.mark.parametrize(("error", "expected"), [
    (TechnicalError("down", code="HLR_DOWN"), True), (ConnectionError("refused"), True), (TimeoutError(), True),
    (BusinessError("NO_CREDIT", "none"), True), (KeyError("x"), False), (ZeroDivisionError(), False)])
def test_only_unexpected_errors_keep_a_traceback(error: Exception, expected: bool) -> None:
    assert outcome.is_expected_error(error) is expected
    try:
        raise error
    except Exception as raised:
        trace = outcome.error_trace(raised)
    assert (trace is None) is expected
    if not expected:
        assert trace is not None and trace.startswith("Traceback") and len(trace) <= outcome.MAX_ERROR_TRACE


def test_a_refused_call_parks_on_its_system_without_an_attempt_unless_nodes_raced_for_the_breaker() -> None:
    from openroute.definitions.errors import CircuitOpenError

    opened_until = NOW + timedelta(seconds=20)
    for state in ("OPEN", "HALF_OPEN"):
        decision = attempt(CircuitOpenError("HLR", opened_until, state))
        assert decision.target is MessageState.POSTPONED and "failed_count" not in decision.changes
        assert decision.changes["parked_on"] == "HLR" and decision.changes["next_attempt_at"] is None, state
        assert decision.changes["last_error_code"] == "CIRCUIT_OPEN"
    raced = attempt(CircuitOpenError("HLR", NOW + timedelta(seconds=1), "contended"))
    assert raced.target is MessageState.POSTPONED and raced.changes["parked_on"] is None
    assert raced.changes["next_attempt_at"] == NOW + timedelta(seconds=1), "due again soon: not parked"


def test_a_message_given_back_by_a_stopping_node_is_due_at_once_and_leaves_its_funnel_queue() -> None:
    waiting = message(last_error_code="FUNNEL", last_error_text="waits for funnel 'x'")
    given_back = outcome.handed_back(waiting, NOW)
    assert given_back.target is MessageState.POSTPONED and given_back.changes["next_attempt_at"] == NOW
    assert given_back.changes["last_error_code"] is None and given_back.changes["parked_on"] is None
    other = outcome.handed_back(message(last_error_code="HTTP_503"), NOW)
    assert "last_error_code" not in other.changes, "any other error stays"


# -- per-error policies (.on_error in the DSL) -------------------------------------------------------------------
TEN_TIMES = RetryPolicy(max_attempts=10, interval=timedelta(seconds=5), backoff=1.0)
SLOW = RetryPolicy(max_attempts=3, interval=timedelta(minutes=10), backoff=1.0, max_interval=timedelta(minutes=10))


class AccountClosed(Exception):
    pass


POLICIES = (
    ErrorPolicy(("TIMEOUT",), retry=TEN_TIMES),
    ErrorPolicy(("HTTP_5*",), retry=SLOW),
    ErrorPolicy(("HTTP_404",), (KeyError,), action=ErrorAction.NEVER_RETRY),
    ErrorPolicy((), (AccountClosed,), action=ErrorAction.FAIL),
    ErrorPolicy(("HTTP_423",), action=ErrorAction.RETRY),  # a business answer, retried per the route's policy
)


def on_error(error: BaseException, failed_count: int = 0, **options: Any) -> outcome.Decision:
    return attempt(error, message(failed_count=failed_count), error_policies=POLICIES, **options)


def test_an_error_the_route_names_is_retried_per_its_own_policy_past_the_default() -> None:
    timeout = TechnicalError("no answer", code="TIMEOUT")
    third = on_error(timeout, failed_count=2)  # the route's POLICY would end it FAILED here (3 attempts)
    assert third.target is MessageState.PARTLY_FAILED and third.changes["failed_count"] == 3
    assert third.changes["next_attempt_at"] == NOW + timedelta(seconds=5)
    tenth = on_error(timeout, failed_count=9)
    assert tenth.target is MessageState.FAILED and tenth.changes["failed_count"] == 10
    assert attempt(timeout, message(failed_count=2)).target is MessageState.FAILED  # no policies: the route's


def test_a_pattern_matches_the_codes_it_covers_only() -> None:
    slow = on_error(TechnicalError("unavailable", code="HTTP_503"))
    assert slow.target is MessageState.PARTLY_FAILED and slow.changes["next_attempt_at"] == NOW + timedelta(minutes=10)
    other = on_error(TechnicalError("teapot", code="HTTP_418"))  # not HTTP_5*: the route's policy
    assert other.changes["next_attempt_at"] == NOW + timedelta(seconds=10)
    assert on_error(TechnicalError("x", code="http_503")).changes["next_attempt_at"] == NOW + timedelta(seconds=10)


def test_never_retry_fails_after_this_attempt_as_the_technical_error_it_is() -> None:
    for error in (TechnicalError("gone", code="HTTP_404"), KeyError("customer")):
        decision = on_error(error)
        assert decision.target is MessageState.FAILED and decision.changes["failed_count"] == 1
        assert decision.changes["business_errors"] == [] and decision.changes["next_attempt_at"] is None
    assert on_error(KeyError("customer")).changes["last_error_code"] == "KeyError"


def test_fail_at_once_is_a_business_error_kept_for_the_confirmation_without_counting() -> None:
    decision = on_error(AccountClosed("account A-1 is closed"), failed_count=1)
    assert decision.target is MessageState.FAILED and "failed_count" not in decision.changes
    assert decision.changes["business_errors"] == [{"code": "AccountClosed", "text": "account A-1 is closed"}]
    assert (decision.changes["last_error_code"], decision.changes["last_error_trace"]) == ("AccountClosed", None)


def test_a_business_error_the_route_names_for_retry_is_retried() -> None:
    locked = on_error(BusinessError("HTTP_423", "record locked"))
    assert locked.target is MessageState.PARTLY_FAILED and locked.changes["failed_count"] == 1
    assert locked.changes["business_errors"] == [] and locked.changes["last_error_code"] == "HTTP_423"
    assert on_error(BusinessError("NO_CREDIT", "none")).target is MessageState.FAILED  # not named: at once


def test_the_errors_the_engine_decides_ignore_the_routes_policies() -> None:
    everything = (ErrorPolicy(("*",), action=ErrorAction.FAIL),)
    invalid = attempt(ValidationError("bad"), error_policies=everything)
    assert invalid.changes["last_error_code"] == "VALIDATION_ERROR" and invalid.changes["business_errors"] == []
    parked = attempt(CircuitOpenError("HLR", NOW + timedelta(seconds=20)), error_policies=everything)
    assert parked.target is MessageState.POSTPONED and "failed_count" not in parked.changes
    doubt = attempt(CallInDoubtError("hlr", "k-1", "no outcome"), error_policies=everything)
    assert doubt.changes["last_error_code"] == "CALL_IN_DOUBT" and doubt.changes["business_errors"] == []
    assert attempt(TechnicalError("x"), error_policies=everything).changes["business_errors"] == [
        {"code": "TECHNICAL_ERROR", "text": "x"}]


def test_the_first_policy_naming_an_error_decides() -> None:
    first = (ErrorPolicy(("HTTP_503",), action=ErrorAction.NEVER_RETRY), ErrorPolicy(("HTTP_5*",), retry=SLOW))
    assert attempt(TechnicalError("x", code="HTTP_503"), error_policies=first).target is MessageState.FAILED
    assert attempt(TechnicalError("x", code="HTTP_502"), error_policies=first).target is MessageState.PARTLY_FAILED


def test_the_engine_decided_codes_are_codes_the_engine_writes() -> None:
    assert {code.value for code in ErrorCode} >= ENGINE_DECIDED_CODES


def test_a_plain_ok_changes_nothing_but_the_state_and_succeeded_decides_as_after_attempt() -> None:
    """An OK that writes what the snapshot holds already has no changes (the writer would find none to write);
    ``succeeded`` is after_attempt for an attempt that ran through, neither postponed nor split."""
    plain = message(custom_data={})
    decision = attempt(None, plain, custom_data={})
    assert decision.target is MessageState.OK and dict(decision.changes) == {}
    assert outcome.succeeded(plain, {}, []) is decision
    for msg, custom_data, errors in [
        (message(), {"seen": 2}, []), (plain, {}, [{"code": "A", "text": "a"}]), (plain, {"x": object()}, []),
        (message(custom_data={}, last_error_code="X"), {}, []), (message(custom_data={}, parked_on="HLR"), {}, []),
        (message(custom_data={}, next_attempt_at=NOW), {}, []), (message(custom_data={}, business_errors=[{}]), {}, []),
    ]:
        expected = attempt(None, msg, custom_data=custom_data, business_errors=errors)
        assert expected.changes, msg
        decided = outcome.succeeded(msg, custom_data, errors)
        assert (decided.target, decided.changes) == (expected.target, expected.changes)
