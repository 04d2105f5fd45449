"""openroute/runtime/logs.py: a line per state change (a failed attempt's cause in it), tracebacks for unexpected errors
only, one format for everything."""

from __future__ import annotations

import asyncio
import http.server
import io
import json
import logging
import threading
import time
from collections.abc import Iterator
from datetime import timedelta

import httpx
import pytest
from openroute.persistence import MessageStore

from openroute.definitions.errors import BusinessError
from openroute.definitions.message import InboundMessage
from openroute.dsl import Application, route
from openroute.runtime.logs import AttemptFailureLog, JsonFormatter, RepeatedErrors, TransitionLog, configure_logging


def _fine(exchange: object) -> None:
    return None


def _down(exchange: object) -> None:
    raise ConnectionError("billing is down")


def _refused(exchange: object) -> None:
    raise BusinessError("NO_CREDIT", "customer has no credit")


def _application() -> Application:
    return Application(
        route("shop", "order").json().process(_fine),
        route("shop", "pay").json().retry(max_attempts=2, interval=timedelta(seconds=60)).process(_down),
        route("shop", "refund").json().process(_refused),
    )


@pytest.fixture
def root_logging() -> Iterator[None]:
    """configure_logging changes the root logger: put it back afterwards."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    uvicorn = {name: (logging.getLogger(name).handlers[:], logging.getLogger(name).propagate)
               for name in ("uvicorn", "uvicorn.error", "uvicorn.access")}
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
    for name, (saved, propagate) in uvicorn.items():
        logging.getLogger(name).handlers[:] = saved
        logging.getLogger(name).propagate = propagate


async def test_a_message_is_one_info_line_of_its_outcome_plus_one_per_failed_attempt(
        route_test_kit, caplog: pytest.LogCaptureFixture) -> None:
    kit = await route_test_kit(_application(), interceptors=[AttemptFailureLog()])
    kit.engine.on_transition(TransitionLog())
    caplog.set_level(logging.DEBUG, logger="openroute")
    ok = await kit.send_json("shop", "order", {"n": 1}, correlation_id="c-ok")
    pay = await kit.send_json("shop", "pay", {"n": 2}, correlation_id="c-pay")
    await kit.settle()
    kit.assert_state(ok.message_id, "OK")
    kit.assert_state(pay.message_id, "PARTLY_FAILED")
    await kit.advance(minutes=2)
    kit.assert_state(pay.message_id, "FAILED")

    changes = [r for r in caplog.records if r.name == "openroute.messages"]
    info = [r.getMessage() for r in changes if r.levelno == logging.INFO]
    debug = [r.getMessage() for r in changes if r.levelno == logging.DEBUG]
    assert f"message {ok.message_id} shop/order - -> NEW attempt 1 correlation c-ok" in debug
    assert [line for line in info if f"message {ok.message_id} " in line] == [
        f"message {ok.message_id} shop/order PROCESSING -> OK attempt 1 correlation c-ok"]
    assert f"message {ok.message_id} shop/order NEW -> PROCESSING attempt 1 correlation c-ok" in debug
    assert f"message {ok.message_id} shop/order PROCESSING -> OK attempt 1 correlation c-ok" in info
    assert (f"message {pay.message_id} shop/pay PROCESSING -> PARTLY_FAILED attempt 1 error ConnectionError "
            "(ConnectionError: billing is down) correlation c-pay") in info
    assert f"message {pay.message_id} shop/pay PARTLY_FAILED -> PROCESSING attempt 2 correlation c-pay" in debug
    assert (f"message {pay.message_id} shop/pay PROCESSING -> FAILED attempt 2 error ConnectionError "
            "(ConnectionError: billing is down) correlation c-pay") in info
    last = changes[-1]
    assert (last.message_id, last.correlation_id, last.route) == (pay.message_id, "c-pay", "shop/pay")
    assert (last.from_state, last.to_state, last.attempt, last.error_code) == (
        "PROCESSING", "FAILED", 2, "ConnectionError")
    # the store numbers the attempts as the log does
    stored = [(t["from_state"], t["to_state"], t["attempt"]) for t in kit.store.transitions.of(pay.message_id)]
    assert [(None if a is None else a.value, b.value, n) for a, b, n in stored] == [
        (None, "NEW", 1), ("NEW", "PROCESSING", 1), ("PROCESSING", "PARTLY_FAILED", 1),
        ("PARTLY_FAILED", "PROCESSING", 2), ("PROCESSING", "FAILED", 2)]

    repoll = [r.getMessage() for r in caplog.records if r.name == "openroute.engine"]
    assert "repoll: 0 stuck message(s) repaired, 1 due or unclaimed message(s) queued" in repoll

    # a ConnectionError is expected (a remote system is down): no traceback, the state line says it all
    assert [r for r in caplog.records if r.name == "openroute.failures"] == []


def _broken(exchange: object) -> None:
    raise KeyError("customerId")


async def test_an_unexpected_error_logs_its_traceback_once_and_stores_it(route_test_kit,
                                                                         caplog: pytest.LogCaptureFixture) -> None:
    app = Application(route("shop", "bug").json().retry(max_attempts=3, interval=timedelta(seconds=60))
                      .process(_broken))
    kit = await route_test_kit(app, interceptors=[AttemptFailureLog()])
    kit.engine.on_transition(TransitionLog())
    caplog.set_level(logging.INFO, logger="openroute")
    sent = await kit.send_json("shop", "bug", {"n": 1}, correlation_id="c-bug")
    await kit.settle()
    await kit.advance(minutes=2)
    await kit.advance(minutes=2)
    kit.assert_state(sent.message_id, "FAILED")
    failures = [r for r in caplog.records if r.name == "openroute.failures"]
    assert len(failures) == 1 and failures[0].levelno == logging.WARNING  # three attempts, the same error: once
    assert failures[0].exc_info is not None and isinstance(failures[0].exc_info[1], KeyError)
    assert failures[0].getMessage() == f"message {sent.message_id} shop/bug attempt 1 failed: KeyError: 'customerId'"
    message = kit.message(sent.message_id)
    assert message.last_error_trace is not None and "raise KeyError" in message.last_error_trace
    history = kit.store.transitions.of(sent.message_id)
    failed = [t for t in history if t["error_code"] == "KeyError"]
    assert len(failed) == 3 and all("Traceback" in t["error_trace"] for t in failed)
    assert failed[0]["error_text"] == "KeyError: 'customerId'"


async def test_a_business_error_is_one_line_without_a_traceback(route_test_kit,
                                                                caplog: pytest.LogCaptureFixture) -> None:
    kit = await route_test_kit(_application(), interceptors=[AttemptFailureLog()])
    kit.engine.on_transition(TransitionLog())
    caplog.set_level(logging.INFO, logger="openroute")
    sent = await kit.send_json("shop", "refund", {"n": 3}, correlation_id="c-refund")
    await kit.settle()
    kit.assert_state(sent.message_id, "FAILED")
    assert len(kit.message(sent.message_id).business_errors) == 1  # the log interceptor adds nothing
    assert [r for r in caplog.records if r.name == "openroute.failures"] == []
    assert all(r.exc_info is None for r in caplog.records)
    assert (f"message {sent.message_id} shop/refund PROCESSING -> FAILED attempt 1 error NO_CREDIT "
            "(customer has no credit) correlation c-refund") in [r.getMessage() for r in caplog.records]


class _Unavailable(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(503)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        return None


@pytest.fixture
def failing_remote() -> Iterator[str]:
    """A real HTTP server on loopback that answers every request 503."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Unavailable)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/hlr"
    server.shutdown()
    server.server_close()


