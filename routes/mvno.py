"""The MVNO reference routes: a customer is set up in billing, then on the mobile network (two external systems).

``crm / changeTariff`` shows the guaranteed-order funnel: changes of one customer are applied in receive order.

``crm / setCustomer`` and ``crm / createCustomerExtAll`` share the entity type ``customer``: a message made
obsolete by a newer OK message for the same customer (whichever of the two operations) ends SKIPPED. Each external
call is made once per message: when billing succeeded and the MNO failed (PARTLY_FAILED), the next attempt only
calls the MNO. A SOAP Fault of either system is a business error (FAILED, reported in the confirmation); a
transport error is technical (retried per the route's retry policy).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from openroute_reference.payloads import fields

from openroute import Exchange, ParsedPayload, RouteBuilder, ValidationError, route
from openroute.outbound import SoapService

NAMESPACE = "http://openroute.dev/mvno"
NS = {"m": NAMESPACE}
RETRY = {"max_attempts": 5, "interval": timedelta(seconds=30), "backoff": 2.0, "max_interval": timedelta(minutes=10)}


def _msisdn_is_valid(payload: ParsedPayload) -> None:
    if payload.content_type == "xml":
        assert payload.xml is not None
        value = payload.xml.findtext(f"{{{NAMESPACE}}}msisdn") or ""
    else:
        value = str(payload.json.get("msisdn", ""))
    if not (value.isdigit() and 8 <= len(value) <= 15):
        raise ValidationError(f"msisdn must be 8-15 digits, got {value!r}")


def customer_route(operation: str, billing: SoapService, mno: SoapService) -> RouteBuilder:
    """The route of one customer operation (both operations share everything but the name)."""

    async def create_account(exchange: Exchange) -> Any:
        data = fields(exchange.payload)
        return await billing.call("createAccount", customerId=data["customerId"], tariff=data.get("tariff", "basic"))

    async def activate_sim(exchange: Exchange) -> Any:
        data = fields(exchange.payload)
        return await mno.call("activateSim", customerId=data["customerId"], msisdn=data["msisdn"])

    def remember(exchange: Exchange) -> None:
        calls = exchange.metadata.get("ext_calls", {})
        exchange.custom_data.update({"accountId": calls.get("billing"), "activationId": calls.get("mno")})

    return (
        route("crm", operation)
        .soap(f"{{{NAMESPACE}}}{operation}Request", namespaces=NS)
        .json()
        .require("m:customerId", "m:msisdn", json=["$.customerId", "$.msisdn"])
        .validate(_msisdn_is_valid)
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

    async def change(exchange: Exchange) -> Any:
        data = fields(exchange.payload)
        return await billing.call("createAccount", customerId=data["customerId"], tariff=data["tariff"])

    return (
        route("crm", "changeTariff")
        .soap(f"{{{NAMESPACE}}}changeTariffRequest", namespaces=NS)
        .json()
        .require("m:customerId", "m:tariff", json=["$.customerId", "$.tariff"])
        .object_id("m:customerId", json="$.customerId")
        .funnel("m:customerId", json="$.customerId", guaranteed_order=True)
        .retry(**RETRY)
        .ext_call("billing", change, system="BILLING")
    )
