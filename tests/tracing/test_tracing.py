"""openroute/runtime/tracing.py: one trace per message from accept to confirmation, across retries, nodes and restarts,
with the sender's W3C traceparent as its root and the outbound requests carrying it on (SDK in-memory exporter)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from openroute.persistence import MessageState, MessageStore
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from openroute.definitions.clock import ManualClock
from tests.tracing.conftest import (
    SENDER_SPAN,
    SENDER_TRACE,
    SENDER_TRACEPARENT,
    Node,
    Remote,
    hex_ids,
    start_node,
    stored_form,
    traceparent_parts,
)

HEADERS = {"X-Source-System": "CRM", "Content-Type": "application/json"}


async def post(node: Node, correlation_id: str, traceparent: str | None = None) -> int:
    """POST one JSON order (with ``traceparent`` when given); the stored message id."""
    headers = {**HEADERS, "X-Correlation-Id": correlation_id}
    if traceparent is not None:
        headers["traceparent"] = traceparent
    answer = await node.http.post("/api/crm/order", json={"orderId": correlation_id}, headers=headers)
    assert answer.status_code == 202, answer.text
    return int(answer.json()["messageId"])


async def traced_order(node: Node, store: MessageStore, correlation_id: str, state: MessageState) -> int:
    """POST one order with the sender's traceparent and wait until the node is idle; its id (found in ``state``)."""
    message_id = await post(node, correlation_id, SENDER_TRACEPARENT)
    await node.engine.wait_idle(10)
    row = store.get(message_id)
    assert row is not None and row.state is state
    return message_id


def named(spans: InMemorySpanExporter, prefix: str) -> list[ReadableSpan]:
    """The finished spans whose name starts with ``prefix``, in the order they started."""
    return sorted((s for s in spans.get_finished_spans() if s.name.startswith(prefix)), key=lambda s: s.start_time or 0)


async def test_a_json_request_with_a_traceparent_is_one_trace_from_accept_to_confirmation(
    node: Node, spans: InMemorySpanExporter, remote: Remote, store: MessageStore
) -> None:
    message_id = await traced_order(node, store, "o-1", MessageState.OK)
    row = store.get(message_id)
    assert row is not None
    [accept] = named(spans, "accept ")
    [attempt] = named(spans, "attempt ")
    [step] = named(spans, "step ")
    [call] = named(spans, "call ")
    [confirm] = named(spans, "confirm ")
    trace_id, accept_id, accept_parent = hex_ids(accept)
    assert trace_id == SENDER_TRACE and accept_parent == SENDER_SPAN  # the sender's span is the root's parent
    assert row.traceparent == stored_form(accept) == f"00-{trace_id}-{accept_id}-01"  # stored: the accepting span
    _, attempt_id, attempt_parent = hex_ids(attempt)
    _, step_id, step_parent = hex_ids(step)
    _, call_id, call_parent = hex_ids(call)
    _, confirm_id, confirm_parent = hex_ids(confirm)
    assert {hex_ids(s)[0] for s in (attempt, step, call, confirm)} == {SENDER_TRACE}
    assert (attempt_parent, step_parent, call_parent, confirm_parent) == (accept_id, attempt_id, step_id, accept_id)
    assert accept.name == "accept crm/order" and accept.kind is SpanKind.SERVER
    assert accept.attributes is not None and accept.attributes["openroute.message_id"] == message_id
    assert accept.attributes["openroute.endpoint"] == "json" and accept.attributes["openroute.duplicate"] is False
    assert attempt.attributes is not None and attempt.attributes["openroute.attempt"] == 1
    assert attempt.attributes["openroute.outcome"] == "OK" and attempt.attributes["openroute.node_id"] == "node-a"
    assert step.name == "step charge" and call.name == "call BILLING" and call.kind is SpanKind.CLIENT
    assert call.attributes is not None and call.attributes["openroute.call.key"] == "charge"
    assert confirm.name == "confirm CRM" and confirm.attributes is not None
    assert confirm.attributes["openroute.state"] == "OK"
    # the outbound requests carry the trace on, each naming the span that made it (asserted at the real server)
    [charged] = remote.headers_of("/charges")
    [confirmed] = remote.headers_of("/confirm")
    assert traceparent_parts(charged["traceparent"]) == (SENDER_TRACE, call_id)
    assert traceparent_parts(confirmed["traceparent"]) == (SENDER_TRACE, confirm_id)


