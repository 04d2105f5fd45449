"""The order reference routes: ``shop / createOrder`` splits an order into one child message per line
(``shop / createOrderLine``); the order ends OK when every line is OK and FAILED as soon as one line fails."""

from __future__ import annotations

import json
from datetime import timedelta

from openroute_reference.payloads import Order, OrderLine

from openroute import BusinessError, ChildMessage, Exchange, RouteBuilder, route

NAMESPACE = "http://openroute.dev/shop"
NS = {"s": NAMESPACE}
RETRY = {"max_attempts": 5, "interval": timedelta(seconds=30), "backoff": 2.0}


def _lines(exchange: Exchange) -> list[ChildMessage]:
    order = exchange.body_as(Order)
    return [
        ChildMessage(payload=json.dumps({"orderId": order.orderId, **line.model_dump()}), operation="createOrderLine",
                     content_type="application/json", object_id=f"{order.orderId}/{index}", key=str(index))
        for index, line in enumerate(order.lines, start=1)
    ]


def _reserve(exchange: Exchange) -> None:
    line = exchange.body_as(OrderLine)
    if line.quantity <= 0:
        raise BusinessError("INVALID_QUANTITY", f"line {line.sku!r} has quantity {line.quantity!r}")
    exchange.custom_data["reserved"] = {"sku": line.sku, "quantity": line.quantity}


def order_routes() -> list[RouteBuilder]:
    """The order route and its line route."""
    order = (
        route("shop", "createOrder")
        .soap(f"{{{NAMESPACE}}}createOrderRequest", namespaces=NS)
        .json()
        .body(Order)
        .object_id("s:orderId", json="$.orderId")
        .retry(**RETRY)
        .split(_lines, into="createOrderLine")
    )
    line = (route("shop", "createOrderLine").json().body(OrderLine).retry(**RETRY)
            .process(_reserve, name="reserve-stock"))
    return [order, line]
