"""Texts stored in clear before the masking (persistence/stored_texts.py): migration 0021 masks them on each real
database, ``openroute db mask-secrets`` again for a name added later; a viewer's search then no longer finds the
secret. Bad input to the command: one line and an exit code."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from openroute.persistence import MessageState, MessageStore, NewMessage, message_table
from openroute.persistence.column_types import Json
from openroute.persistence.messages import insert_values
from openroute.persistence.models import (
    call_record_table,
    confirmation_table,
    entity_call_table,
    external_call_table,
    message_transition_table,
    outbox_table,
)
from openroute.persistence.stored_texts import STORED_TEXTS, mask_stored_texts

from openroute.admin import parse_filters, search_messages
from openroute.cli import main
from tests.persistence.conftest import START

ROOT = Path(__file__).resolve().parents[2]

#: what a version before the masking stored, one secret (and one harmless text) per column
CLEAR = {
    "error": "HTTPError: 401 from https://ops:hunter2@billing.example/v1?apikey=k3y-SECRET&q=1",
    "trace": 'Traceback (most recent call last):\n  ...\nValueError: login {"password": "hunter2"} refused',
    "request": "POST https://billing.example/v1\nAuthorization: Bearer t0k3n-SECRET\n\n<password>4711</password>",
    "response": '{"accessToken": "t0k3n-SECRET", "status": "ok"}',
    "event": json.dumps({"messageId": 1, "errorText": "down: https://ops:hunter2@billing.example/v1"}),
}
HARMLESS = "HTTPError: 503 from https://billing.example/v1 (nothing hidden)"


def _plant(connection: sa.Connection, secret: dict[str, str], harmless: str) -> list[int]:
    """Two messages (one FAILED with secrets in every column of STORED_TEXTS, one FAILED with ``harmless`` texts)
    and their rows in every table that keeps a text; returns the messages' ids."""
    ids = []
    for n, (error, trace) in enumerate([(secret["error"], secret["trace"]), (harmless, harmless)]):
        new = NewMessage(service="billing", operation="charge", payload="{}", content_type="application/json",
                         correlation_id=f"c-{n}", source_system="crm", receive_ts=START)
        values = insert_values(new)
        values.update(state=MessageState.FAILED, last_error_code="HTTP", last_error_text=error, last_error_trace=trace,
                      business_errors=[{"code": "DENIED", "text": error if n == 0 else harmless}])
        ids.append(connection.execute(sa.insert(message_table).values(values)).inserted_primary_key[0])
    for message_id, (error, trace) in zip(ids, [(secret["error"], secret["trace"]), (harmless, harmless)],
                                          strict=True):
        connection.execute(sa.insert(message_transition_table).values(
            message_id=message_id, from_state="PROCESSING", to_state="FAILED", at=START, error_code="HTTP",
            error_text=error, error_trace=trace))
        connection.execute(sa.insert(external_call_table).values(
            message_id=message_id, call_key="charge", status="FAILED", attempts=1, last_error=error,
            result={"accessToken": "kept-as-it-came"}, created_at=START, updated_at=START))
        connection.execute(sa.insert(entity_call_table).values(
            entity_type="customer", object_id=f"C-{message_id}", call_key="charge", status="FAILED", attempts=1,
            last_error=error, created_at=START, updated_at=START))
        secret_side = error != harmless
        connection.execute(sa.insert(call_record_table).values(
            message_id=message_id, system="billing", call_key="charge", started_at=START, duration_ms=5,
            outcome="ERROR", request=secret["request"] if secret_side else harmless,
            response=secret["response"] if secret_side else harmless, error=error))
        connection.execute(sa.insert(confirmation_table).values(
            message_id=message_id, source_system="crm", outcome_state="FAILED", status="PENDING", attempts=1,
            last_error=error, created_at=START, updated_at=START))
        connection.execute(sa.insert(outbox_table).values(
            event_id=f"e-{message_id}", channel="events", message_id=message_id,
            payload=secret["event"] if secret_side else json.dumps({"errorText": harmless}),
            created_at=START, next_attempt_at=START, last_error=error))
    return ids


