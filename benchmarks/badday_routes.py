"""The routes of ``benchmarks/badday_bench.py``: one HTTP call of the external system REMOTE per message, through the
shipped ``ExternalHttpClient`` (its breaker and bulkhead from ``[external_systems.REMOTE]``), with a funnel on the
message's object (``bench/update``) or without one (``bench/plain``)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from openroute import Application, Exchange, route
from openroute.outbound import ExternalHttpClient

remote = ExternalHttpClient("REMOTE")
RETRY = {"max_attempts": 5, "interval": timedelta(seconds=30), "backoff": 2.0}


async def call_remote(exchange: Exchange) -> Any:
    return await remote.post_json("/call", {"correlationId": exchange.message.correlation_id},
                                  idempotency_key=f"{exchange.message.correlation_id}:update")


application = Application(
    route("bench", "update").json().funnel(json="$.object").retry(**RETRY)
    .ext_call("update", call_remote, system="REMOTE"),
    route("bench", "plain").json().retry(**RETRY).ext_call("update", call_remote, system="REMOTE"),
)