async def test_200_messages_with_a_failing_remote_log_at_most_2_lines_each(
        route_test_kit, failing_remote: str, root_logging: None) -> None:
    client = httpx.AsyncClient(timeout=5)

    async def ask_hlr(exchange: object) -> None:
        response = await client.get(failing_remote)
        response.raise_for_status()

    app = Application(route("hlr", "lookup").json().retry(max_attempts=2, interval=timedelta(seconds=60))
                      .process(ask_hlr))
    kit = await route_test_kit(app, interceptors=[AttemptFailureLog()])
    kit.engine.on_transition(TransitionLog())
    stream = io.StringIO()
    configure_logging("INFO", "text", stream)
    try:
        sent = [await kit.send_json("hlr", "lookup", {"n": n}, correlation_id=f"c-{n}") for n in range(200)]
        await kit.settle(timeout=60)
        await kit.advance(minutes=2, timeout=60)
    finally:
        await client.aclose()
    assert {kit.message(s.message_id).state.value for s in sent} == {"FAILED"}
    lines = stream.getvalue().splitlines()
    assert len(lines) <= 2 * 200 + 10, "\n".join(lines[:20])
    assert not any("Traceback" in line for line in lines)
    assert not any("httpx" in line or "HTTP Request" in line for line in lines)
    failed = [line for line in lines if f"message {sent[7].message_id} " in line]
    assert len(failed) == 2  # the failed attempt to retry and the outcome (its acceptance is DEBUG)
    assert "PROCESSING -> FAILED attempt 2 error HTTPStatusError (HTTPStatusError: Server error '503 Service " \
           "Unavailable'" in failed[-1]


