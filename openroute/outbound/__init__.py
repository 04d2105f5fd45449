"""Calling external systems from route steps: SOAP via zeep, HTTP via httpx, each system declared once with its
circuit breaker and call records (docs/outage.md).

    from openroute.outbound import ExternalCalls, ExternalHttpClient, ExternalSystem, SoapService

``network_transport()`` is the httpx transport these clients send on (and the HTTP and SOAP confirmations, given it
by the composition root): give it to an ``httpx.AsyncClient`` of your own for the same connection handling.
"""

from openroute.outbound._connections import network_transport
from openroute.outbound.breaker import BreakerSettings, BreakerState
from openroute.outbound.calls import CallContext, ExternalCalls, current_call
from openroute.outbound.http import IDEMPOTENCY_KEY_HEADER, ExternalHttpClient
from openroute.outbound.soap import SoapFaultError, SoapService, SoapTransportError
from openroute.outbound.systems import CallRecordSettings, ExternalSystem
from openroute.persistence.call_records import CallOutcome

__all__ = [
    "IDEMPOTENCY_KEY_HEADER",
    "BreakerSettings",
    "BreakerState",
    "CallContext",
    "CallOutcome",
    "CallRecordSettings",
    "ExternalCalls",
    "ExternalHttpClient",
    "ExternalSystem",
    "SoapFaultError",
    "SoapService",
    "SoapTransportError",
    "current_call",
    "network_transport",
]
