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
from typing import Any, NamedTuple

import httpx
from lxml import etree

from openroute.binding import InboundBinding
from openroute.clock import ManualClock
from openroute.engine import Engine, EngineSettings
from openroute.errors import TechnicalError
from openroute.interceptors import MessageInterceptor
from openroute.persistence import MessageState, MessageStore, StoredMessage

__all__ = ["CallRecorder", "RecordedCall", "RouteTestKit", "SendResult", "route_test_kit"]

DEFAULT_START = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)
SOAP_11 = "http://schemas.xmlsoap.org/soap/envelope/"
SOAP_12 = "http://www.w3.org/2003/05/soap-envelope"


@dataclass(frozen=True)
class SendResult:
    """The inbound endpoint's answer to :meth:`RouteTestKit.send` (and ``send_json`` / ``send_soap``).

    ``message_id`` is set when the message was stored (or was a duplicate of a stored one); a refused request
    (validation error, unknown operation ...) has ``error_code`` and ``reason`` from the HTTP 4xx answer or the
    SOAP Fault, exactly as a source system would see them.
    """

    status_code: int
    message_id: int | None
    correlation_id: str | None
    duplicate: bool
    body: str
    error_code: str | None = None
    reason: str | None = None

    @property
    def accepted(self) -> bool:
        """True when the message is stored (a duplicate counts: the first copy is)."""
        return self.message_id is not None and self.error_code is None


class RecordedCall(NamedTuple):
    """An external call recorded in the store: ``status`` (OK, FAILED, IN_PROGRESS), ``attempts``, ``result``
    (the recorded JSON result of the success). Compares equal to a plain ``(status, attempts, result)`` tuple.

    (The store's own record is :class:`openroute.persistence.ExternalCall`; this is the kit's summary of it.)
    """

    status: str
    attempts: int
    result: Any



