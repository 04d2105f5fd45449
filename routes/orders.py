"""The order reference routes: ``shop / createOrder`` splits an order into one child message per line
(``shop / createOrderLine``); the order ends OK when every line is OK and FAILED as soon as one line fails."""

from __future__ import annotations

import json
from datetime import timedelta

from openroute_reference.payloads import fields

from openroute import BusinessError, ChildMessage, Exchange, ParsedPayload, RouteBuilder, ValidationError, route

NAMESPACE = "http://openroute.dev/shop"
NS = {"s": NAMESPACE}
RETRY = {"max_attempts": 5, "interval": timedelta(seconds=30), "backoff": 2.0}


def _has_lines(payload: ParsedPayload) -> None:
    if payload.content_type == "xml":
        assert payload.xml is not None  # noqa: S101  narrows an Optional for mypy: set before this point
        count = len(payload.xml.findall(f"{{{NAMESPACE}}}line"))
    else:
        lines = payload.json.get("lines")
        count = len(lines) if isinstance(lines, list) else 0
    if count == 0 or count > 500:
        raise ValidationError(f"an order needs 1-500 lines, got {count}")


def _lines(exchange: Exchange) -> list[ChildMessage]:
    data = fields(exchange.payload)
    order = str(data["orderId"])
    return [
        ChildMessage(payload=json.dumps({"orderId": order, **line}), operation="createOrderLine",
                     content_type="application/json", object_id=f"{order}/{index}", key=str(index))
        for index, line in enumerate(data["lines"] if isinstance(data["lines"], list) else [], start=1)
    ]


def _reserve(exchange: Exchange) -> None:
    line = fields(exchange.payload)
    try:
        quantity = int(line.get("quantity", 0))
    except (TypeError, ValueError):
        quantity = 0
    if quantity <= 0:
        raise BusinessError("INVALID_QUANTITY", f"line {line.get('sku')!r} has quantity {line.get('quantity')!r}")
    exchange.custom_data["reserved"] = {"sku": line.get("sku"), "quantity": quantity}


def order_routes() -> list[RouteBuilder]:
    """The order route and its line route."""
    order = (
        route("shop", "createOrder")
        .soap(f"{{{NAMESPACE}}}createOrderRequest", namespaces=NS)
        .json()
        .require("s:orderId", json="$.orderId")
        .validate(_has_lines)
        .object_id("s:orderId", json="$.orderId")
        .retry(**RETRY)
        .split(_lines, into="createOrderLine")
    )
    line = route("shop", "createOrderLine").json().retry(**RETRY).process(_reserve, name="reserve-stock")
    return [order, line]
