"""The cross-site request check of every state-changing admin and console request.

A page of another site can make an operator's browser send a POST with the browser's cached Basic credentials, but
only a "simple" one (a form's or ``text/plain`` body) and always with the page's ``Origin``. So an action is done
only when the request:

* names its origin as this node's own (the ``Host`` it was sent to) or one listed in ``[admin] allowed_origins``,
  when it names one at all (tools like curl send none; ``Origin: null`` is refused), and
* for the admin API, sends ``Content-Type: application/json`` (a browser asks the server first, CORS, before
  sending that cross-site, and this node never allows it); the console's forms carry their CSRF token instead.

Refusals change nothing: 403 ``CROSS_SITE`` for a foreign origin, 415 ``UNSUPPORTED_MEDIA_TYPE`` for another body
type::

    from openroute.auth.cross_site import check_origin, require_json

    check_origin(request.headers, allowed=frozenset({"https://ops.example"}))
    require_json(request.headers)
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from openroute.auth.errors import ForbiddenError, UnsupportedMediaTypeError
from openroute.definitions.errors import ConfigurationError

__all__ = ["CrossSiteError", "check_origin", "normalize_origins", "require_json"]

_DEFAULT_PORTS = {"http": "80", "https": "443"}


class CrossSiteError(ForbiddenError):
    """A state-changing request sent by a page of another site (its ``Origin``); nothing was done (HTTP 403)."""

    code = "CROSS_SITE"


def _origin(value: str) -> str | None:
    """``scheme://host[:port]`` in lower case, the default port left out; None when ``value`` is no origin."""
    scheme, sep, rest = value.strip().partition("://")
    scheme = scheme.lower()
    if not sep or scheme not in _DEFAULT_PORTS or not rest or "/" in rest or "@" in rest:
        return None
    host, colon, port = rest.lower().rpartition(":")
    if not colon or "]" in port:  # no port (an IPv6 address ends with "]")
        host, port = rest.lower(), _DEFAULT_PORTS[scheme]
    if not host or not port.isdigit():
        return None
    return f"{scheme}://{host}" + ("" if port == _DEFAULT_PORTS[scheme] else f":{port}")


def normalize_origins(origins: Iterable[str]) -> frozenset[str]:
    """The origins ``scheme://host[:port]`` of the configuration, normalized; ConfigurationError for anything else."""
    normalized = set()
    for value in origins:
        origin = _origin(value) if isinstance(value, str) else None
        if origin is None:
            raise ConfigurationError(f"allowed_origins: {value!r} is not an origin like https://ops.example:8443")
        normalized.add(origin)
    return frozenset(normalized)


def check_origin(headers: Mapping[str, str], allowed: frozenset[str] = frozenset()) -> None:
    """Raises :class:`CrossSiteError` when ``headers`` carry an ``Origin`` that is neither the node's own (the
    request's ``Host``, either scheme) nor in ``allowed`` (from :func:`normalize_origins`); None otherwise."""
    sent = headers.get("origin")
    if sent is None:
        return
    origin = _origin(sent)
    if origin is not None:
        if origin in allowed:
            return
        host = (headers.get("host") or "").strip().lower()
        own = {f"{scheme}://{host}" for scheme in _DEFAULT_PORTS} if host else set()
        own |= {_origin(o) or "" for o in own}
        if origin in own:
            return
    raise CrossSiteError(f"a request from another site (Origin {sent[:100]!r}) is refused; nothing was done "
                         "(list the site in [admin] allowed_origins if it is yours)")


def require_json(headers: Mapping[str, str]) -> None:
    """Raises UnsupportedMediaTypeError (HTTP 415) unless the request's ``Content-Type`` is ``application/json``."""
    media = (headers.get("content-type") or "").partition(";")[0].strip().lower()
    if media != "application/json":
        raise UnsupportedMediaTypeError(
            f"an admin action needs Content-Type: application/json (a JSON body, {{}} when it has nothing to say), "
            f"got {media[:60]!r}; nothing was done")