def _texts(connection: sa.Connection) -> dict[str, list[Any]]:
    """Every column of STORED_TEXTS, its values in key order."""
    found = {}
    for text in STORED_TEXTS:
        table = sa.table(text.table, sa.column(text.key), sa.column(text.column, Json if text.json else sa.Text()))
        found[text.name] = list(connection.execute(
            sa.select(table.c[text.column]).order_by(table.c[text.key])).scalars())
    return found


def _search(store: MessageStore, error_text: str) -> list[int]:
    """The ids a viewer's ``?error_text=`` search finds."""
    with store.engine.connect() as connection:
        return [m.id for m in search_messages(connection, parse_filters({"error_text": error_text})).items]


def test_upgrade_to_0021_masks_every_text_stored_in_clear(database_url: str) -> None:
    store = MessageStore(database_url)
    try:
        store.upgrade("0020")
        with store.engine.begin() as connection:
            ids = _plant(connection, CLEAR, HARMLESS)
        assert _search(store, "hunter2") == [ids[0]]  # the oracle before: the hidden password confirmed
        with store.engine.connect() as connection:
            before = _texts(connection)

        store.upgrade()

        assert store.current_revision() == MessageStore.head_revision()
        with store.engine.connect() as connection:
            after = _texts(connection)
            results = list(connection.execute(sa.select(external_call_table.c.result)).scalars())
        for name, values in after.items():
            assert values[1] == before[name][1], f"{name}: a text without secrets was changed"
            assert values[0] != before[name][0], f"{name}: still in clear"
            shown = json.dumps(values[0])
            for secret in ("hunter2", "k3y-SECRET", "t0k3n-SECRET", "4711"):
                assert secret not in shown, f"{name}: {secret} in {shown}"
        assert after["message.last_error_text"][0] == (
            "HTTPError: 401 from https://ops:***@billing.example/v1?apikey=***&q=1")
        assert after["message.business_errors"][0] == [{"code": "DENIED", "text": after[
            "message.last_error_text"][0]}]
        assert json.loads(after["outbox.payload"][0]) == {"messageId": 1,
                                                          "errorText": "down: https://ops:***@billing.example/v1"}
        assert results == [{"accessToken": "kept-as-it-came"}] * 2  # a call's result is the route's, kept
        assert _search(store, "hunter2") == [] and _search(store, "k3y") == []  # no oracle any more
        assert _search(store, "apikey=***") == [ids[0]] and _search(store, "nothing hidden") == [ids[1]]
    finally:
        store.dispose()


def test_masking_reads_in_batches_and_writes_only_the_texts_that_change(store: MessageStore) -> None:
    with store.engine.begin() as connection:
        for n in range(7):
            values = insert_values(NewMessage(service="s", operation="o", payload="{}",
                                              content_type="application/json", correlation_id=f"b-{n}",
                                              source_system="crm", receive_ts=START))
            values.update(state=MessageState.FAILED, last_error_code="E",
                          last_error_text=f"token={n}abc" if n % 3 == 0 else f"plain {n}")
            connection.execute(sa.insert(message_table).values(values))
    statements: list[tuple[str, int]] = []

    def seen(conn: Any, cursor: Any, statement: str, parameters: Any, context: Any, executemany: bool) -> None:
        kind = statement.split()[0]
        if kind in ("SELECT", "UPDATE"):  # SQLite's driver-level BEGIN left out
            statements.append((kind, len(parameters) if executemany else 1))

    sa.event.listen(store.engine, "before_cursor_execute", seen)
    try:
        with store.engine.connect() as connection:
            commits = []
            changed = mask_stored_texts(connection, STORED_TEXTS[:1], batch_size=3,
                                        after_batch=lambda: (commits.append(1), connection.commit()))
    finally:
        sa.event.remove(store.engine, "before_cursor_execute", seen)
    assert changed == {"message.last_error_text": 3}
    assert [kind for kind, _ in statements] == ["SELECT", "UPDATE", "SELECT", "UPDATE", "SELECT", "UPDATE", "SELECT"]
    assert [count for kind, count in statements if kind == "UPDATE"] == [1, 1, 1]  # rows 0, 3, 6 only
    assert len(commits) == 3
    with store.engine.connect() as connection:
        texts = list(connection.execute(sa.select(message_table.c.last_error_text).order_by(message_table.c.id))
                     .scalars())
    assert texts == ["token=***", "plain 1", "plain 2", "token=***", "plain 4", "plain 5", "token=***"]
    with pytest.raises(ValueError, match="batch_size must be >= 1, got 0"):
        mask_stored_texts(store.engine.connect(), batch_size=0)


