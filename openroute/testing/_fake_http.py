"""The fake of an HTTP system called with :class:`~openroute.outbound.ExternalHttpClient`."""

from __future__ import annotations

import json
from typing import Any, Self

import httpx

from openroute.testing._fakes import FakeRemote, FakeRequest

__all__ = ["FakeHttpService"]

#: what a fake answers: a JSON value, a text, bytes, an ``httpx.Response``, or a callable of the request giving one
Answer = Any


class FakeHttpService(FakeRemote):
    """A fake HTTP system: canned answers, programmed failures, latency, every request recorded.

    ``answer`` is what every request gets unless :meth:`on` gives its method and path another one (default
    ``{"ok": True}``), with ``status`` (default 200): a JSON value is sent as JSON, a ``str`` as text, ``bytes`` as
    they are, an ``httpx.Response`` as it is, and a callable gets the :class:`FakeRequest` and returns one of these
    (e.g. an answer that depends on the request's JSON). Failures: :meth:`fail`; ``latency`` as for every fake::

        payments = FakeHttpService({"charge": "CH-1"}).fail(2, status=503)   # 503 twice, then the answer
        kit = await route_test_kit(app, external_systems={"PAYMENTS": payments})
        ...
        assert payments.calls == 3 and len(set(payments.idempotency_keys)) == 1
    """

    def __init__(self, answer: Answer = None, *, status: int = 200, latency: float = 0.0) -> None:
        super().__init__(latency=latency)
        self._default = ({"ok": True} if answer is None else answer, _status(status))
        self._routes: dict[tuple[str, str], tuple[Answer, int]] = {}

    def on(self, method: str, path: str, answer: Answer, *, status: int = 200) -> Self:
        """Answer ``method`` ``path`` (e.g. ``"POST", "/charges"``; the path without the query) with ``answer`` and
        ``status``. Returns the fake."""
        if not isinstance(method, str) or not method.isalpha():
            raise ValueError(f"method must be an HTTP method such as 'POST', got {method!r}")
        if not isinstance(path, str) or not path.startswith("/"):
            raise ValueError(f"path must start with '/', got {path!r}")
        self._routes[(method.upper(), path)] = (answer, _status(status))
        return self

    def _answer(self, request: httpx.Request, recorded: FakeRequest) -> httpx.Response:
        answer, status = self._routes.get((recorded.method, recorded.path), self._default)
        if callable(answer) and not isinstance(answer, httpx.Response):
            answer = answer(recorded)
        return response_of(answer, status)


def response_of(answer: Answer, status: int) -> httpx.Response:
    """The ``httpx.Response`` of a canned ``answer`` (see :class:`FakeHttpService`)."""
    if isinstance(answer, httpx.Response):
        return answer
    if isinstance(answer, bytes):
        return httpx.Response(status, content=answer)
    if isinstance(answer, str):
        return httpx.Response(status, text=answer)
    return httpx.Response(status, content=json.dumps(answer).encode(), headers={"Content-Type": "application/json"})


def _status(status: int) -> int:
    if isinstance(status, bool) or not isinstance(status, int) or not 100 <= status <= 599:
        raise ValueError(f"status must be an HTTP status (100-599), got {status!r}")
    return status

