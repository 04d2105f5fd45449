"""No password of a database URL reaches the output of the CLI, the server's start-up, the log or the Spark jobs."""

from __future__ import annotations

import io
import logging
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from openroute.persistence import mask_secrets, masked_url

from openroute.logs import configure_logging

PLANTED = "Pl4ntedS3cret"
#: a PostgreSQL server that is not there (port 1 refuses), with a password that must never be printed
UNREACHABLE = f"postgresql+psycopg://ops:{PLANTED}@127.0.0.1:1/openroute"
#: a URL SQLAlchemy cannot parse (the port is not a number): its text must be masked all the same
MALFORMED = f"postgresql+psycopg://ops:{PLANTED}@127.0.0.1:notaport/openroute"


def test_masked_url_hides_the_password_of_urls_and_of_text_that_is_no_url() -> None:
    assert masked_url(UNREACHABLE) == "postgresql+psycopg://ops:***@127.0.0.1:1/openroute"
    assert PLANTED not in masked_url(MALFORMED)
    assert masked_url("sqlite:///openroute.db") == "sqlite:///openroute.db"
    text = f"connect {UNREACHABLE} failed; dsn host=db password={PLANTED} user=ops; jdbc:postgresql://u:{PLANTED}@h/d"
    masked = mask_secrets(text)
    assert PLANTED not in masked
    assert "host=db" in masked and "user=ops" in masked and "127.0.0.1:1/openroute" in masked


def _openroute(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "openroute", *args], capture_output=True, text=True, timeout=120,
                          cwd=cwd, stdin=subprocess.DEVNULL)


@pytest.mark.parametrize("url", [UNREACHABLE, MALFORMED], ids=["unreachable", "malformed"])
@pytest.mark.parametrize("command", [
    ["messages", "list", "--database-url"],
    ["messages", "show", "1", "--database-url"],
    ["messages", "cancel", "1", "--yes", "--database-url"],
    ["db", "upgrade", "--database-url"],
], ids=["messages-list", "messages-show", "messages-cancel", "db-upgrade"])
def test_cli_errors_never_print_the_database_password(command: list[str], url: str, tmp_path: Path) -> None:
    result = _openroute(*command, url, cwd=tmp_path)
    assert result.returncode != 0
    output = result.stdout + result.stderr
    assert PLANTED not in output, output
    assert "ops:***@" in output or "openroute" in output  # the error still names the store


@pytest.mark.parametrize("url", [UNREACHABLE, MALFORMED], ids=["unreachable", "malformed"])
def test_server_start_up_failure_never_prints_the_database_password(url: str, tmp_path: Path) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    result = _openroute("run", "--port", str(port), "--database-url", url, "--log-level", "DEBUG", cwd=tmp_path)
    assert result.returncode in (2, 4), result.stderr
    output = result.stdout + result.stderr
    assert PLANTED not in output, output
    assert "***" in output, output


def test_the_log_masks_credentials_in_messages_and_tracebacks() -> None:
    stream = io.StringIO()
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    try:
        for fmt in ("text", "json"):
            configure_logging("INFO", fmt, stream)
            try:
                raise RuntimeError(f"cannot reach {UNREACHABLE}")
            except RuntimeError:
                logging.getLogger("openroute.test").exception("store %s down", UNREACHABLE)
    finally:
        for handler in list(root.handlers):
            root.removeHandler(handler)
        for handler in handlers:
            root.addHandler(handler)
        root.setLevel(level)
    text = stream.getvalue()
    assert "store postgresql+psycopg://ops:***@127.0.0.1:1/openroute down" in text
    assert PLANTED not in text


def test_spark_setup_errors_and_report_settings_mask_the_password() -> None:
    pytest.importorskip("pyspark")
    from openroute.spark.session import SparkSetupError, first_line, jdbc_source

    for url in (f"mysql://ops:{PLANTED}@db/x", f"sqlite://ops:{PLANTED}@/", f"no url ops:{PLANTED}@x"):
        with pytest.raises(SparkSetupError) as raised:
            jdbc_source(url)
        assert PLANTED not in str(raised.value), str(raised.value)
    assert PLANTED not in first_line(RuntimeError(f"JDBC failed for jdbc:postgresql://ops:{PLANTED}@db/x"))
