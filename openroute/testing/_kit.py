"""The route test kit (:class:`RouteTestKit`): an application's routes on a real engine and store, driven by the test;
its users import it from :mod:`openroute.testing`."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import tempfile
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, NamedTuple

import httpx
from lxml import etree
from pydantic import ValidationError

from openroute.definitions.binding import InboundBinding
from openroute.definitions.clock import ManualClock
from openroute.definitions.errors import ConfigurationError
from openroute.definitions.interceptors import MessageInterceptor
from openroute.engine import Engine, EngineSettings
from openroute.outbound import BreakerState, ExternalCalls, ExternalSystem
from openroute.persistence import MessageState, MessageStore, StoredMessage
from openroute.testing._fakes import FakeRemote

__all__ = ["RecordedCall", "RouteTestKit", "SendResult"]

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
    :class:`~openroute.definitions.route.RouteRegistry` (default bindings, or ``bindings=``), or a callable returning
    one. ``database_url``: default a temporary SQLite file, removed by :meth:`close`. ``start``: the manual clock's
    time. ``settings``: the engine's (its repoll interval is ignored: the kit repolls in :meth:`advance`).
    ``interceptors``: engine-wide interceptors.

    External systems: ``external_systems`` maps a system name to a fake (``FakeHttpService``, ``FakeSoapService``:
    the calls of ``ext_call(..., system=NAME)`` made with the shipped clients reach it instead of the network) or to
    an :class:`~openroute.outbound.ExternalSystem`; ``config`` is ``openroute.toml`` text whose
    ``[external_systems.NAME]`` tables give the systems their settings (timeouts, breaker, records), as under
    ``openroute run``. The calls go through the breakers on the kit's clock; a system a route names and nobody
    declared gets the defaults. Raises ConfigurationError for a bad ``config`` or system.
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
        external_systems: Mapping[str, FakeRemote | ExternalSystem] | None = None,
        config: str | None = None,
    ) -> None:
        from openroute.loading import routes_and_bindings
        from openroute.node import Node

        routes, found = routes_and_bindings(application, "the kit's application")
        if bindings is not None:
            found = list(bindings)  # e.g. a bare RouteRegistry with bindings of its own
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        if database_url is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="openroute-kit-")
            database_url = f"sqlite:///{Path(self._tmp.name) / 'kit.db'}"
        systems = declared_systems(external_systems or {}, config)
        self.clock = ManualClock(start)
        self.store = MessageStore(database_url)
        self.store.upgrade()
        base = settings or EngineSettings(node_id="route-test-kit")
        if base.repoll_interval is not None:
            base = dataclasses.replace(base, repoll_interval=None)  # the kit runs the repoll itself
        #: the guard of the routes' external calls (breakers, call records), as ``openroute run`` builds it
        self.calls = ExternalCalls(self.store, systems, clock=self.clock)
        self.engine = Engine(self.store, routes, base, clock=self.clock, interceptors=tuple(interceptors),
                             external_calls=self.calls)
        self._transition = asyncio.Event()
        self.engine.on_transition(lambda _previous, _message: self._transition.set())
        #: the node around the engine, as ``openroute run`` builds it (the kit starts and stops the engine itself)
        self.node = Node(self.engine, found, manage_engine=False)
        self.app = self.node.app
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

    def breaker_state(self, system: str) -> BreakerState:
        """The state of ``system``'s circuit breaker (shared through the store): CLOSED, OPEN or HALF_OPEN."""
        return self.calls.breakers.load(system, self.clock.now()).state

    def count_by_state(self) -> dict[str, int]:
        """How many messages are in each state (states with none left out)."""
        return {state.value: count for state, count in self.store.count_by_state().items()}


#: where a fake's system sends when the configuration gives it no base_url (the fake answers whatever the host)
FAKE_BASE_URL = "http://fake.invalid/"


def declared_systems(given: Mapping[str, FakeRemote | ExternalSystem], config: str | None) -> list[ExternalSystem]:
    """The kit's external systems: the ``[external_systems]`` tables of the ``config`` text, with the fakes of
    ``given`` as their transports, and the systems ``given`` as they are. Raises ConfigurationError naming what is
    wrong (a table that does not validate, a system given twice, a value that is neither a fake nor a system)."""
    from openroute.config import ExternalSystemConfig

    tables = _config_tables(config)
    systems: dict[str, ExternalSystem] = {}
    for name, table in tables.items():
        try:
            systems[name] = ExternalSystemConfig.model_validate(table).system(name)
        except ValidationError as error:  # one line per bad key, as openroute run says them
            problems = "; ".join(f"{'.'.join(str(part) for part in item['loc'])}: {item['msg']}"
                                 for item in error.errors())
            raise ConfigurationError(f"RouteTestKit: config: external_systems.{name}: {problems}") from None
        except ConfigurationError as error:
            raise ConfigurationError(f"RouteTestKit: config: external_systems.{name}: {error}") from None
    for name, value in given.items():
        if isinstance(value, ExternalSystem):
            if name in systems or value.name != name:
                raise ConfigurationError(f"RouteTestKit: external system {name} is given twice (or under another "
                                         f"name: {value.name}); give its settings in config or here, not both")
            systems[name] = value
        elif isinstance(value, FakeRemote):
            declared = systems.get(name) or ExternalSystem(name)
            systems[name] = dataclasses.replace(declared, base_url=declared.base_url or FAKE_BASE_URL, transport=value)
        else:
            raise ConfigurationError(f"RouteTestKit: external_systems[{name!r}] must be a fake (FakeHttpService, "
                                     f"FakeSoapService) or an ExternalSystem, got {value!r}")
    return list(systems.values())


def _config_tables(config: str | None) -> dict[str, Any]:
    if config is None:
        return {}
    try:
        document = tomllib.loads(config)
    except tomllib.TOMLDecodeError as error:
        raise ConfigurationError(f"RouteTestKit: config is not valid TOML: {error}") from None
    others = sorted(set(document) - {"external_systems"})
    if others:
        raise ConfigurationError(f"RouteTestKit: config: only the [external_systems] tables are read, got {others}")
    tables = document.get("external_systems", {})
    if not all(isinstance(table, dict) for table in tables.values()):
        raise ConfigurationError("RouteTestKit: config: each external system is a table [external_systems.NAME]")
    return dict(tables)


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
