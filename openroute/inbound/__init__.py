"""Inbound SOAP 1.1/1.2 and JSON HTTP endpoints in front of the engine (accept, then acknowledge)."""

from openroute.binding import Extracted, Extractor, InboundBinding, ParsedPayload, QName, default_bindings
from openroute.inbound.app import (
    CORRELATION_HEADER,
    PROCESS_HEADER,
    SOURCE_SYSTEM_HEADER,
    TIMESTAMP_HEADER,
    InboundEndpoints,
    InboundSettings,
    bindings_for,
)
from openroute.inbound.auth import (
    AdminAuth,
    AdminUser,
    ApiKey,
    BasicCredentials,
    SourceSystemAuth,
    load_auth_config,
)
from openroute.inbound.errors import (
    AuthenticationError,
    BodyTooLargeError,
    ForbiddenError,
    ForbiddenXmlError,
    MalformedPayloadError,
    NestingTooDeepError,
    SoapVersionMismatchError,
    UnknownOperationError,
    UnsupportedMediaTypeError,
)
from openroute.inbound.soap import INBOUND_NS, SOAP11_NS, SOAP12_NS, TRACE_NS

__all__ = [
    "CORRELATION_HEADER",
    "INBOUND_NS",
    "PROCESS_HEADER",
    "SOAP11_NS",
    "SOAP12_NS",
    "SOURCE_SYSTEM_HEADER",
    "TIMESTAMP_HEADER",
    "TRACE_NS",
    "AdminAuth",
    "AdminUser",
    "ApiKey",
    "AuthenticationError",
    "BasicCredentials",
    "BodyTooLargeError",
    "Extracted",
    "Extractor",
    "ForbiddenError",
    "ForbiddenXmlError",
    "InboundBinding",
    "InboundEndpoints",
    "InboundSettings",
    "MalformedPayloadError",
    "NestingTooDeepError",
    "ParsedPayload",
    "QName",
    "SoapVersionMismatchError",
    "SourceSystemAuth",
    "UnknownOperationError",
    "UnsupportedMediaTypeError",
    "bindings_for",
    "default_bindings",
    "load_auth_config",
]
