"""One test per applicable Reactive Streams rule, run against every publisher, processor and subscriber shipped.

The checks themselves live in ``openroute.streams.tck`` so that future publishers can reuse them.
"""

from __future__ import annotations

import pytest

from openroute.streams.tck import (
    ProcessorVerification,
    PublisherVerification,
    RuleNotApplicable,
    SubscriberVerification,
    verify_processor,
    verify_publisher,
)

from .cases import PROCESSORS, PUBLISHERS, RECOVERING, SUBSCRIBERS, PublisherCase

publisher_cases = pytest.mark.parametrize("case", PUBLISHERS, ids=[case.name for case in PUBLISHERS])
processor_cases = pytest.mark.parametrize("name", list(PROCESSORS))
subscriber_cases = pytest.mark.parametrize("make", list(SUBSCRIBERS.values()), ids=list(SUBSCRIBERS))


async def _publisher_rule(case: PublisherCase, rule: str) -> None:
    verification = PublisherVerification(case.make, max_elements=case.max_elements, make_failed_publisher=case.failed)
    try:
        await getattr(verification, rule)()
    except RuleNotApplicable as reason:
        pytest.skip(str(reason))


@publisher_cases
async def test_rule_1_1_on_next_not_more_than_requested(case: PublisherCase) -> None:
    await _publisher_rule(case, "rule_1_1_on_next_not_more_than_requested")


@publisher_cases
async def test_rule_1_2_may_signal_fewer_than_requested_then_complete(case: PublisherCase) -> None:
    await _publisher_rule(case, "rule_1_2_may_signal_fewer_than_requested_then_complete")


@publisher_cases
async def test_rule_1_3_signals_are_serial(case: PublisherCase) -> None:
    await _publisher_rule(case, "rule_1_3_signals_are_serial")


@publisher_cases
async def test_rule_1_4_failure_is_signalled_by_on_error(case: PublisherCase) -> None:
    await _publisher_rule(case, "rule_1_4_failure_is_signalled_by_on_error")


@publisher_cases
async def test_rule_1_5_completes_after_the_last_element(case: PublisherCase) -> None:
    await _publisher_rule(case, "rule_1_5_completes_after_the_last_element")


@publisher_cases
async def test_rule_1_5_empty_stream_completes(case: PublisherCase) -> None:
    await _publisher_rule(case, "rule_1_5_empty_stream_completes")


@publisher_cases
async def test_rule_1_6_terminal_signal_ends_the_subscription(case: PublisherCase) -> None:
    await _publisher_rule(case, "rule_1_6_terminal_signal_ends_the_subscription")


@publisher_cases
async def test_rule_1_7_no_signals_after_on_error(case: PublisherCase) -> None:
    await _publisher_rule(case, "rule_1_7_no_signals_after_on_error")


@publisher_cases
async def test_rule_1_9_on_subscribe_comes_first(case: PublisherCase) -> None:
    await _publisher_rule(case, "rule_1_9_on_subscribe_comes_first")


@publisher_cases
async def test_rule_1_9_subscribe_none_raises_type_error(case: PublisherCase) -> None:
    await _publisher_rule(case, "rule_1_9_subscribe_none_raises_type_error")


@publisher_cases
async def test_rule_1_11_each_subscriber_gets_on_subscribe(case: PublisherCase) -> None:
    await _publisher_rule(case, "rule_1_11_each_subscriber_gets_on_subscribe")


@publisher_cases
async def test_rule_3_2_request_from_on_next_is_allowed(case: PublisherCase) -> None:
    await _publisher_rule(case, "rule_3_2_request_from_on_next_is_allowed")


@publisher_cases
async def test_rule_3_3_recursion_between_request_and_on_next_is_bounded(case: PublisherCase) -> None:
    await _publisher_rule(case, "rule_3_3_recursion_between_request_and_on_next_is_bounded")


@publisher_cases
async def test_rule_3_6_request_after_cancel_is_a_no_op(case: PublisherCase) -> None:
    await _publisher_rule(case, "rule_3_6_request_after_cancel_is_a_no_op")


@publisher_cases
async def test_rule_3_7_cancel_is_idempotent(case: PublisherCase) -> None:
    await _publisher_rule(case, "rule_3_7_cancel_is_idempotent")


