"""The MVNO reference routes: a customer is set up in billing, then on the mobile network (two external systems).

``crm / changeTariff`` shows the guaranteed-order funnel: changes of one customer are applied in receive order.

``crm / setCustomer`` and ``crm / createCustomerExtAll`` share the entity type ``customer``: a message made
obsolete by a newer OK message for the same customer (whichever of the two operations) ends SKIPPED. Each external
call succeeds at most once per message: when billing succeeded and the MNO failed (PARTLY_FAILED), the next attempt
only calls the MNO. Every call hands its idempotency key to the system (a WS-Addressing ``MessageID``, the same on
every attempt), so a call repeated after a crash (in doubt: made, outcome never recorded) has no second effect at a
system that honours the key, as the fakes do. A SOAP Fault of either system is a business error (FAILED, reported
in the confirmation); a transport error is technical (retried per the route's retry policy).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from openroute_reference.payloads import Customer, TariffChange

from openroute import Exchange, RouteBuilder, route
from openroute.outbound import SoapService

NAMESPACE = "http://openroute.dev/mvno"
NS = {"m": NAMESPACE}
RETRY = {"max_attempts": 5, "interval": timedelta(seconds=30), "backoff": 2.0, "max_interval": timedelta(minutes=10)}


def customer_route(operation: str, billing: SoapService, mno: SoapService) -> RouteBuilder:
    """The route of one customer operation (both operations share everything but the name)."""

    async def create_account(exchange: Exchange, idempotency_key: str) -> Any:
        customer = exchange.body_as(Customer)
        return await billing.call("createAccount", customerId=customer.customerId, tariff=customer.tariff,
                                  _idempotency_key=idempotency_key)

    async def activate_sim(exchange: Exchange, idempotency_key: str) -> Any:
        customer = exchange.body_as(Customer)
        return await mno.call("activateSim", customerId=customer.customerId, msisdn=customer.msisdn,
                              _idempotency_key=idempotency_key)

    def remember(exchange: Exchange) -> None:
        calls = exchange.metadata.get("ext_calls", {})
        exchange.custom_data.update({"accountId": calls.get("billing"), "activationId": calls.get("mno")})

    return (
        route("crm", operation)
        .soap(f"{{{NAMESPACE}}}{operation}Request", namespaces=NS)
        .json()
        .body(Customer)
        .object_id("m:customerId", json="$.customerId")
        .entity_type("customer")
        .obsolete_check()
        .retry(**RETRY)
        .ext_call("billing", create_account, system="BILLING")
        .ext_call("mno", activate_sim, system="MNO")
        .process(remember, name="remember-ids")
    )


def change_tariff_route(billing: SoapService) -> RouteBuilder:
    """``crm / changeTariff``: tariff changes of one customer are applied strictly in the order received (a
    guaranteed-order funnel on the customer id: a newer change waits POSTPONED until the older one is final)."""

    async def change(exchange: Exchange, idempotency_key: str) -> Any:
        wanted = exchange.body_as(TariffChange)
        return await billing.call("createAccount", customerId=wanted.customerId, tariff=wanted.tariff,
                                  _idempotency_key=idempotency_key)

    return (
        route("crm", "changeTariff")
        .soap(f"{{{NAMESPACE}}}changeTariffRequest", namespaces=NS)
        .json()
        .body(TariffChange)
        .object_id("m:customerId", json="$.customerId")
        .funnel("m:customerId", json="$.customerId", guaranteed_order=True)
        .retry(**RETRY)
        .ext_call("billing", change, system="BILLING")
    )