def test_json_lines_carry_the_extra_fields_and_the_traceback() -> None:
    logger = logging.getLogger("openroute.test.json")
    try:
        raise ValueError("bad value")
    except ValueError as error:
        record = logger.makeRecord(logger.name, logging.WARNING, __file__, 1, "attempt %d failed", (3,),
                                   (type(error), error, error.__traceback__),
                                   extra={"message_id": 7, "route": "shop/pay", "error_code": None})
    entry = json.loads(JsonFormatter().format(record))
    assert entry["level"] == "WARNING" and entry["logger"] == "openroute.test.json"
    assert entry["message"] == "attempt 3 failed"
    assert (entry["message_id"], entry["route"], entry["error_code"]) == (7, "shop/pay", None)
    assert entry["error"] == "ValueError: bad value" and 'raise ValueError("bad value")' in entry["traceback"]
    assert entry["time"].endswith("+00:00")


def test_configure_logging_sends_uvicorn_through_the_same_handler(root_logging: None) -> None:
    stream = io.StringIO()
    logging.getLogger("uvicorn.error").addHandler(logging.StreamHandler(io.StringIO()))
    configure_logging("warning", "json", stream)
    logging.getLogger("uvicorn.error").warning("from uvicorn")
    logging.getLogger("openroute.x").warning("from openroute")
    logging.getLogger("openroute.x").info("not shown at WARNING")
    logging.getLogger("alembic.runtime").warning("kept at WARNING")
    entries = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert [(e["logger"], e["message"]) for e in entries] == [
        ("uvicorn.error", "from uvicorn"), ("openroute.x", "from openroute"), ("alembic.runtime", "kept at WARNING")]
    assert logging.getLogger("uvicorn.error").handlers == []


def test_text_format_and_chatty_libraries(root_logging: None) -> None:
    stream = io.StringIO()
    configure_logging("INFO", "text", stream)
    logging.getLogger("apscheduler.scheduler").info("Added job")  # noise at INFO
    logging.getLogger("openroute.run").info("serving")
    text = stream.getvalue()
    assert "Added job" not in text
    assert " INFO    openroute.run: serving" in text


@pytest.mark.parametrize(("level", "fmt", "message"), [("INFO", "xml", "log format must be 'text' or 'json'"),
                                                       ("LOUD", "text", "unknown log level 'LOUD'")])
