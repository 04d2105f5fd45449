"""The server's log: one format (text or JSON lines) for openroute and uvicorn, a line per state change and the
traceback of every failed attempt.

    from openroute.logs import configure_logging, log_transition, AttemptFailureLog
    configure_logging("INFO", "json")
    engine = Engine(store, routes, interceptors=[AttemptFailureLog()])
    engine.transition_listeners.append(log_transition)

A state change reads ``message 12 crm/setCustomer PROCESSING -> PARTLY_FAILED attempt 1 error TIMEOUT
correlation c-7``; in JSON the same values are fields (``message_id``, ``correlation_id``, ``route``,
``from_state``, ``to_state``, ``attempt``, ``error_code``).
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, TextIO

from openroute.errors import BusinessError, CircuitOpenError, MessageDroppedByInterceptor
from openroute.interceptors import CallNext, InterceptionContext, MessageInterceptor

if TYPE_CHECKING:
    from openroute.persistence import MessageState, StoredMessage

__all__ = ["AttemptFailureLog", "JsonFormatter", "MaskingFormatter", "configure_logging", "log_transition"]

#: the logger of state changes (one INFO line each)
transitions_log = logging.getLogger("openroute.messages")
#: the logger of failed attempts (WARNING with the traceback)
failures_log = logging.getLogger("openroute.failures")

TEXT_FORMAT = "%(asctime)s %(levelname)-7s %(name)s: %(message)s"
#: attributes every LogRecord has; anything else given with ``extra=`` becomes a JSON field
_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime", "taskName"}
_CHATTY = ("alembic", "apscheduler")
_UVICORN = ("uvicorn", "uvicorn.error", "uvicorn.access", "uvicorn.asgi")


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ``time``, ``level``, ``logger``, ``message``, the record's ``extra`` fields and,
    for an exception, ``error`` and ``traceback``."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD and not key.startswith("_"):
                entry[key] = value if isinstance(value, str | int | float | bool | type(None)) else str(value)
        if record.exc_info and record.exc_info[1] is not None:
            entry["error"] = f"{type(record.exc_info[1]).__name__}: {record.exc_info[1]}"
            entry["traceback"] = self.formatException(record.exc_info)
        elif record.exc_text:
            entry["traceback"] = record.exc_text
        return json.dumps(entry, ensure_ascii=False)


class MaskingFormatter(logging.Formatter):
    """``inner``'s line with every credential in a URL or DSN masked (:func:`openroute.persistence.mask_secrets`):
    a driver's error or a traceback naming a database URL never writes its password to the log."""

    def __init__(self, inner: logging.Formatter) -> None:
        super().__init__()
        self.inner = inner

    def format(self, record: logging.LogRecord) -> str:
        from openroute.persistence import mask_secrets

        return mask_secrets(self.inner.format(record))


def configure_logging(level: str | int = "INFO", fmt: str = "text", stream: TextIO | None = None) -> None:
    """Send every log record (openroute's and uvicorn's) to ``stream`` (default stderr) in one format.

    ``fmt`` is ``"text"`` or ``"json"``; raises ValueError for anything else or an unknown level.
    """
    if fmt not in ("text", "json"):
        raise ValueError(f"log format must be 'text' or 'json', got {fmt!r}")
    numeric = logging.getLevelName(level.upper()) if isinstance(level, str) else level
    if not isinstance(numeric, int):
        raise ValueError(f"unknown log level {level!r}")
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(MaskingFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(TEXT_FORMAT)))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(numeric)
    for name in _CHATTY:  # their INFO lines say nothing an operator needs; DEBUG shows them
        logging.getLogger(name).setLevel(logging.NOTSET if numeric <= logging.DEBUG else logging.WARNING)
    for name in _UVICORN:  # uvicorn's own handlers and formats give way to ours
        logger = logging.getLogger(name)
        logger.handlers.clear()
        logger.propagate = True
        logger.setLevel(logging.NOTSET)


def log_transition(previous: MessageState | None, message: StoredMessage) -> None:
    """Engine transition listener: one INFO line per committed state change."""
    if not transitions_log.isEnabledFor(logging.INFO):
        return
    source = "-" if previous is None else previous.value
    target = message.state.value
    route = f"{message.service}/{message.operation}"
    failing = target in ("PARTLY_FAILED", "FAILED") or (previous is not None and target == "SKIPPED")
    # a failed attempt has been counted already; any other change belongs to the attempt after the failed ones
    attempt = max(message.failed_count, 1) if failing and target != "SKIPPED" else message.failed_count + 1
    code = message.last_error_code if failing else None
    text = f"message {message.id} {route} {source} -> {target} attempt {attempt}"
    if code:
        text += f" error {code}"
    text += f" correlation {message.correlation_id}"
    transitions_log.info(text, extra={
        "message_id": message.id, "correlation_id": message.correlation_id, "route": route,
        "from_state": None if previous is None else source, "to_state": target, "attempt": attempt,
        "error_code": code,
    })


class AttemptFailureLog(MessageInterceptor):
    """Engine-wide interceptor logging every failed attempt: a technical error at WARNING with its traceback, a
    business error at INFO (its code and text are stored with the message), a call an open circuit breaker refused at
    DEBUG (the opening itself is logged once). The error goes on unchanged."""

    async def around_delivery(self, context: InterceptionContext, call_next: CallNext) -> None:
        try:
            await call_next()
        except MessageDroppedByInterceptor:
            raise
        except Exception as error:
            message = context.message
            route = f"{message.service}/{message.operation}"
            extra = {"message_id": message.id, "correlation_id": message.correlation_id, "route": route,
                     "attempt": message.failed_count + 1}
            if isinstance(error, CircuitOpenError):  # the breaker's opening was logged once; this is its effect
                failures_log.debug("message %s %s postponed: %s", message.id, route, error, extra=extra)
            elif isinstance(error, BusinessError):
                failures_log.info("message %s %s attempt %d: business error %s: %s", message.id, route,
                                  message.failed_count + 1, error.code, error.text, extra=extra)
            else:
                failures_log.warning("message %s %s attempt %d failed: %s: %s", message.id, route,
                                     message.failed_count + 1, type(error).__name__, error, exc_info=error,
                                     extra=extra)
            raise