@publisher_cases
async def test_rule_3_8_demand_accumulates_while_not_cancelled(case: PublisherCase) -> None:
    await _publisher_rule(case, "rule_3_8_demand_accumulates_while_not_cancelled")


@publisher_cases
async def test_rule_3_9_non_positive_request_signals_value_error(case: PublisherCase) -> None:
    await _publisher_rule(case, "rule_3_9_non_positive_request_signals_value_error")


@publisher_cases
async def test_rule_3_9_non_positive_request_from_on_next(case: PublisherCase) -> None:
    await _publisher_rule(case, "rule_3_9_non_positive_request_from_on_next")


@publisher_cases
async def test_rule_3_12_cancel_stops_signals(case: PublisherCase) -> None:
    await _publisher_rule(case, "rule_3_12_cancel_stops_signals")


@publisher_cases
async def test_rule_3_13_cancel_drops_the_subscriber(case: PublisherCase) -> None:
    await _publisher_rule(case, "rule_3_13_cancel_drops_the_subscriber")


@publisher_cases
async def test_rule_3_15_and_3_16_cancel_and_request_return_normally(case: PublisherCase) -> None:
    await _publisher_rule(case, "rule_3_15_and_3_16_cancel_and_request_return_normally")


@publisher_cases
async def test_rule_3_17_demand_is_capped_at_unbounded(case: PublisherCase) -> None:
    await _publisher_rule(case, "rule_3_17_demand_is_capped_at_unbounded")


def test_every_rule_has_a_test() -> None:
    rules = {
        name
        for verification in (PublisherVerification, SubscriberVerification, ProcessorVerification)
        for name in dir(verification)
        if name.startswith("rule_")
    }
    tests = {name.removeprefix("test_") for name in globals() if name.startswith("test_rule_")}
    assert rules <= tests, f"rules without a test: {sorted(rules - tests)}"


# --- subscribers (rules 2.x) ---------------------------------------------------------------------------------


async def _subscriber_rule(make, rule: str) -> None:
    try:
        await getattr(SubscriberVerification(make), rule)()
    except RuleNotApplicable as reason:
        pytest.skip(str(reason))


@subscriber_cases
async def test_rule_2_1_requests_before_receiving(make) -> None:
    await _subscriber_rule(make, "rule_2_1_requests_before_receiving")


@subscriber_cases
async def test_rule_2_5_cancels_a_second_subscription(make) -> None:
    await _subscriber_rule(make, "rule_2_5_cancels_a_second_subscription")


@subscriber_cases
async def test_rule_2_8_accepts_elements_after_cancelling(make) -> None:
    await _subscriber_rule(make, "rule_2_8_accepts_elements_after_cancelling")


@subscriber_cases
async def test_rule_2_9_on_complete_without_request(make) -> None:
    await _subscriber_rule(make, "rule_2_9_on_complete_without_request")


@subscriber_cases
async def test_rule_2_10_on_error_without_request(make) -> None:
    await _subscriber_rule(make, "rule_2_10_on_error_without_request")


@subscriber_cases
async def test_rule_2_13_none_signals_raise_type_error(make) -> None:
    await _subscriber_rule(make, "rule_2_13_none_signals_raise_type_error")


# --- processors (rules 4.x) ----------------------------------------------------------------------------------


def _processor(name: str) -> ProcessorVerification:
    return ProcessorVerification(PROCESSORS[name], recovers=name in RECOVERING)


@processor_cases
async def test_rule_4_1_obeys_the_publisher_rules(name: str) -> None:
    await _processor(name).rule_4_1_obeys_the_publisher_rules()


@processor_cases
async def test_rule_4_1_obeys_the_subscriber_rules(name: str) -> None:
    await _processor(name).rule_4_1_obeys_the_subscriber_rules()


@processor_cases
async def test_rule_4_2_propagates_or_recovers_on_error(name: str) -> None:
    await _processor(name).rule_4_2_propagates_or_recovers_on_error()


# --- the helper itself ---------------------------------------------------------------------------------------


async def test_verify_publisher_runs_every_rule_on_a_shipped_publisher() -> None:
    case = PUBLISHERS[0]
    skipped = await verify_publisher(case.make, make_failed_publisher=case.failed)
    assert skipped == []


async def test_verify_processor_runs_every_rule_on_a_shipped_processor() -> None:
    assert await verify_processor(PROCESSORS["mixed_chain"]) == []