def test_bad_logging_settings(root_logging: None, level: str, fmt: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        configure_logging(level, fmt)


async def test_a_restart_by_the_cli_is_its_own_line_and_the_server_logs_what_follows(
        route_test_kit, caplog: pytest.LogCaptureFixture) -> None:
    import asyncio
    from datetime import UTC, datetime

    from openroute.cli import main

    blocked = {"on": True}

    def check(exchange: object) -> None:
        if blocked["on"]:
            raise BusinessError("NO_CREDIT", "customer has no credit")

    kit = await route_test_kit(Application(route("shop", "pay").json().process(check)),
                               start=datetime.now(UTC) - timedelta(minutes=1))
    kit.engine.on_transition(TransitionLog())
    caplog.set_level(logging.INFO, logger="openroute")
    sent = await kit.send_json("shop", "pay", {"n": 1}, correlation_id="c-cli")
    await kit.settle()
    kit.assert_state(sent.message_id, "FAILED")
    blocked["on"] = False
    # openroute messages restart: another process in real life, writing to the same store
    code = await asyncio.to_thread(main, ["messages", "restart", str(sent.message_id), "--yes",
                                          "--database-url", kit.store.url])
    assert code == 0
    cause = kit.store.transitions.of(sent.message_id)[-1]["cause"]
    assert cause.startswith("cli:") and "@" in cause
    lines = [r.getMessage() for r in caplog.records]
    assert f"message {sent.message_id} restarted by {cause} (FAILED -> PARTLY_FAILED)" in lines
    await kit.advance(minutes=2)  # the server's repoll takes the restarted message
    kit.assert_state(sent.message_id, "OK")
    assert (f"message {sent.message_id} shop/pay PROCESSING -> OK attempt 1 correlation c-cli"
            in [r.getMessage() for r in caplog.records])


def _raise(error: Exception) -> None:
    raise error


def _raised(error: Exception) -> Exception:
    try:
        _raise(error)
    except Exception as raised:
        return raised
    raise AssertionError("not raised")


def test_a_repeated_error_logs_its_traceback_once_per_interval(caplog: pytest.LogCaptureFixture) -> None:
    """The first failure of an error has its traceback; the next ones in the interval are one line each, whatever
    their text (a driver's text holds the statement's values); another raising line or the interval's end shows
    it again."""
    now = [100.0]
    repeated = RepeatedErrors(interval=60, clock=lambda: now[0])
    logger = logging.getLogger("openroute.test.repeated")
    with caplog.at_level(logging.ERROR, logger=logger.name):
        for value in range(3):
            repeated.log(logger, "request to %s failed", "/x", error=_raised(RuntimeError(f"no table\n[id={value}]")))
            now[0] += 10
        elsewhere = RuntimeError("no table")  # raised by another line: its own traceback
        try:
            raise elsewhere
        except RuntimeError:
            repeated.log(logger, "request to %s failed", "/x", error=elsewhere)
        now[0] += 60
        repeated.log(logger, "request to %s failed", "/x", error=_raised(RuntimeError("no table")))
    records = [r for r in caplog.records if r.name == logger.name]
    assert [r.exc_info is not None for r in records] == [True, False, False, True, True]
    assert records[0].getMessage() == "request to /x failed"
    assert records[1].getMessage() == ("request to /x failed: RuntimeError: no table "
                                       "(again: its traceback was logged 10 s ago)")
    assert "\n" not in records[2].getMessage() and "20 s ago" in records[2].getMessage()


async def test_a_request_failing_unexpectedly_shows_one_traceback(caplog: pytest.LogCaptureFixture,
                                                                  monkeypatch: pytest.MonkeyPatch,
                                                                  store: MessageStore) -> None:
    """Every request of a node whose store is broken fails the same way: one traceback, then a line each."""
    from openroute.definitions.route import Route, RouteRegistry
    from openroute.engine import Engine, EngineSettings
    from openroute.inbound import InboundBinding
    from openroute.server import create_app

    engine = Engine(store, RouteRegistry([Route("orders", "create", [lambda exchange: None])]),
                    EngineSettings(repoll_interval=None, node_id="broken"))

    async def broken_accept(message: object) -> None:
        raise RuntimeError(f"relation message does not exist [{message!r:.20}]")

    monkeypatch.setattr(engine, "accept", broken_accept)
    # the server's record starts empty here (the other database's run of this test raised at the same line)
    monkeypatch.setattr("openroute.inbound.app.repeated_errors", RepeatedErrors())
    app = create_app(engine, [InboundBinding("orders", "create", "json")], manage_engine=False)
    with caplog.at_level(logging.ERROR, logger="openroute.inbound"):
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as client:
            for number in range(3):
                response = await client.post("/api/orders/create", content=json.dumps({"n": number}),
                                             headers={"Content-Type": "application/json",
                                                      "X-Correlation-Id": f"c-{number}", "X-Source-System": "CRM"})
                assert response.status_code == 500 and response.json()["error"] == "INTERNAL_ERROR", response.text
    failed = [r for r in caplog.records if "request to /api/orders/create failed" in r.getMessage()]
    assert [r.exc_info is not None for r in failed] == [True, False, False]
    assert "again: its traceback was logged" in failed[2].getMessage()


async def test_an_engine_loop_failing_unexpectedly_shows_one_traceback(caplog: pytest.LogCaptureFixture,
                                                                       monkeypatch: pytest.MonkeyPatch,
                                                                       store: MessageStore) -> None:
    """A repoll job that fails the same way at every tick (a bug, not an outage) logs its traceback once, then a line
    per tick; so does a transition listener that fails for every message."""
    from openroute.definitions.route import Route, RouteRegistry
    from openroute.engine import Engine, EngineSettings

    engine = Engine(store, RouteRegistry([Route("orders", "create", [lambda exchange: None])]),
                    EngineSettings(repoll_interval=timedelta(seconds=0.05), node_id="buggy"))

    async def broken_repoll(new_cutoff: object = None) -> None:
        raise KeyError("route table")

    def broken_listener(previous: object, message: object) -> None:
        raise TypeError("listener bug")

    monkeypatch.setattr("openroute.engine.repoll.repeated_errors", RepeatedErrors())
    monkeypatch.setattr("openroute.engine.pipeline.repeated_errors", RepeatedErrors())
    engine.on_transition(broken_listener)
    caplog.set_level(logging.ERROR, logger="openroute.engine")
    await engine.start()
    try:
        monkeypatch.setattr(engine._repoll, "run_once", broken_repoll)
        for number in range(3):
            await engine.accept(InboundMessage("orders", "create", json.dumps({"n": number}),
                                               "application/json", f"c-{number}", "CRM"))
        deadline = time.monotonic() + 30
        while sum("repoll failed" in r.getMessage() for r in caplog.records) < 3:
            assert time.monotonic() < deadline, "the repoll job did not tick three times within 30 s"
            await asyncio.sleep(0.02)
    finally:
        await engine.stop()
    ticks = [r for r in caplog.records if "repoll failed" in r.getMessage()]
    assert [r.exc_info is not None for r in ticks[:3]] == [True, False, False]
    assert "repoll failed: KeyError: 'route table' (again" in ticks[1].getMessage()
    listener = [r for r in caplog.records if "transition listener" in r.getMessage()]
    assert len(listener) >= 3 and [r.exc_info is not None for r in listener].count(True) == 1
