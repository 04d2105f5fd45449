"""The server's log: one format (text or JSON lines) for openroute and uvicorn, one line per event.

    from openroute.runtime.logs import configure_logging, log_transition, AttemptFailureLog
    configure_logging("INFO", "json")
    engine = Engine(store, routes, interceptors=[AttemptFailureLog()])
    engine.on_transition(log_transition)

A state change reads ``message 12 crm/setCustomer PROCESSING -> PARTLY_FAILED attempt 1 error TIMEOUT (billing is
down) correlation c-7``: a failed attempt is that one line, with its error code and cause; in JSON the same values are
fields (``message_id``, ``correlation_id``, ``route``, ``from_state``, ``to_state``, ``attempt``, ``error_code``,
``error_text``). The attempt is the one the change belongs to, as in the message's ``message_transition`` rows. A
claim (``-> PROCESSING``) is logged at DEBUG: the attempt's outcome line follows it.

Tracebacks are for unexpected errors only (:func:`openroute.definitions.errors.is_expected_error`): at most one WARNING
per message and error. Business errors, validation errors, :class:`TechnicalError` and errors of remote systems
never print one. A request that fails unexpectedly (HTTP 500), or an engine job, hook or ``/metrics`` read that
fails at every turn, logs its traceback once a minute per error (:class:`RepeatedErrors`), then one line each time.
The routine INFO lines of libraries (httpx, httpcore, zeep, apscheduler, alembic, the AMQP clients, py4j) are shown
from WARNING up, unless the level is DEBUG; ``openroute run`` leaves uvicorn's access log (a line per request) off
unless asked (``[log] access``) or at DEBUG.
"""

from __future__ import annotations

import json
import logging
import sys
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, TextIO

from openroute.definitions.errors import MessageDroppedByInterceptor, is_expected_error
from openroute.definitions.interceptors import CallNext, InterceptionContext, MessageInterceptor

if TYPE_CHECKING:
    from openroute.persistence import MessageState, StoredMessage

__all__ = ["AttemptFailureLog", "JsonFormatter", "MaskingFormatter", "RepeatedErrors", "TransitionLog",
           "configure_logging", "ensure_action_log", "log_action", "log_transition", "repeated_errors"]

#: the logger of state changes (one INFO line each)
transitions_log = logging.getLogger("openroute.messages")
#: the logger of unexpected errors of attempts (WARNING with the traceback, once per message and error)
failures_log = logging.getLogger("openroute.failures")
#: the logger of operators' actions (restart, cancel) made outside a server: CLI, Spark
actions_log = logging.getLogger("openroute.actions")

TEXT_FORMAT = "%(asctime)s %(levelname)-7s %(name)s: %(message)s"
#: attributes every LogRecord has; anything else given with ``extra=`` becomes a JSON field
_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime", "taskName"}
#: libraries whose INFO lines are routine (one per request, per job run...): WARNING unless the level is DEBUG
_CHATTY = ("alembic", "apscheduler", "httpx", "httpcore", "zeep", "aio_pika", "aiormq", "pika", "py4j", "urllib3",
           "asyncio", "multipart", "hpack")
#: longest error text in a state change's line (the store keeps the whole text)
_LOG_ERROR_TEXT = 300
_UVICORN = ("uvicorn", "uvicorn.error", "uvicorn.access", "uvicorn.asgi")


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ``time``, ``level``, ``logger``, ``message``, the record's ``extra`` fields and,
    for an exception, ``error`` and ``traceback``."""

    def format(self, record: logging.LogRecord) -> str:
        """``record`` as one line of JSON (an ``extra`` value that is not a JSON scalar as its ``str``)."""
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
        """``inner``'s line for ``record``, every credential in it masked."""
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


#: the error codes of a message that waits on an event (its funnel, an open breaker): its own lines are DEBUG
_WAITING_CODES = frozenset({"FUNNEL", "CIRCUIT_OPEN"})


