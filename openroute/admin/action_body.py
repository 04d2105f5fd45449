"""The JSON body of an admin action (``{"state": ...}`` of a node or a breaker), read within limits.

An action's body is a small flat object, so the reader refuses anything else before Python's decoder sees it: a
body over :data:`MAX_BODY_BYTES` (413 ``PAYLOAD_TOO_LARGE``, not read further) and one nesting deeper than
:data:`MAX_DEPTH` (400 ``NESTING_TOO_DEEP``: the decoder would recurse once per level, and a few thousand levels
end in a ``RecursionError``). Anything that is not a JSON object is a 400 ``INVALID_QUERY``, as a bad value of the
object is::

    body = await action_body(request, '{"state": "OPEN"}')
"""

from __future__ import annotations

import json
from typing import Any

from starlette.requests import Request

from openroute.auth.errors import BodyTooLargeError, NestingTooDeepError
from openroute.queries.filters import InvalidQueryError

__all__ = ["MAX_BODY_BYTES", "MAX_DEPTH", "action_body"]

#: the largest action body read
MAX_BODY_BYTES = 16 * 1024
#: the deepest nesting of an action body (its own object is level 1)
MAX_DEPTH = 8


async def action_body(request: Request, example: str) -> dict[str, Any]:
    """The JSON object of ``request``'s body; ``example`` shows the expected body in the error of a wrong one.

    Raises BodyTooLargeError (413), NestingTooDeepError or InvalidQueryError (400); nothing is done."""
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            raise BodyTooLargeError(MAX_BODY_BYTES)
        chunks.append(chunk)
    try:
        text = b"".join(chunks).decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidQueryError(f"the body must be JSON like {example}, got bytes that are not UTF-8") from None
    # each level opens with a bracket: a text with few of them needs no walk
    if text.count("[") + text.count("{") > MAX_DEPTH and nesting(text) > MAX_DEPTH:
        raise NestingTooDeepError(MAX_DEPTH)
    try:
        body = json.loads(text)
    except ValueError:
        raise InvalidQueryError(f"the body must be JSON like {example}") from None
    if not isinstance(body, dict):
        raise InvalidQueryError(f"the body must be a JSON object like {example}, got {type(body).__name__}")
    return body


def nesting(text: str) -> int:
    """How deep the arrays and objects of the JSON ``text`` nest (brackets inside strings do not count)."""
    depth = deepest = 0
    in_string = escaped = False
    for char in text:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in "]}":
            depth -= 1
    return deepest
