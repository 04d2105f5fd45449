"""Who may reach a node over HTTP, and how a request is refused: the parts every HTTP face shares.

The inbound endpoints, the admin API and the console authenticate with the same credentials (source systems,
operators and their roles, :mod:`~openroute.auth.credentials`), count failed logins with one limiter
(:mod:`~openroute.auth.login_limit`), check state-changing requests for a cross-site origin
(:mod:`~openroute.auth.cross_site`), send the same security headers (:mod:`~openroute.auth.headers`) and answer a
refusal with one error catalogue (:mod:`~openroute.auth.errors`). It sits one floor below the edges: it imports
the definitions (errors) and third-party libraries only, so no face imports another one for these::

    from openroute.auth import AdminAuth, AdminUser, SecurityHeaders
"""

from openroute.auth.credentials import (
    WEB_ROLE,
    AdminAuth,
    AdminUser,
    ApiKey,
    BasicCredentials,
    SourceSystemAuth,
    load_auth_config,
)
from openroute.auth.cross_site import check_origin, normalize_origins, require_json
from openroute.auth.errors import AuthenticationError, ForbiddenError, TooManyFailedLoginsError, status_and_code
from openroute.auth.headers import SecurityHeaders
from openroute.auth.login_limit import LoginLimiter

__all__ = [
    "WEB_ROLE",
    "AdminAuth",
    "AdminUser",
    "ApiKey",
    "AuthenticationError",
    "BasicCredentials",
    "ForbiddenError",
    "LoginLimiter",
    "SecurityHeaders",
    "SourceSystemAuth",
    "TooManyFailedLoginsError",
    "check_origin",
    "load_auth_config",
    "normalize_origins",
    "require_json",
    "status_and_code",
]
