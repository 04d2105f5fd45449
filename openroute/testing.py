"""The route test kit: run your routes for real in a test, without a server and without sleeping.

::

    async def test_customer_is_set(route_test_kit):
        billing = CallRecorder(fail_first=1)                      # fails once, then answers {"ok": True}
        kit = await route_test_kit(build_application(billing))   # engine + temporary SQLite + manual clock
        sent = await kit.send_json("crm", "setCustomer", {"customer": {"id": "C-1"}})
        await kit.settle()
        kit.assert_state(sent.message_id, "PARTLY_FAILED")
        await kit.advance(minutes=1)                              # the clock moves, repoll runs, work settles
        kit.assert_state(sent.message_id, "OK")
        assert billing.calls == 2

A kit serves the application's real inbound endpoints in-process (an ASGI transport: every request goes through
the same validation, extraction and error answers as under ``openroute run``), on an engine with its in-memory
processing channel, a :class:`~openroute.clock.ManualClock` and no repoll scheduler: :meth:`RouteTestKit.advance`
moves the clock and runs the repoll itself. The database is a temporary SQLite file unless a URL is given (the
same code path as PostgreSQL). The ``route_test_kit`` pytest fixture (registered through the ``pytest11`` entry
point, so every project that installs openroute has it) creates kits and closes them after the test.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import tempfile
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx

from openroute.clock import ManualClock
from openroute.engine import Engine, EngineSettings
from openroute.errors import TechnicalError
from openroute.interceptors import MessageInterceptor
from persistence import MessageState, MessageStore, StoredMessage

__all__ = ["CallRecorder", "RouteTestKit", "SendResult", "route_test_kit"]

DEFAULT_START = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)
SOAP_11 = "http://schemas.xmlsoap.org/soap/envelope/"


@dataclass(frozen=True)
class SendResult:
    """The inbound endpoint's answer to :meth:`RouteTestKit.send_json` / :meth:`RouteTestKit.send_soap`."""

    status_code: int
    message_id: int | None
    correlation_id: str | None
    duplicate: bool
    body: str


class RouteTestKit:
    """Routes on a real engine and store, driven by the test (see the module docstring)."""

    def __init__(
        self,
        application: Any,
        *,
        database_url: str | None = None,
        start: datetime = DEFAULT_START,
        settings: EngineSettings | None = None,
        interceptors: Iterable[MessageInterceptor] = (),
    ) -> None:
        from openroute.server import create_app, routes_and_bindings

        routes, bindings = routes_and_bindings(application, "the kit's application")
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        if database_url is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="openroute-kit-")
            database_url = f"sqlite:///{Path(self._tmp.name) / 'kit.db'}"
        self.clock = ManualClock(start)
        self.store = MessageStore(database_url)
        self.store.upgrade()
        base = settings or EngineSettings(node_id="route-test-kit")
        if base.repoll_interval is not None:
            base = dataclasses.replace(base, repoll_interval=None)  # the kit runs the repoll itself
        self.engine = Engine(self.store, routes, base, clock=self.clock, interceptors=tuple(interceptors))
        self.app = create_app(self.engine, bindings, manage_engine=False)
        self._client = httpx.AsyncClient(transport=httpx.ASGITransport(app=self.app), base_url="http://kit")
        self._started = False

    async def start(self) -> RouteTestKit:
        """Start the engine (done by the fixture)."""
        if not self._started:
            await self.engine.start()
            self._started = True
        return self

    async def close(self) -> None:
        """Stop the engine, close the client, remove the temporary database."""
        await self._client.aclose()
        if self._started:
            await self.engine.stop()
        self.store.dispose()
        if self._tmp is not None:
            self._tmp.cleanup()

    async def __aenter__(self) -> RouteTestKit:
        return await self.start()

    async def __aexit__(self, *_exc: object) -> None:
        await self.close()

    # -- sending --------------------------------------------------------------------------------------
    async def send_json(
        self,
        service: str,
        operation: str,
        payload: Mapping[str, Any] | str,
        *,
        correlation_id: str | None = None,
        source_system: str = "test",
        headers: Mapping[str, str] | None = None,
    ) -> SendResult:
        """POST ``payload`` to the JSON endpoint of (service, operation), as a source system would."""
        body = payload if isinstance(payload, str) else json.dumps(payload)
        sent = {"Content-Type": "application/json", "X-Source-System": source_system, **(headers or {})}
        if correlation_id is not None:
            sent["X-Correlation-Id"] = correlation_id
        response = await self._client.post(f"/api/{service}/{operation}", content=body.encode(), headers=sent)
        return _result(response)

    async def send_soap(
        self,
        service: str,
        body_xml: str,
        *,
        correlation_id: str | None = None,
        source_system: str = "test",
        soap_action: str = "",
    ) -> SendResult:
        """POST a SOAP 1.1 envelope around ``body_xml`` (the request element) to ``/soap/<service>``."""
        envelope = (f'<soapenv:Envelope xmlns:soapenv="{SOAP_11}"><soapenv:Body>{body_xml}'
                    "</soapenv:Body></soapenv:Envelope>")
        sent = {"Content-Type": "text/xml; charset=utf-8", "SOAPAction": f'"{soap_action}"',
                "X-Source-System": source_system}
        if correlation_id is not None:
            sent["X-Correlation-Id"] = correlation_id
        response = await self._client.post(f"/soap/{service}", content=envelope.encode(), headers=sent)
        return _result(response, soap=True)

    @property
    def client(self) -> httpx.AsyncClient:
        """An HTTP client on the kit's app (admin API, /metrics, /health, raw requests)."""
        return self._client

    # -- time and progress ----------------------------------------------------------------------------
    async def settle(self, timeout: float = 10.0) -> None:
        """Wait until the engine has nothing queued or in flight (TimeoutError after ``timeout`` seconds)."""
        try:
            await self.engine.wait_idle(timeout)
        except TimeoutError:
            raise AssertionError(f"the engine did not settle within {timeout} s "
                                 f"({self.engine.in_flight} in flight, {self.engine.queued} queued)") from None

    async def advance(self, delta: timedelta | None = None, *, timeout: float = 10.0, **parts: float) -> None:
        """Move the clock by ``delta`` (or ``minutes=``, ``seconds=`` ...), run one repoll, settle."""
        step = delta if delta is not None else timedelta(**parts)
        self.clock.advance(step)
        await self.engine.repoll_once()
        await self.settle(timeout)

    async def wait_for_state(self, message_id: int, *states: MessageState | str, timeout: float = 10.0) -> None:
        """Wait (bounded) until each message's state is reached while other work is still in flight, e.g. a
        step of another message is held on an event so :meth:`settle` cannot return. ``states`` pairs with
        ``message_id`` first; use :meth:`settle` whenever the engine can go idle."""
        wanted = [MessageState(s) for s in states]
        try:
            async with asyncio.timeout(timeout):
                while self.state(message_id) not in wanted:
                    await asyncio.sleep(0.01)  # the store is written by the engine's writer thread: no event
        except TimeoutError:
            raise AssertionError(f"message {message_id} is {self.state(message_id).value}, not "
                                 f"{'/'.join(s.value for s in wanted)} after {timeout} s") from None

    async def run_until_final(self, message_id: int, *, step: timedelta = timedelta(minutes=1),
                              max_steps: int = 100) -> StoredMessage:
        """Advance the clock ``step`` at a time until the message is final (at most ``max_steps``)."""
        await self.settle()
        for _ in range(max_steps):
            message = self.message(message_id)
            if message.state.is_final:
                return message
            await self.advance(step)
        raise AssertionError(f"message {message_id} is still {self.message(message_id).state.value} "
                             f"after {max_steps} steps of {step}")

    # -- reading the store ----------------------------------------------------------------------------
    def message(self, message_id: int) -> StoredMessage:
        """The stored message (AssertionError when there is none)."""
        found = self.store.get(message_id)
        if found is None:
            raise AssertionError(f"no message {message_id} in the store")
        return found

    def state(self, message_id: int) -> MessageState:
        """The message's current state."""
        return self.message(message_id).state

    def assert_state(self, message_id: int, expected: MessageState | str) -> StoredMessage:
        """Fail the test unless the message is in ``expected``; returns the message."""
        message = self.message(message_id)
        wanted = MessageState(expected)
        if message.state is not wanted:
            raise AssertionError(f"message {message_id} is {message.state.value}, expected {wanted.value}"
                                 f" (last error {message.last_error_code}: {message.last_error_text})")
        return message

    def children(self, message_id: int) -> list[StoredMessage]:
        """The child messages of a split, in order."""
        return self.store.children_of(message_id)

    def external_calls(self, message_id: int) -> dict[str, Any]:
        """The message-scoped external calls recorded for a message: key -> (status, attempts, result)."""
        from persistence import external_call_table

        query = external_call_table.select().where(external_call_table.c.message_id == message_id)
        with self.store.engine.connect() as connection:
            rows = connection.execute(query).all()
        return {r.call_key: (r.status.value, r.attempts, r.result) for r in rows}

    def count_by_state(self) -> dict[str, int]:
        """How many messages are in each state (states with none left out)."""
        return {state.value: count for state, count in self.store.count_by_state().items()}


