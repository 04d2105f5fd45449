"""The channel-fed routes and the outcome events of an application on a :class:`RouteTestKit`'s engine.

``openroute run`` wires them from the ``openroute.messaging...`` keys of its configuration; a test (or the demo)
wires them here, on the kit's engine, store and clock, usually over the in-memory connector::

    config = {
        "openroute.messaging.incoming.crm-in.connector": "in-memory",
        "openroute.messaging.incoming.crm-in.source-system": "CRM",
        "openroute.messaging.outgoing.crm-events.connector": "in-memory",
        "openroute.messaging.outgoing.crm-events.outcome-events": "final",
    }
    async with KitChannels(kit, application, config) as channels:
        await channels.send("crm-in", json.dumps({"customer": {"id": "C1"}}), message_id="m-1")  # acked after commit
        await kit.settle()
        await channels.publish_outcomes()
        [event] = channels.published("crm-events")
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import TracebackType
from typing import TYPE_CHECKING, Self

if TYPE_CHECKING:
    from openroute.dsl import Application
    from openroute.testing._kit import RouteTestKit


class KitChannels:
    """The consumers of ``application``'s channel-fed routes and its outcome-event publisher, started on ``kit``'s
    engine for the ``async with`` block (``config``: the ``openroute.messaging...`` keys, as in ``openroute.toml``).
    """

    def __init__(self, kit: RouteTestKit, application: Application, config: Mapping[str, str]) -> None:
        from openroute.engine.outbox import OutboxPublisher, outcome_rules
        from openroute.inbound.channel import ChannelInbound

        self._kit = kit
        self.inbound = ChannelInbound(kit.engine, application.channels, dict(config), environ={})
        self.outbox = OutboxPublisher(kit.store, outcome_rules(config), dict(config), node_id=kit.engine.node_id,
                                      clock=kit.clock, environ={})
        self._writer = self.outbox.writer()
        self._unhook: Callable[[], None] = lambda: None

    async def __aenter__(self) -> Self:
        # the outcome events are written in the final state's transaction, as create_app wires them for a server
        self._unhook = self._kit.engine.on_final_state_in_transaction(self._writer)
        await self.inbound.start()
        await self.outbox.start()
        return self

    async def __aexit__(self, kind: type[BaseException] | None, error: BaseException | None,
                        trace: TracebackType | None) -> None:
        self._unhook()
        await self.outbox.stop()
        await self.inbound.stop()

    async def send(self, channel: str, payload: str, *, message_id: str, content_type: str = "application/json",
                   connector: str = "in-memory") -> None:
        """Put ``payload`` on the incoming ``channel`` of ``connector`` as a broker would deliver it (with its
        ``message_id`` and ``content_type``); the route's consumer stores it and acks it after the commit."""
        from openroute.inbound.channel import ChannelDelivery
        from openroute.messaging import Message

        delivery = ChannelDelivery(message_id=message_id, content_type=content_type)
        await self.inbound.app.connector(connector).source(channel).send(Message(payload, (delivery,)))

    async def publish_outcomes(self) -> None:
        """Publish the outcome events written so far (a server's publisher does it on its own schedule)."""
        await self.outbox.publish_once()

    def published(self, channel: str, connector: str = "in-memory") -> list[str]:
        """The payloads published to the outgoing ``channel`` of ``connector`` (an in-memory sink), oldest first."""
        return list(self.outbox.app.connector(connector).sink(channel).payloads)
