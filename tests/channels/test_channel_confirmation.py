"""Confirmations over a channel: ``[confirmations.systems.X] channel = "..."`` publishes the outcome to a queue,
with a stable confirmation id; a refused publish is a ConfirmationSendError (retried by the service)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from openroute.confirmation import ChannelConfirmation, ConfirmationRequest, ConfirmationSendError

from openroute.config import load_config
from openroute.definitions.errors import ConfigurationError
from openroute.messaging.amqp import AmqpOutgoingMetadata
from openroute.messaging.publisher import ChannelPublisher
from tests.channels.amqp_helpers import delete, take_all, unique

REQUEST = ConfirmationRequest(message_id=7, correlation_id="c-7", source_system="CRM", service="crm",
                              operation="setCustomer", state="OK", finished_at=datetime(2026, 1, 1, tzinfo=UTC))


async def test_a_confirmation_is_published_to_the_channel_with_a_stable_id() -> None:
    confirmation = ChannelConfirmation("CRM", "crm-confirmations", ChannelPublisher(
        {"openroute.messaging.outgoing.crm-confirmations.connector": "in-memory"}, ["crm-confirmations"], environ={}))
    await confirmation.confirm(REQUEST)
    await confirmation.confirm(REQUEST)  # sent again (the service retries after a lost answer): the same id
    assert confirmation.app is not None
    [first, second] = confirmation.app.connector("in-memory").sink("crm-confirmations").received
    assert json.loads(first.payload)["correlationId"] == "c-7" and json.loads(first.payload)["state"] == "OK"
    assert first.get_metadata(AmqpOutgoingMetadata).message_id == second.get_metadata(AmqpOutgoingMetadata).message_id
    await confirmation.aclose()


@pytest.mark.rabbitmq
async def test_over_rabbitmq_a_refused_publish_raises_and_a_routed_one_arrives(rabbitmq_url: str) -> None:
    queue = unique("confirm")
    unroutable = ChannelConfirmation("CRM", "confirm", ChannelPublisher({
        "openroute.messaging.outgoing.confirm.connector": "amqp",
        "openroute.messaging.outgoing.confirm.url": rabbitmq_url,
        "openroute.messaging.outgoing.confirm.exchange": "amq.direct",
        "openroute.messaging.outgoing.confirm.declare": False,
        "openroute.messaging.outgoing.confirm.routing-key": unique("nobody"),
    }, ["confirm"], environ={}))
    with pytest.raises(ConfirmationSendError, match="channel confirm"):
        await unroutable.confirm(REQUEST)
    await unroutable.aclose()
    routed = ChannelConfirmation("CRM", "confirm", ChannelPublisher({
        "openroute.messaging.outgoing.confirm.connector": "amqp",
        "openroute.messaging.outgoing.confirm.url": rabbitmq_url,
        "openroute.messaging.outgoing.confirm.queue": queue,
    }, ["confirm"], environ={}))
    try:
        await routed.confirm(REQUEST)
        [received] = await take_all(rabbitmq_url, queue)
        assert json.loads(received.body)["messageId"] == 7 and received.message_id.startswith("7:")
    finally:
        await routed.aclose()
        await delete(rabbitmq_url, queue)


async def test_the_configuration_takes_a_channel_target(tmp_path: Path) -> None:
    path = tmp_path / "openroute.toml"
    path.write_text('[confirmations.systems.CRM]\nchannel = "crm-confirmations"\n'
                    '[openroute.messaging.outgoing.crm-confirmations]\nconnector = "in-memory"\n')
    config: Any = load_config(path)
    callback = config.confirmations.callback(config.messaging_config())
    await callback.confirm(REQUEST)
    transport = callback._by_system["CRM"]
    assert isinstance(transport, ChannelConfirmation)
    assert len(transport.app.connector("in-memory").sink("crm-confirmations").received) == 1
    await callback.aclose()
    path.write_text('[confirmations.systems.CRM]\nchannel = "c"\nhttp = "http://crm.example/confirm"\n')
    with pytest.raises(ConfigurationError, match="exactly one of soap = url, http = url or channel = name"):
        load_config(path)
