"""Calling external systems from route steps (SOAP via zeep)."""

from openroute.outbound.soap import SoapFaultError, SoapService, SoapTransportError

__all__ = ["SoapFaultError", "SoapService", "SoapTransportError"]