@dataclass
class CallRecorder:
    """A fake external function: counts calls, fails the first ``fail_first`` with ``error`` (a technical error
    by default), then returns ``result`` (or ``result(exchange)`` when callable)."""

    result: Any = field(default_factory=lambda: {"ok": True})
    fail_first: int = 0
    error: Callable[[], BaseException] = field(default=lambda: TechnicalError("remote system unavailable", "DOWN"))
    calls: int = 0
    arguments: list[Any] = field(default_factory=list)

    def __call__(self, *args: Any) -> Any:
        self.calls += 1
        self.arguments.append(args[0] if len(args) == 1 else args)
        if self.calls <= self.fail_first:
            raise self.error()
        return self.result(*args) if callable(self.result) else self.result


def _result(response: httpx.Response, soap: bool = False) -> SendResult:
    message_id = response.headers.get("X-Message-Id")
    correlation = response.headers.get("X-Correlation-Id")
    duplicate = False
    if not soap and response.headers.get("content-type", "").startswith("application/json"):
        duplicate = response.json().get("status") == "DUPLICATE"
    elif soap:
        duplicate = "<status>DUPLICATE</status>" in response.text or ">DUPLICATE<" in response.text
    return SendResult(response.status_code, int(message_id) if message_id else None, correlation, duplicate,
                      response.text)


async def _route_test_kit() -> AsyncIterator[Callable[..., Any]]:
    """Factory fixture: ``kit = await route_test_kit(application, database_url=None, ...)``; closed after the test."""
    kits: list[RouteTestKit] = []

    async def make(application: Any, **options: Any) -> RouteTestKit:
        kit = RouteTestKit(application, **options)
        kits.append(kit)
        return await kit.start()

    yield make
    for kit in kits:
        await asyncio.shield(kit.close())


try:  # the kit itself works without pytest (the demo uses it); only the fixture needs it
    import pytest
except ImportError:  # pragma: no cover - pytest is a dev dependency
    route_test_kit = None
else:
    route_test_kit = pytest.fixture(_route_test_kit, name="route_test_kit")
