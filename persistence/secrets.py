"""Masking of secrets in any text that leaves the store for a person or a system: the one masking function.

Every face goes through :func:`mask_secrets` (or :func:`masked_value` for a JSON value, :func:`masked_url` for a URL):
the admin API, the console, the CLI, the log, the call records of external systems, confirmations, outcome events,
alerts and the Spark commands' outputs. The engine stores error texts already masked, so a search by error text
finds only what is shown (texts stored before, or before a name was added, are masked in place by
:mod:`openroute.persistence.stored_texts`: migration 0021, ``openroute db mask-secrets``)::

    from openroute.persistence import masked_url, mask_secrets

    masked_url("postgresql+psycopg://ops:s3cret@db/openroute")   # 'postgresql+psycopg://ops:***@db/openroute'
    mask_secrets("GET https://api.example/v1?apikey=abc123&q=1")  # 'GET https://api.example/v1?apikey=***&q=1'
    mask_secrets('<login><pin>1234</pin></login>', ["pin"])       # '<login><pin>***</pin></login>'

What is masked:

- the password of ``scheme://user:password@host`` (an unencoded ``@`` in the password included: the host is what
  follows the last ``@`` before the path);
- the value of every *secret name* wherever it is written as a name with a value: ``name=value`` (query strings,
  forms, libpq), ``name: value`` (headers, ``Password:`` lines; an ``Authorization`` scheme such as ``Basic`` is
  kept), a JSON member ``"name": value`` (in any text: with a BOM, trailing text, or as JSON inside a JSON string,
  ``\\"name\\": \\"value\\"``), an XML element ``<name>value</name>`` (a CDATA section too, any namespace prefix)
  and an XML attribute ``name="value"`` (the element stays whole).

The secret names are :data:`SECRET_NAMES`, those added for the process by :func:`add_secret_names` (the
configuration's ``secret_names``, every external system's ``records.secret_fields``) and those given to a call.
A name matches in any case, with ``-`` and ``_`` alike or left out (``api_key`` masks ``apiKey``), and also as the
last part of a longer name after ``-``, ``_``, ``.`` or a camelCase capital (``password`` masks ``db_password``,
``api_key`` masks ``X-Api-Key``, ``token`` masks ``refresh_token`` and ``accessToken``, ``secret`` masks
``clientSecret``).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable
from typing import Any

__all__ = ["MASK", "SECRET_NAMES", "add_secret_names", "mask_secrets", "masked_url", "masked_value",
           "secret_names"]

#: what a secret is replaced with
MASK = "***"

#: the names whose values are always masked (see the module's docstring for how a name matches)
SECRET_NAMES: tuple[str, ...] = (
    "authorization", "cookie", "apikey", "api_key", "access_token", "token", "sig", "signature", "password",
    "passwd", "pwd", "secret",
)

#: the names masked in this process (:data:`SECRET_NAMES` and those added)
_names: frozenset[str] = frozenset(SECRET_NAMES)

# user:password@ after a scheme (any URL: database, JDBC, HTTP); the password runs to the last "@" before the path,
# so an unencoded "@" in it is masked too
_URL_PASSWORD = re.compile(
    r"(?P<head>[A-Za-z][A-Za-z0-9+.\-]*://[^:/?#\s'\"<>]*):(?P<secret>[^/?#\s'\"<>]*)@")
_BARE_PASSWORD = re.compile(r":[^:@/\s]+@")
# what may come before a secret name in a longer one: anything ending in "-", "_", "." or before a camelCase capital
# (accessToken; the case checked even in an IGNORECASE pattern)
_NAME_PREFIX = r"(?:[\w.-]*(?:[_.-]|(?-i:(?<=[a-z0-9])(?=[A-Z]))))?"
# an Authorization header's scheme, kept before the masked credentials
_AUTH_SCHEME = r"(?:(?:Basic|Bearer|Digest|Negotiate|NTLM|Token|HOBA|Mutual|AWS4-HMAC-SHA256)\s+)?"


def add_secret_names(names: Iterable[str]) -> None:
    """Mask the values of ``names`` too, everywhere in this process from now on (besides :data:`SECRET_NAMES`)."""
    global _names
    cleaned = {name.strip().lower() for name in names if isinstance(name, str) and name.strip()}
    if not cleaned <= _names:
        _names = _names | cleaned


def secret_names() -> frozenset[str]:
    """The names masked in this process: :data:`SECRET_NAMES` and those of :func:`add_secret_names`."""
    return _names


def masked_url(url: Any) -> str:
    """``url`` (a string or SQLAlchemy ``URL``) as text with its password replaced by ``***``; text that is no URL is
    masked by :func:`mask_secrets` (and a bare ``name:password@host``). Never raises."""
    from sqlalchemy.engine import URL

    if isinstance(url, URL):
        return url.render_as_string(hide_password=True)
    text = mask_secrets(str(url))
    return text if "://" in text else _BARE_PASSWORD.sub(f":{MASK}@", text)


def mask_secrets(text: str, names: Iterable[str] = ()) -> str:
    """``text`` with every secret replaced by ``***``: URL passwords and the values of the secret names (this
    process's, see :func:`secret_names`, and ``names``) in every form the module's docstring lists. Never raises;
    a value that is not a string is masked as its ``str``."""
    text = text if isinstance(text, str) else str(text)
    if not text:
        return text
    if "://" in text:
        text = _URL_PASSWORD.sub(lambda m: f"{m['head']}:{MASK}@", text)
    extra = frozenset(name.lower() for name in names if isinstance(name, str) and name)
    wanted = _names | extra if extra else _names
    compact = _compact(text)
    present = frozenset(name for name, spelled in _compacted(wanted) if spelled in compact)
    if not present:
        return text
    patterns = _patterns(present)
    if "<" in text:
        text = patterns.element.sub(_masked_element, text)
    return patterns.pair.sub(_masked_pair, text)


def masked_value(value: Any, names: Iterable[str] = ()) -> Any:
    """A JSON value (dicts, lists, strings, numbers) with the same rules as :func:`mask_secrets`: a member whose name
    is secret gets ``"***"``, every string is masked as text. Other values are returned as they are."""
    if isinstance(value, str):
        return mask_secrets(value, names)
    if isinstance(value, dict):
        extra = tuple(names)
        secret = _name_matcher(_names | {name.lower() for name in extra})
        return {key: MASK if isinstance(key, str) and secret(key) else masked_value(item, extra)
                for key, item in value.items()}
    if isinstance(value, list | tuple):
        extra = tuple(names)
        return [masked_value(item, extra) for item in value]
    return value


class _Patterns:
    """The compiled patterns of one set of secret names."""

    def __init__(self, names: frozenset[str]) -> None:
        alternatives = "|".join(sorted((_spelled(name) for name in names), key=len, reverse=True))
        # the name alone or as the last part of a longer one; never inside a word
        name = rf"(?<![\w.-]){_NAME_PREFIX}(?:{alternatives})(?![\w-])"
        self.pair = re.compile(
            rf"(?P<key>(?P<kq>\\*[\"']?){name}(?P=kq))(?P<sep>[ \t]*[:=][ \t]*)(?P<value>"
            r"(?P<dq>\"(?:[^\"\\\n]|\\.)*\")"          # "value" (JSON, XML attribute, quoted)
            r"|(?P<sq>'[^'\n]*')"                      # 'value'
            r"|(?P<eq>(?P<esc>\\+\")(?:(?!(?P=esc)).)*(?P=esc))"  # \"value\" (JSON inside a JSON string)
            rf"|(?P<scheme>{_AUTH_SCHEME})(?P<bare>[^\s&;,'\"<>()\[\]{{}}\\]+))",  # bare value (query, header)
            re.IGNORECASE,
        )
        self.element = re.compile(
            rf"(?P<open><(?P<tag>(?:[\w.-]+:)?{name})(?:\s[^<>]*)?(?<!/)>)"
            r"(?P<value>(?:<!\[CDATA\[.*?\]\]>|[^<])*)"
            r"(?P<close></(?P=tag)\s*>)",
            re.IGNORECASE | re.DOTALL,
        )


def _spelled(name: str) -> str:
    """A regular expression of ``name`` where ``-`` and ``_`` stand for each other or are left out."""
    return "[_-]?".join(re.escape(part) for part in re.split(r"[_-]", name))


def _compact(text: str) -> str:
    """``text`` in lower case without ``-`` and ``_``: a name is present only if its compact form is in it."""
    return text.lower().replace("-", "").replace("_", "")


@functools.lru_cache(maxsize=64)
def _compacted(names: frozenset[str]) -> tuple[tuple[str, str], ...]:
    return tuple((name, _compact(name)) for name in names)


@functools.lru_cache(maxsize=64)
def _patterns(names: frozenset[str]) -> _Patterns:
    return _Patterns(names)


@functools.lru_cache(maxsize=64)
def _name_matcher_of(names: frozenset[str]) -> re.Pattern[str]:
    alternatives = "|".join(_spelled(name) for name in names)
    return re.compile(rf"{_NAME_PREFIX}(?:{alternatives})", re.IGNORECASE)


def _name_matcher(names: Iterable[str]) -> Any:
    pattern = _name_matcher_of(frozenset(names))
    return lambda key: pattern.fullmatch(key) is not None


def _masked_pair(match: re.Match[str]) -> str:
    head = f"{match['key']}{match['sep']}"
    if match["dq"] is not None:
        return f'{head}"{MASK}"'
    if match["sq"] is not None:
        return f"{head}'{MASK}'"
    if match["eq"] is not None:
        return f"{head}{match['esc']}{MASK}{match['esc']}"
    quote = match["kq"]
    if quote.endswith('"'):  # a JSON member with a number or a literal: the mask as a string keeps it JSON
        return f"{head}{quote}{MASK}{quote}"
    return f"{head}{match['scheme']}{MASK}"


def _masked_element(match: re.Match[str]) -> str:
    return f"{match['open']}{MASK}{match['close']}"
