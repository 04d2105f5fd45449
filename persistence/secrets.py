"""Masking of credentials in database URLs and in any text that may carry one, before it is printed or logged.

Every place that shows a URL or DSN (the CLI's errors, ``openroute run``'s start-up lines, ``openroute db``, the
log, the admin API, the Spark commands, their plans and reports, the console) goes through these two functions::

    from openroute.persistence import masked_url, mask_secrets

    masked_url("postgresql+psycopg://ops:s3cret@db/openroute")   # 'postgresql+psycopg://ops:***@db/openroute'
    mask_secrets("cannot connect to postgresql://ops:s3cret@db/x")  # 'cannot connect to postgresql://ops:***@db/x'
"""

from __future__ import annotations

import re
from typing import Any

__all__ = ["MASK", "mask_secrets", "masked_url"]

#: what a password is replaced with
MASK = "***"

# user:password@ after a scheme (any URL: database, JDBC, HTTP), and libpq / JDBC key=value passwords
_URL_PASSWORD = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.\-]*://[^:/@\s'\"]*):(?P<secret>[^@\s'\"]*)@")
_KEY_PASSWORD = re.compile(r"(?P<head>\b(?:password|passwd|pwd)\s*[=:]\s*)(?P<secret>'[^']*'|\"[^\"]*\"|[^\s&;,'\")]+)",
                           re.IGNORECASE)
_BARE_PASSWORD = re.compile(r":[^:@/\s]+@")


def masked_url(url: Any) -> str:
    """``url`` (a string or SQLAlchemy ``URL``) as text with its password replaced by ``***``
    (SQLAlchemy's ``render_as_string(hide_password=True)``); text that is no URL is masked by :func:`mask_secrets`.
    Never raises."""
    from sqlalchemy.engine import URL, make_url

    try:
        parsed = url if isinstance(url, URL) else make_url(str(url))
        return parsed.render_as_string(hide_password=True)
    except Exception:  # not a SQLAlchemy URL: mask what looks like a credential in it, "user:password@" too
        return _BARE_PASSWORD.sub(f":{MASK}@", mask_secrets(str(url)))


def mask_secrets(text: str) -> str:
    """``text`` with every ``scheme://user:password@`` and ``password=...`` value replaced by ``***``. Never raises."""
    masked = _URL_PASSWORD.sub(lambda m: f"{m['head']}:{MASK}@", str(text))
    return _KEY_PASSWORD.sub(lambda m: f"{m['head']}{MASK}", masked)
