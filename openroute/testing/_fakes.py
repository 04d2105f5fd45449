"""What the fakes of external systems share: an httpx transport that records every request, waits its latency and
fails as the test programmed it, then lets the kind of fake (HTTP, SOAP) answer.

A fake is given to the kit by system name (``RouteTestKit(app, external_systems={"BILLING": fake})``): the shipped
clients' calls of that system inside an ``ext_call(..., system="BILLING")`` reach it instead of the network.
"""

from __future__ import annotations

import asyncio
import json
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, Self

import httpx

__all__ = ["FakeRemote", "FakeRequest"]

#: the ways a programmed failure can fail besides an HTTP status: no answer in time, no connection
FailureKind = Literal["timeout", "connect"]


@dataclass(frozen=True)
class FakeRequest:
    """One request a fake received: ``method``, ``url``, ``path``, ``headers`` (lower-case names), ``content``, the
    ``idempotency_key`` it carried (the ``Idempotency-Key`` header, or a SOAP request's WS-Addressing ``MessageID``)
    and, for a SOAP fake, the ``operation`` called."""

    method: str
    url: str
    path: str
    headers: Mapping[str, str]
    content: bytes
    idempotency_key: str | None = None
    operation: str | None = None

    @property
    def text(self) -> str:
        """The body as text (UTF-8)."""
        return self.content.decode("utf-8", "replace")

    @property
    def json(self) -> Any:
        """The body as JSON, None when it is empty or not JSON."""
        try:
            return json.loads(self.content) if self.content else None
        except ValueError:
            return None


@dataclass
class _Failure:
    """A programmed failure: how many requests it still fails (None: every one until ``recover()``) and how."""

    left: int | None
    respond: Callable[[httpx.Request, FakeRequest], httpx.Response]
    operation: str | None = None

    def applies(self, recorded: FakeRequest) -> bool:
        return self.operation is None or self.operation == recorded.operation


def _count(times: int | None) -> int | None:
    if times is not None and (isinstance(times, bool) or not isinstance(times, int) or times < 1):
        raise ValueError(f"times must be an integer >= 1, or None for every request until recover(), got {times!r}")
    return times


class FakeRemote(httpx.AsyncBaseTransport):
    """The part every fake shares (an ``httpx`` transport, like ``httpx.MockTransport``).

    ``latency`` (seconds) is waited before each answer: a call whose ``call_timeout`` is shorter is cut off by the
    engine (code ``TIMEOUT``), a request whose client read timeout is shorter gets ``httpx.ReadTimeout`` after that
    timeout. ``requests`` lists every request received, failed ones included; :meth:`fail` programs failures.
    """

    def __init__(self, *, latency: float = 0.0) -> None:
        if isinstance(latency, bool) or not isinstance(latency, int | float) or latency < 0:
            raise ValueError(f"latency must be a number of seconds >= 0, got {latency!r}")
        self.latency = float(latency)
        self.requests: list[FakeRequest] = []
        self._failures: deque[_Failure] = deque()

    @property
    def calls(self) -> int:
        """How many requests reached the fake (failed ones included)."""
        return len(self.requests)

    @property
    def idempotency_keys(self) -> list[str | None]:
        """The idempotency key of each request, in order (a repeated call carries the same key)."""
        return [request.idempotency_key for request in self.requests]

    def fail(self, times: int | None = 1, *, status: int = 503, error: FailureKind | None = None) -> Self:
        """Fail the next ``times`` requests (None: every request until :meth:`recover`), after those programmed
        before: with HTTP ``status`` (503 by default: a technical error for the shipped clients), or with
        ``error="timeout"`` (``httpx.ReadTimeout``: code ``TIMEOUT``) or ``error="connect"`` (``httpx.ConnectError``:
        code ``CONNECTION_ERROR``). Returns the fake. Raises ValueError for a count, status or error that cannot be."""
        if error is not None and error not in ("timeout", "connect"):
            raise ValueError(f"error must be 'timeout' or 'connect', got {error!r}")
        if isinstance(status, bool) or not isinstance(status, int) or not 400 <= status <= 599:
            raise ValueError(f"status must be an HTTP error status (400-599), got {status!r}")
        self._failures.append(_Failure(_count(times), _failing(error, status)))
        return self

    def recover(self) -> Self:
        """Forget the failures still programmed: the next requests are answered. Returns the fake."""
        self._failures.clear()
        return self

    def _program(self, times: int | None, respond: Callable[[httpx.Request, FakeRequest], httpx.Response],
                 operation: str | None = None) -> Self:
        self._failures.append(_Failure(_count(times), respond, operation))
        return self

    # -- the transport ------------------------------------------------------------------------------------------
    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        content = await request.aread()
        recorded = self._record(request, content)
        self.requests.append(recorded)
        await self._wait(request)
        failure = next((f for f in self._failures if f.applies(recorded)), None)
        if failure is not None:
            if failure.left is not None:
                failure.left -= 1
                if failure.left == 0:
                    self._failures.remove(failure)
            return failure.respond(request, recorded)
        return self._answer(request, recorded)

    async def _wait(self, request: httpx.Request) -> None:
        if not self.latency:
            return
        limit = (request.extensions.get("timeout") or {}).get("read")
        if limit is not None and self.latency > limit:
            await asyncio.sleep(limit)
            raise httpx.ReadTimeout(f"the fake answers after {self.latency:g} s, the read timeout is {limit:g} s",
                                    request=request)
        await asyncio.sleep(self.latency)

    def _record(self, request: httpx.Request, content: bytes) -> FakeRequest:
        """The record of ``request`` (a kind of fake adds the operation and reads its idempotency key)."""
        headers = {name.lower(): value for name, value in request.headers.items()}
        return FakeRequest(request.method, str(request.url), request.url.path, headers, content,
                           headers.get("idempotency-key"))

    def _answer(self, request: httpx.Request, recorded: FakeRequest) -> httpx.Response:
        raise NotImplementedError

    async def aclose(self) -> None:
        """Nothing to close: a fake outlives the clients that use it."""


def _failing(error: FailureKind | None, status: int) -> Callable[[httpx.Request, FakeRequest], httpx.Response]:
    def respond(request: httpx.Request, _recorded: FakeRequest) -> httpx.Response:
        if error == "timeout":
            raise httpx.ReadTimeout("the fake does not answer (a programmed failure)", request=request)
        if error == "connect":
            raise httpx.ConnectError("the fake refuses the connection (a programmed failure)", request=request)
        return httpx.Response(status, text=f"HTTP {status} (a programmed failure of the fake)")

    return respond