class RouteTestKit:
    """Routes on a real engine and store, driven by the test (see the module docstring).

    ``application`` is what ``openroute run --routes`` takes: an :class:`~openroute.dsl.Application`, a
    :class:`~openroute.route.RouteRegistry` (default bindings, or ``bindings=``), or a callable returning one.
    ``database_url``: default a temporary SQLite file, removed by :meth:`close`. ``start``: the manual clock's
    time. ``settings``: the engine's (its repoll interval is ignored: the kit repolls in :meth:`advance`).
    ``interceptors``: engine-wide interceptors.
    """

    def __init__(
        self,
        application: Any,
        *,
        database_url: str | None = None,
        start: datetime = DEFAULT_START,
        settings: EngineSettings | None = None,
        interceptors: Iterable[MessageInterceptor] = (),
        bindings: Iterable[InboundBinding] | None = None,
    ) -> None:
        from openroute.loading import routes_and_bindings
        from openroute.server import create_app

        routes, found = routes_and_bindings(application, "the kit's application")
        if bindings is not None:
            found = list(bindings)  # e.g. a bare RouteRegistry with bindings of its own
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
        self._transition = asyncio.Event()
        self.engine.transition_listeners.append(lambda _previous, _message: self._transition.set())
        self.app = create_app(self.engine, found, manage_engine=False)
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
    async def send(
        self,
        service: str,
        operation: str,
        payload: Any,
        *,
        correlation_id: str | None = None,
        source_system: str = "test",
        soap_action: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> SendResult:
        """Send ``payload`` to (service, operation) through its inbound endpoint, as a source system would.

        A mapping or list (or a JSON text) goes to the JSON endpoint; an XML text (it starts with ``<``) to the SOAP
        endpoint of the service: the request element alone is wrapped in a SOAP 1.1 envelope, a whole SOAP 1.1 or
        1.2 envelope is sent as it is. The binding validates and extracts exactly as under ``openroute run``; the
        answer is a :class:`SendResult` (a refused message has ``error_code``, nothing stored). A SOAP request
        that the service routes to another operation than ``operation`` fails the test (AssertionError).
        """
        if isinstance(payload, bytes):
            payload = payload.decode()
        if not (isinstance(payload, str) and payload.lstrip().startswith("<")):
            if soap_action is not None:
                raise ValueError("soap_action is for SOAP requests; this payload goes to the JSON endpoint")
            return await self.send_json(service, operation, payload, correlation_id=correlation_id,
                                        source_system=source_system, headers=headers)
        result = await self.send_soap(service, payload, correlation_id=correlation_id, source_system=source_system,
                                      soap_action=soap_action or "", headers=headers)
        if result.accepted and result.message_id is not None:
            stored = self.message(result.message_id)
            if (stored.service, stored.operation) != (service, operation):
                raise AssertionError(f"the SOAP request was routed to {stored.service}/{stored.operation}, "
                                     f"not {service}/{operation} (message {stored.id})")
        return result

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
        headers: Mapping[str, str] | None = None,
    ) -> SendResult:
        """POST ``body_xml`` to ``/soap/<service>``: the request element, wrapped in a SOAP 1.1 envelope, or a whole
        SOAP 1.1 / 1.2 envelope, sent as it is."""
        version = _envelope_version(body_xml)
        envelope = body_xml if version else (
            f'<soapenv:Envelope xmlns:soapenv="{SOAP_11}"><soapenv:Body>{body_xml}'
            "</soapenv:Body></soapenv:Envelope>")
        if version == SOAP_12:
            action = f'; action="{soap_action}"' if soap_action else ""
            sent = {"Content-Type": f"application/soap+xml; charset=utf-8{action}"}
        else:
            sent = {"Content-Type": "text/xml; charset=utf-8", "SOAPAction": f'"{soap_action}"'}
        sent["X-Source-System"] = source_system
        sent.update(headers or {})
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
        """Wait (bounded) until the message is in one of ``states``, while other work is still in flight, e.g.
        a step of another message is held on an event so :meth:`settle` cannot return. Woken by every state
        change the kit's engine commits (no polling); AssertionError naming the state it is in after
        ``timeout`` seconds. Use :meth:`settle` whenever the engine can go idle."""
        if not states:
            raise ValueError("wait_for_state needs at least one state")
        wanted = [MessageState(s) for s in states]
        try:
            async with asyncio.timeout(timeout):
                while True:
                    self._transition.clear()  # cleared before reading: a change committed after the read wakes us
                    if self.state(message_id) in wanted:
                        return
                    await self._transition.wait()
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

    def external_calls(self, message_id: int) -> dict[str, RecordedCall]:
        """The message-scoped external calls recorded for a message: key -> :class:`RecordedCall`
        (status, attempts, result)."""
        from openroute.persistence import external_call_table

        query = external_call_table.select().where(external_call_table.c.message_id == message_id)
        with self.store.engine.connect() as connection:
            rows = connection.execute(query).all()
        return {r.call_key: RecordedCall(r.status.value, r.attempts, r.result) for r in rows}

    def entity_calls(self, entity_type: str, object_id: str) -> dict[str, RecordedCall]:
        """The entity-scoped external calls (``scope="entity"``) recorded for one entity: key ->
        :class:`RecordedCall`, whichever message made them."""
        from openroute.persistence import entity_call_table as table

        query = table.select().where(table.c.entity_type == entity_type, table.c.object_id == object_id)
        with self.store.engine.connect() as connection:
            rows = connection.execute(query).all()
        return {r.call_key: RecordedCall(r.status, r.attempts, r.result) for r in rows}

    def count_by_state(self) -> dict[str, int]:
        """How many messages are in each state (states with none left out)."""
        return {state.value: count for state, count in self.store.count_by_state().items()}


