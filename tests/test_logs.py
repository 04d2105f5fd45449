"""openroute/logs.py: a line per state change, failed attempts with their traceback, one format for everything."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator
from datetime import timedelta

import pytest

from openroute.dsl import Application, route
from openroute.errors import BusinessError
from openroute.logs import AttemptFailureLog, JsonFormatter, configure_logging, log_transition


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


async def test_every_state_change_is_one_info_line(route_test_kit, caplog: pytest.LogCaptureFixture) -> None:
    kit = await route_test_kit(_application(), interceptors=[AttemptFailureLog()])
    kit.engine.transition_listeners.append(log_transition)
    caplog.set_level(logging.INFO, logger="openroute")
    ok = await kit.send_json("shop", "order", {"n": 1}, correlation_id="c-ok")
    pay = await kit.send_json("shop", "pay", {"n": 2}, correlation_id="c-pay")
    await kit.settle()
    kit.assert_state(ok.message_id, "OK")
    kit.assert_state(pay.message_id, "PARTLY_FAILED")
    await kit.advance(minutes=2)
    kit.assert_state(pay.message_id, "FAILED")

    changes = [r for r in caplog.records if r.name == "openroute.messages"]
    assert all(r.levelno == logging.INFO for r in changes)
    lines = [r.getMessage() for r in changes]
    assert f"message {ok.message_id} shop/order - -> NEW attempt 1 correlation c-ok" in lines
    assert f"message {ok.message_id} shop/order NEW -> PROCESSING attempt 1 correlation c-ok" in lines
    assert f"message {ok.message_id} shop/order PROCESSING -> OK attempt 1 correlation c-ok" in lines
    assert (f"message {pay.message_id} shop/pay PROCESSING -> PARTLY_FAILED attempt 1 error ConnectionError "
            "correlation c-pay") in lines
    assert f"message {pay.message_id} shop/pay PARTLY_FAILED -> PROCESSING attempt 2 correlation c-pay" in lines
    assert (f"message {pay.message_id} shop/pay PROCESSING -> FAILED attempt 2 error ConnectionError "
            "correlation c-pay") in lines
    last = changes[-1]
    assert (last.message_id, last.correlation_id, last.route) == (pay.message_id, "c-pay", "shop/pay")
    assert (last.from_state, last.to_state, last.attempt, last.error_code) == (
        "PROCESSING", "FAILED", 2, "ConnectionError")

    repoll = [r.getMessage() for r in caplog.records if r.name == "openroute.engine"]
    assert "repoll: 0 stuck message(s) repaired, 1 due or unclaimed message(s) queued" in repoll

    failures = [r for r in caplog.records if r.name == "openroute.failures"]
    assert [r.levelno for r in failures] == [logging.WARNING, logging.WARNING]
    assert failures[0].exc_info is not None and isinstance(failures[0].exc_info[1], ConnectionError)
    assert failures[0].getMessage() == (
        f"message {pay.message_id} shop/pay attempt 1 failed: ConnectionError: billing is down")


async def test_a_business_error_is_logged_without_a_traceback(route_test_kit,
                                                              caplog: pytest.LogCaptureFixture) -> None:
    kit = await route_test_kit(_application(), interceptors=[AttemptFailureLog()])
    kit.engine.transition_listeners.append(log_transition)
    caplog.set_level(logging.INFO, logger="openroute")
    sent = await kit.send_json("shop", "refund", {"n": 3}, correlation_id="c-refund")
    await kit.settle()
    kit.assert_state(sent.message_id, "FAILED")
    assert len(kit.message(sent.message_id).business_errors) == 1  # the log interceptor adds nothing
    failure = next(r for r in caplog.records if r.name == "openroute.failures")
    assert failure.levelno == logging.INFO and failure.exc_info is None
    assert failure.getMessage().endswith("business error NO_CREDIT: customer has no credit")
    assert (f"message {sent.message_id} shop/refund PROCESSING -> FAILED attempt 1 error NO_CREDIT "
            "correlation c-refund") in [r.getMessage() for r in caplog.records]


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