def _mask_secrets_command(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """``openroute db mask-secrets`` in its own process (the configuration's secret names stay in that process)."""
    return subprocess.run([sys.executable, "-m", "openroute", "db", "mask-secrets", *args], cwd=cwd,
                          capture_output=True, text=True, env={"PATH": "", "PYTHONPATH": str(ROOT)}, timeout=120)


def test_mask_secrets_masks_a_name_added_to_the_configuration(store: MessageStore, database_url: str,
                                                              tmp_path: Path) -> None:
    """A text masked with the names known when it was stored still shows ``iban=...`` (no built-in name) until
    the operator adds ``iban`` to ``secret_names`` and runs the command with the server's configuration."""
    added = {**CLEAR, "error": "refused: iban=CZ6508000000192000145399 for customer=7",
             "trace": "Traceback: iban=CZ6508000000192000145399", "request": "<iban>CZ6508000000192000145399</iban>",
             "response": '{"iban": "CZ6508000000192000145399"}',
             "event": json.dumps({"errorText": "iban=CZ6508000000192000145399"})}
    with store.engine.begin() as connection:
        ids = _plant(connection, added, HARMLESS)
    assert _search(store, "CZ65080") == [ids[0]]
    (tmp_path / "openroute.toml").write_text(textwrap.dedent(f'''
        database_url = "{database_url}"
        secret_names = ["iban"]
    '''), encoding="utf-8")

    done = _mask_secrets_command(["--config", "openroute.toml"], tmp_path)

    assert done.returncode == 0, done.stderr
    assert done.stdout.count("\n") == 1 and "13 stored texts masked (message.last_error_text 1," in done.stdout
    assert "CZ65080" not in done.stdout + done.stderr
    assert _search(store, "CZ65080") == [] and _search(store, "iban=***") == [ids[0]]
    with store.engine.connect() as connection:
        assert "CZ65080" not in json.dumps(_texts(connection))
    again = _mask_secrets_command(["--config", "openroute.toml", "--secret-name", "customer"], tmp_path)
    # the error text in 8 columns: the message's and its business error, the transition's, both calls', the call
    # record's, the confirmation's and the outbox's
    assert again.returncode == 0 and "8 stored texts masked" in again.stdout, again.stdout + again.stderr
    assert _search(store, "customer=7") == [] and _search(store, "iban=*** for customer=***") == [ids[0]]


def test_mask_secrets_reports_bad_input_in_one_line(sqlite_url: str, tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["db", "mask-secrets", "--secrets-file", "x"])
    assert exited.value.code == 2
    assert "error: unrecognized arguments: --secrets-file x" in capsys.readouterr().err
    unreachable = "postgresql+psycopg://ops:hunter2@127.0.0.1:1/openroute"
    assert main(["db", "mask-secrets", "--database-url", unreachable]) == 4
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(
        "openroute db mask-secrets: postgresql+psycopg://ops:***@127.0.0.1:1/openroute: connection failed")
    assert main(["db", "mask-secrets", "--database-url", f"sqlite:///{tmp_path / 'none.db'}"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "there is no store file" in err and not (tmp_path / "none.db").exists()
    assert main(["db", "mask-secrets", "--database-url", "oracle://nobody@nowhere/x"]) == 2
    assert "unsupported database" in capsys.readouterr().err
    old = MessageStore(sqlite_url)
    old.upgrade("0020")
    old.dispose()
    assert main(["db", "mask-secrets", "--database-url", sqlite_url]) == 5
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "is at schema revision 0020, this openroute needs" in err
    (tmp_path / "bad.toml").write_text("secret_names = [", encoding="utf-8")
    assert main(["db", "mask-secrets", "--config", str(tmp_path / "bad.toml")]) == 2
    assert capsys.readouterr().err.startswith("openroute db mask-secrets: configuration")