class TransitionLog:
    """Engine transition listener: one line per committed state change, at INFO what an operator follows a message
    by: its final outcome (OK, FAILED, SKIPPED, CANCEL), a failed attempt to retry, a restart, a hold; at DEBUG its
    acceptance (NEW: the caller's answer and the store say it), its claim, and its waiting for a funnel or an open
    breaker. A message that runs once is one INFO line.

    It remembers each claimed message's attempt number until its outcome, so an outcome line names the attempt
    that ran, as the store's transition row does (a failed count after a failure counts that failure already).
    """

    _REMEMBERED = 100_000

    def __init__(self) -> None:
        self._attempts: dict[int, int] = {}

    def __call__(self, previous: MessageState | None, message: StoredMessage) -> None:
        """Log the change of ``message`` from ``previous`` (None: just stored) to its current state, in one line."""
        target = message.state.value
        if previous is None:  # accepted: one line for its outcome is enough at INFO
            level = logging.DEBUG
        elif target == "PROCESSING":
            if len(self._attempts) >= self._REMEMBERED:  # outcomes lost to another writer: forget the oldest
                for key in list(self._attempts)[: self._REMEMBERED // 10]:
                    del self._attempts[key]
            self._attempts[message.id] = message.failed_count + 1
            level = logging.DEBUG
        elif target == "POSTPONED" and message.last_error_code in _WAITING_CODES:
            # a message waiting for its funnel or parked on an open breaker: the breaker's own lines and the
            # parking's summary say it once per system, not once per message
            level = logging.DEBUG
        else:
            level = logging.INFO
        if not transitions_log.isEnabledFor(level):
            if previous is not None and previous.value == "PROCESSING":
                self._attempts.pop(message.id, None)
            return
        source = "-" if previous is None else previous.value
        route = f"{message.service}/{message.operation}"
        if previous is not None and source == "PROCESSING":
            attempt = self._attempts.pop(message.id, None)
            if attempt is None:  # claimed before this listener was attached: as the store counts it
                failing = target in ("PARTLY_FAILED", "FAILED")
                attempt = max(message.failed_count, 1) if failing else message.failed_count + 1
        else:
            attempt = message.failed_count + 1
        code = message.last_error_code if target not in ("OK", "PROCESSING", "NEW", "WAITING_FOR_CHILDREN") else None
        error_text = message.last_error_text if code else None
        text = f"message {message.id} {route} {source} -> {target} attempt {attempt}"
        if code:
            text += f" error {code}"
            if error_text:
                shown = " ".join(error_text.split())  # one line, whatever the error's text holds
                shown = shown if len(shown) <= _LOG_ERROR_TEXT else shown[:_LOG_ERROR_TEXT - 3] + "..."
                text += f" ({shown})"
        text += f" correlation {message.correlation_id}"
        transitions_log.log(level, text, extra={
            "message_id": message.id, "correlation_id": message.correlation_id, "route": route,
            "from_state": None if previous is None else source, "to_state": target, "attempt": attempt,
            "error_code": code, "error_text": error_text,
        })


#: the listener :func:`openroute.commands.run` attaches (one per process is enough)
log_transition = TransitionLog()


def log_action(action: str, message_id: int, previous: str, state: str, by: str) -> None:
    """One INFO line for an operator's action made outside a server (``openroute messages``, Spark):
    ``message 42 restarted by cli:ann@host (FAILED -> PARTLY_FAILED)``. A server's log shows the message's next
    state change when its repoll takes it."""
    actions_log.info("message %s %s by %s (%s -> %s)", message_id, action, by, previous, state,
                     extra={"message_id": message_id, "action": action, "by": by, "from_state": previous,
                            "to_state": state})


def ensure_action_log(stream: TextIO | None = None) -> None:
    """A command run outside a server (``openroute messages``, Spark) shows its :func:`log_action` lines on
    ``stream`` (default stderr) when logging is not configured otherwise."""
    if logging.getLogger().handlers or actions_log.handlers:
        return
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(logging.Formatter(TEXT_FORMAT))
    actions_log.addHandler(handler)
    actions_log.setLevel(logging.INFO)


class AttemptFailureLog(MessageInterceptor):
    """Engine-wide interceptor logging the traceback of an attempt's unexpected error (WARNING), at most once per
    message and error. Expected errors (business, validation, technical, remote systems' errors) print nothing
    here: the state change's line names their code and cause. The error goes on unchanged."""

    _REMEMBERED = 10_000

    def __init__(self) -> None:
        self._seen: dict[tuple[int, str], None] = {}

    async def around_delivery(self, context: InterceptionContext, call_next: CallNext) -> None:
        """Run the delivery; an unexpected error is logged with its traceback (once per message and error), then raised
        again unchanged."""
        try:
            await call_next()
        except MessageDroppedByInterceptor:
            raise
        except Exception as error:
            if not is_expected_error(error):
                self._log(context, error)
            raise

    def _log(self, context: InterceptionContext, error: Exception) -> None:
        message = context.message
        key = (message.id, f"{type(error).__qualname__}: {error}")
        if key in self._seen:
            return
        if len(self._seen) >= self._REMEMBERED:
            self._seen.clear()
        self._seen[key] = None
        route = f"{message.service}/{message.operation}"
        attempt = message.failed_count + 1
        failures_log.warning("message %s %s attempt %d failed: %s: %s", message.id, route, attempt,
                             type(error).__name__, error, exc_info=error,
                             extra={"message_id": message.id, "correlation_id": message.correlation_id,
                                    "route": route, "attempt": attempt})


class RepeatedErrors:
    """Tracebacks of unexpected errors that repeat, shown once per ``interval`` seconds per error.

    A node whose store lost a table fails every request the same way, and a traceback per request (some 40 lines
    each) drowned the log: 12,000 tracebacks in one benchmark run. The first failure of an error (its type and the
    line that raised it, whatever its text: a driver's text carries the statement's values) in ``interval`` is
    logged with its traceback; the next ones as one line with the error's type and first line of text and how long
    ago its traceback was logged. Safe from several threads."""

    def __init__(self, interval: float = 60.0, clock: Callable[[], float] = time.monotonic,
                 remembered: int = 1000) -> None:
        self.interval = interval
        self._clock = clock
        self._remembered = remembered
        self._shown: dict[tuple[Any, ...], float] = {}
        self._lock = threading.Lock()

    def log(self, logger: logging.Logger, message: str, *args: object, error: BaseException) -> None:
        """``logger.error(message % args)`` with ``error``'s traceback, or as one line when this error's traceback
        was logged less than ``interval`` seconds ago."""
        key = (logger.name, message, type(error), _raised_at(error))
        now = self._clock()
        with self._lock:
            shown = self._shown.get(key)
            if shown is None or now - shown >= self.interval:
                if len(self._shown) >= self._remembered:
                    self._shown.clear()
                self._shown[key] = now
                shown = None
        if shown is None:
            logger.error(message, *args, exc_info=error)
            return
        lines = str(error).strip().splitlines()
        logger.error(f"{message}: %s: %s (again: its traceback was logged %.0f s ago)", *args, type(error).__name__,
                     lines[0][:_LOG_ERROR_TEXT] if lines else "", now - shown)


def _raised_at(error: BaseException) -> tuple[str, int] | None:
    """(file, line) of the frame that raised ``error`` (the innermost of its traceback)."""
    frames = error.__traceback__
    if frames is None:
        return None
    while frames.tb_next is not None:
        frames = frames.tb_next
    return frames.tb_frame.f_code.co_filename, frames.tb_lineno


#: the server's one record of repeated failures (requests of the inbound, admin API and console; the engine's jobs and
#: hooks; the reads of /metrics)
repeated_errors = RepeatedErrors()
