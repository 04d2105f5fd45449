"""The final-state hook of /metrics (openroute/admin/metrics.py): what it counts per route and state."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from openroute.persistence import MessageState, MessageStore, StoredMessage

from openroute import Route, RouteRegistry
from openroute.admin import Metrics
from openroute.engine import Engine

START = datetime(2024, 3, 1, 12, 0, tzinfo=UTC)


def _final(message_id: int, state: MessageState, *, processed: bool) -> StoredMessage:
    return StoredMessage(
        id=message_id, correlation_id=f"c-{message_id}", source_system="crm", process_id=None, service="orders",
        operation="create", object_id=None, entity_type=None, funnel_value=None, payload="{}",
        content_type="application/json", headers={}, state=state, failed_count=0, receive_ts=START, msg_ts=None,
        start_process_ts=START + timedelta(seconds=1) if processed else None,
        last_update_ts=START + timedelta(seconds=3), next_attempt_at=None, node_id="n1", custom_data={},
        business_errors=[], last_error_code=None, last_error_text=None, parent_id=None, version=2,
    )


async def test_final_messages_are_counted_per_route_and_state_and_only_processed_ones_have_a_processing_time(
    store: MessageStore
) -> None:
    engine = Engine(store, RouteRegistry([Route("orders", "create", [lambda exchange: None])]))
    metrics = Metrics(engine)
    try:
        for message_id in (1, 2):
            await metrics.on_final_state(_final(message_id, MessageState.OK, processed=True))
        await metrics.on_final_state(_final(3, MessageState.CANCEL, processed=False))
        text = metrics.render().decode()
    finally:
        await engine.stop()
    labels = 'operation="create",service="orders"'
    assert f'openroute_final_messages_total{{{labels},state="OK"}} 2.0' in text
    assert f'openroute_final_messages_total{{{labels},state="CANCEL"}} 1.0' in text
    assert f'openroute_message_latency_seconds_sum{{{labels},state="OK"}} 6.0' in text
    assert f'openroute_message_processing_seconds_sum{{{labels},state="OK"}} 4.0' in text
    assert f'openroute_message_processing_seconds_count{{{labels},state="CANCEL"}}' not in text, \
        "a message never processed has no processing time: no empty series"