@dataclass
class CallRecorder:
    """A fake external function: counts its calls, fails the first ``fail_first`` of them, then returns ``result``
    (or ``result(*args)`` when callable).

    ``error`` is what a failing call raises: an exception class or a callable making one (a fresh exception per
    call), or an exception instance; by default a :class:`~openroute.errors.TechnicalError` (code ``DOWN``), which
    makes the attempt PARTLY_FAILED and retried. Use it wherever a step takes a function of the exchange:
    ``.ext_call("billing", CallRecorder(fail_first=1))``; ``arguments`` keeps what each call received.
    """

    result: Any = field(default_factory=lambda: {"ok": True})
    fail_first: int = 0
    error: Callable[[], BaseException] | BaseException = field(
        default=lambda: TechnicalError("remote system unavailable", code="DOWN"))
    calls: int = 0
    arguments: list[Any] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not isinstance(self.fail_first, int) or isinstance(self.fail_first, bool) or self.fail_first < 0:
            raise ValueError(f"fail_first must be an integer >= 0, got {self.fail_first!r}")
        if not (isinstance(self.error, BaseException) or callable(self.error)):
            raise TypeError(f"error must be an exception, an exception class or a callable, got {self.error!r}")

    def __call__(self, *args: Any) -> Any:
        self.calls += 1
        self.arguments.append(args[0] if len(args) == 1 else args)
        if self.calls <= self.fail_first:
            raise self.error if isinstance(self.error, BaseException) else self.error()
        return self.result(*args) if callable(self.result) else self.result

    @property
    def failures(self) -> int:
        """How many calls failed (at most ``fail_first``)."""
        return min(self.calls, self.fail_first)


def _envelope_version(text: str) -> str | None:
    """The SOAP namespace when ``text`` is a whole envelope, else None."""
    head = text.lstrip()
    if head.startswith("<?xml"):
        head = head[head.index("?>") + 2:].lstrip() if "?>" in head else head
    start = head[1:head.find(">")] if ">" in head else head
    tag = start.split()[0] if start.split() else ""
    if tag.rpartition(":")[2] != "Envelope":
        return None
    return SOAP_12 if SOAP_12 in start else SOAP_11


def _result(response: httpx.Response, soap: bool = False) -> SendResult:
    message_id = response.headers.get("X-Message-Id")
    correlation = response.headers.get("X-Correlation-Id")
    duplicate = False
    error_code: str | None = None
    reason: str | None = None
    if soap:
        try:
            root = etree.fromstring(response.content, etree.XMLParser(resolve_entities=False, no_network=True))
        except etree.XMLSyntaxError:
            root = None
        if root is not None:
            duplicate = any(e.text == "DUPLICATE" for e in root.iter() if etree.QName(e).localname == "status")
            for element in root.iter():
                local = etree.QName(element).localname if isinstance(element.tag, str) else ""
                if local == "code" and element.getparent() is not None and \
                        etree.QName(element.getparent()).localname == "error":
                    error_code = element.text
                elif local == "reason" and error_code is not None:
                    reason = element.text
        if error_code is None and response.status_code >= 400:
            error_code = f"HTTP_{response.status_code}"
    elif response.headers.get("content-type", "").startswith("application/json"):
        answer = response.json()
        if isinstance(answer, dict):
            duplicate = answer.get("status") == "DUPLICATE"
            if response.status_code >= 400:
                error_code, reason = answer.get("error"), answer.get("reason")
    if error_code is None and response.status_code >= 400:
        error_code = f"HTTP_{response.status_code}"
    return SendResult(response.status_code, int(message_id) if message_id else None, correlation, duplicate,
                      response.text, error_code, reason)


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
    route_test_kit: Any = None
else:
    try:  # pytest-asyncio runs the fixture in its strict mode too (no ``asyncio_mode = auto`` needed)
        import pytest_asyncio
    except ImportError:  # pragma: no cover - pytest-asyncio is a dev dependency
        route_test_kit = pytest.fixture(_route_test_kit, name="route_test_kit")
    else:
        route_test_kit = pytest_asyncio.fixture(_route_test_kit, name="route_test_kit")

    @pytest.hookimpl(hookwrapper=True, trylast=True)
    def pytest_pycollect_makeitem(collector: Any, name: str, obj: object) -> Any:
        """Mark ``async def`` tests that use ``route_test_kit`` with ``asyncio``, so pytest-asyncio runs them in
        strict mode too. Trylast: this wrapper sees the collected items before pytest-asyncio's converts them."""
        outcome = yield
        items = outcome.get_result()
        for item in items if isinstance(items, list) else [items]:
            if (isinstance(item, pytest.Function) and "route_test_kit" in item.fixturenames
                    and asyncio.iscoroutinefunction(item.obj) and item.get_closest_marker("asyncio") is None):
                item.add_marker(pytest.mark.asyncio)
