"""The security headers of every response of a node: no framing, no content sniffing, a strict content policy.

``SecurityHeaders`` is plain ASGI middleware around the whole application: every response gets
``X-Frame-Options: DENY`` and ``X-Content-Type-Options: nosniff``, and a ``Content-Security-Policy`` that allows
the page's own scripts, styles, images and forms only (no inline script or style, no framing: ``frame-ancestors
'none'``). The console keeps to it: its script and styles are static files. A header the application set itself is
kept::

    app = SecurityHeaders(starlette_app)
"""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = ["CONTENT_SECURITY_POLICY", "RAW_SECURITY_HEADERS", "SECURITY_HEADERS", "SecurityHeaders"]

#: the content policy of every response (the console's pages load only their own static files)
CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
    "form-action 'self'; base-uri 'none'; frame-ancestors 'none'"
)
SECURITY_HEADERS = {
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "Referrer-Policy": "same-origin",
}

#: :data:`SECURITY_HEADERS` as ASGI raw headers (names in lower case), in their order
RAW_SECURITY_HEADERS = tuple((name.lower().encode("latin-1"), value.encode("latin-1"))
                             for name, value in SECURITY_HEADERS.items())


class SecurityHeaders:
    """ASGI middleware adding :data:`SECURITY_HEADERS` to every HTTP response of ``app``."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Add the security headers to the start of every HTTP response; other scopes pass through."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                raw = list(message.get("headers", ()))
                present = {bytes(name).lower() for name, _ in raw}
                raw.extend(item for item in RAW_SECURITY_HEADERS if item[0] not in present)
                message["headers"] = raw
            await send(message)

        await self.app(scope, receive, send_with_headers)
