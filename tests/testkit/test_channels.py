"""KitChannels: a channel-fed route and the outcome events of its final states on a route test kit's engine."""

from __future__ import annotations

import json

from openroute import Application, route
from openroute.testing import KitChannels, RouteTestKit

CONFIG = {
    "openroute.messaging.incoming.crm-in.connector": "in-memory",
    "openroute.messaging.incoming.crm-in.source-system": "CRM",
    "openroute.messaging.outgoing.crm-events.connector": "in-memory",
    "openroute.messaging.outgoing.crm-events.outcome-events": "final",
}


async def test_a_delivery_is_stored_processed_and_its_outcome_event_published() -> None:
    application = Application(route("crm", "setCustomer").from_channel("crm-in").object_id(json="$.customer.id")
                              .process(lambda exchange: None))
    async with RouteTestKit(application) as kit, KitChannels(kit, application, CONFIG) as channels:
        await channels.send("crm-in", json.dumps({"customer": {"id": "C1"}}), message_id="m-1")
        await kit.settle()
        assert channels.published("crm-events") == []  # written in the final transaction, not yet published
        await channels.publish_outcomes()
        [event] = [json.loads(payload) for payload in channels.published("crm-events")]
        assert (event["state"], event["correlationId"], event["service"]) == ("OK", "m-1", "crm")
        assert kit.count_by_state() == {"OK": 1}