async def test_an_attempt_after_partly_failed_is_in_the_same_trace(
    node: Node, spans: InMemorySpanExporter, remote: Remote, store: MessageStore, clock: ManualClock
) -> None:
    remote.failures = 1
    message_id = await traced_order(node, store, "o-2", MessageState.PARTLY_FAILED)
    clock.advance(timedelta(seconds=5))
    await node.engine.repoll_once()
    await node.engine.wait_idle(10)
    row = store.get(message_id)
    assert row is not None and row.state is MessageState.OK
    [accept] = named(spans, "accept ")
    first, second = named(spans, "attempt ")
    _, accept_id, _ = hex_ids(accept)
    assert [hex_ids(a)[0] for a in (first, second)] == [SENDER_TRACE, SENDER_TRACE]
    assert [hex_ids(a)[2] for a in (first, second)] == [accept_id, accept_id]
    assert first.attributes is not None and second.attributes is not None
    assert (first.attributes["openroute.attempt"], second.attributes["openroute.attempt"]) == (1, 2)
    assert first.attributes["openroute.outcome"] == "PARTLY_FAILED" and first.status.status_code is StatusCode.ERROR
    assert first.attributes["openroute.error_code"] == "HTTP_500"
    assert second.attributes["openroute.outcome"] == "OK"
    calls = named(spans, "call ")
    assert [s.status.status_code for s in calls] == [StatusCode.ERROR, StatusCode.UNSET]
    sent = [traceparent_parts(h["traceparent"]) for h in remote.headers_of("/charges")]
    assert sent == [(SENDER_TRACE, hex_ids(c)[1]) for c in calls]  # each request names its own call span


async def test_a_new_engine_on_the_same_store_continues_the_stored_trace(
    node: Node, spans: InMemorySpanExporter, remote: Remote, store: MessageStore, clock: ManualClock
) -> None:
    remote.failures = 1
    message_id = await traced_order(node, store, "o-3", MessageState.PARTLY_FAILED)
    await node.close()  # node A goes away after the failed attempt
    clock.advance(timedelta(seconds=5))
    other = await start_node(store, remote, clock, "node-b")  # its start picks the due message up
    try:
        await other.engine.wait_idle(10)
    finally:
        await other.close()
    row = store.get(message_id)
    assert row is not None and row.state is MessageState.OK
    [accept] = named(spans, "accept ")
    first, second = named(spans, "attempt ")
    _, accept_id, _ = hex_ids(accept)
    assert hex_ids(second)[0] == SENDER_TRACE and hex_ids(second)[2] == accept_id  # the stored traceparent
    assert first.attributes is not None and second.attributes is not None
    assert (first.attributes["openroute.node_id"], second.attributes["openroute.node_id"]) == ("node-a", "node-b")
    [confirm] = named(spans, "confirm ")
    assert hex_ids(confirm)[0] == SENDER_TRACE and hex_ids(confirm)[2] == accept_id


async def test_without_a_traceparent_accept_starts_a_new_trace(
    node: Node, spans: InMemorySpanExporter, store: MessageStore
) -> None:
    message_id = await post(node, "o-4")
    await node.engine.wait_idle(10)
    [accept] = named(spans, "accept ")
    trace_id, _, parent = hex_ids(accept)
    assert parent is None and trace_id != SENDER_TRACE
    row = store.get(message_id)
    assert row is not None and row.traceparent == stored_form(accept)
    assert {hex_ids(s)[0] for s in spans.get_finished_spans()} == {trace_id}


@pytest.mark.parametrize("malformed", [
    "garbage",
    f"00-{SENDER_TRACE}-{SENDER_SPAN}",  # no flags
    f"00-{'0' * 32}-{SENDER_SPAN}-01",  # all-zero trace id
    f"00-{SENDER_TRACE}-{'0' * 16}-01",  # all-zero parent id
    f"ff-{SENDER_TRACE}-{SENDER_SPAN}-01",  # version ff is forbidden
    f"00-{SENDER_TRACE.upper()}-{SENDER_SPAN}-01",  # upper-case hex
    "00-" + "x" * 200,
])
async def test_a_malformed_traceparent_is_ignored_with_a_new_trace(
    node: Node, spans: InMemorySpanExporter, store: MessageStore, malformed: str
) -> None:
    message_id = await post(node, "o-5", malformed)  # accepted (202): W3C says to ignore an invalid header
    await node.engine.wait_idle(10)
    [accept] = named(spans, "accept ")
    trace_id, _, parent = hex_ids(accept)
    assert parent is None and trace_id != SENDER_TRACE
    row = store.get(message_id)
    assert row is not None and row.state is MessageState.OK and row.traceparent == stored_form(accept)


async def test_a_refused_request_is_a_failed_accept_span_and_stores_nothing(
    node: Node, spans: InMemorySpanExporter, store: MessageStore
) -> None:
    answer = await node.http.post("/api/crm/order", content=b'{"orderId": "o-6"}',
                                  headers={"Content-Type": "application/json", "traceparent": SENDER_TRACEPARENT,
                                           "X-Source-System": "CRM", "X-Correlation-Id": " "})
    assert answer.status_code == 400
    [accept] = named(spans, "accept ")
    assert hex_ids(accept)[0] == SENDER_TRACE and accept.status.status_code is StatusCode.ERROR
    assert store.count_by_state() == {}
