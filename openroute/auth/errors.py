"""The refusals of the HTTP faces (inbound endpoints, admin API, console), each with the HTTP status and error code
it is answered with (:func:`status_and_code`).

Payload problems derive from :class:`openroute.definitions.errors.ValidationError` (nothing is stored, HTTP 400 / SOAP
Fault); authentication problems are rejected before the body is read. One catalogue for every face: the admin
API reads an action's JSON body within the same limits as the inbound, and the console lists these codes.
"""

from __future__ import annotations

from openroute.definitions.errors import (
    NodeNotAcceptingError,
    OpenrouteError,
    PayloadTooLargeError,
    StoreUnavailableError,
    ThrottledError,
    UnknownRouteError,
    ValidationError,
)


class MalformedPayloadError(ValidationError):
    """The body is not well-formed XML / JSON, or not the shape the endpoint expects (e.g. no SOAP Body)."""

    code = "MALFORMED_PAYLOAD"


class ForbiddenXmlError(MalformedPayloadError):
    """The XML carries a DOCTYPE / DTD or entity declarations (XXE, billion laughs): refused outright."""

    code = "FORBIDDEN_XML"


class NestingTooDeepError(MalformedPayloadError):
    """The XML or JSON document nests deeper than the configured limit."""

    code = "NESTING_TOO_DEEP"

    def __init__(self, limit: int) -> None:
        super().__init__(f"the document nests deeper than the limit of {limit} levels")
        self.limit = limit


class InvalidCharacterError(MalformedPayloadError):
    """A JSON string holds a character no database column stores: NUL (``\\u0000``) or a lone UTF-16 surrogate
    (``\\ud800``)."""

    code = "INVALID_CHARACTER"


class NumberTooLongError(MalformedPayloadError):
    """A JSON number has more digits than Python converts (``sys.get_int_max_str_digits()``, 4300 by default)."""

    code = "NUMBER_TOO_LONG"


class SoapVersionMismatchError(MalformedPayloadError):
    """The envelope's namespace does not match the SOAP version announced by the content type."""

    code = "VERSION_MISMATCH"


class UnsupportedMediaTypeError(ValidationError):
    """The request's Content-Type is not one the endpoint accepts (HTTP 415)."""

    code = "UNSUPPORTED_MEDIA_TYPE"


class BodyTooLargeError(PayloadTooLargeError):
    """The request body exceeds ``InboundSettings.max_body_bytes`` (HTTP 413); it was not read to the end."""

    code = "PAYLOAD_TOO_LARGE"

    def __init__(self, limit: int, size: int | None = None) -> None:
        ValidationError.__init__(
            self,
            f"request body exceeds the limit of {limit} bytes"
            + (f" (Content-Length {size})" if size is not None else ""),
        )
        self.size = size if size is not None else limit + 1
        self.limit = limit


class UnknownOperationError(UnknownRouteError):
    """No inbound binding of the service matches the request (body element, SOAPAction, URL)."""

    code = "UNKNOWN_OPERATION"


class AuthenticationError(OpenrouteError):
    """No or wrong credentials (HTTP 401). The message never says which part was wrong."""

    code = "UNAUTHENTICATED"


class ForbiddenError(OpenrouteError):
    """Authenticated, but not allowed: a source system sending as another one, or a user without the role (403)."""

    code = "FORBIDDEN"


class TooManyFailedLoginsError(OpenrouteError):
    """Too many failed logins of this user from this address, or from this address (HTTP 429, ``Retry-After``);
    the credentials were not checked."""

    code = "TOO_MANY_FAILED_LOGINS"

    def __init__(self, retry_after: int, reason: str = "too many failed logins") -> None:
        super().__init__(f"{reason}: try again in {retry_after} s")
        #: seconds until the oldest counted failure leaves the window
        self.retry_after = retry_after


#: the code of a request whose client went away (or was cut off by the request deadline) before its body was read
CLIENT_DISCONNECTED = "CLIENT_DISCONNECTED"


def status_and_code(error: BaseException) -> tuple[int, str]:
    """The HTTP status and error code an inbound or admin endpoint answers ``error`` with."""
    from starlette.requests import ClientDisconnect

    if isinstance(error, ClientDisconnect):  # nobody is left to read the answer
        return 400, CLIENT_DISCONNECTED
    if isinstance(error, AuthenticationError):
        return 401, error.code
    if isinstance(error, ForbiddenError):
        return 403, error.code
    if isinstance(error, TooManyFailedLoginsError):
        return 429, error.code
    if isinstance(error, UnknownRouteError):
        return 404, getattr(error, "code", "UNKNOWN_OPERATION")
    if isinstance(error, PayloadTooLargeError):
        return 413, "PAYLOAD_TOO_LARGE"
    if isinstance(error, UnsupportedMediaTypeError):
        return 415, error.code
    if isinstance(error, ValidationError):
        return 400, getattr(error, "code", "VALIDATION_ERROR")
    if isinstance(error, NodeNotAcceptingError | StoreUnavailableError):
        return 503, error.code
    if isinstance(error, ThrottledError):
        return 429, error.code
    return 500, "INTERNAL_ERROR"
