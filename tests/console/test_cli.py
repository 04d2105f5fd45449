"""``openroute messages list|show|restart|cancel`` on the store (both databases) and against a running server."""

from __future__ import annotations

import asyncio
import io
import json
import os
from collections.abc import Iterator
from typing import Any

import pytest
from openroute.persistence import MessageState, MessageStore

from openroute.cli import main
from openroute.engine import Engine, EngineSettings
from openroute.server import create_app
from tests._support.servers import serving
from tests.console.conftest import auth, populate, registry


class Tty(io.StringIO):
    """A terminal: stdout/stdin that say isatty()."""

    def isatty(self) -> bool:
        return True


@pytest.fixture
def ids(store: MessageStore) -> dict[str, int]:
    return asyncio.run(populate(store))


def _populated(url: str) -> dict[str, int]:
    """A new store at ``url`` with the messages of ``populate``, closed again (for a command run in a subprocess)."""
    store = MessageStore(url)
    store.create_schema()
    try:
        return asyncio.run(populate(store))
    finally:
        store.dispose()


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_list_with_filters_json_and_pages(store: MessageStore, ids: dict[str, int],
                                          capsys: pytest.CaptureFixture[str]) -> None:
    db = ("--database-url", store.url)
    code, out, _ = cli(capsys, "messages", "list", *db, "--state", "FAILED", "--json")
    assert code == 0
    body = json.loads(out)
    assert {m["id"] for m in body["items"]} == {ids["failed1"], ids["failed2"]} and body["total"] == 2
    code, out, _ = cli(capsys, "messages", "list", *db, "--source-system", "ERP", "--service", "billing", "--json")
    assert [m["id"] for m in json.loads(out)["items"]] == [ids["failed2"]]
    code, out, err = cli(capsys, "messages", "list", *db, "--limit", "4")  # a pipe: tab-separated lines
    lines = out.splitlines()
    assert code == 0 and len(lines) == 4 and all(len(line.split("\t")) == 10 for line in lines)
    assert "4 of 6 matching; next page: --cursor " in err
    cursor = err.rsplit("--cursor ", 1)[1].strip()
    code, out, _ = cli(capsys, "messages", "list", *db, "--limit", "4", "--cursor", cursor)
    rest = [int(line.split("\t")[0]) for line in out.splitlines()]
    assert sorted([int(line.split("\t")[0]) for line in lines] + rest) == sorted(ids.values())


def test_list_prints_an_aligned_table_on_a_terminal(store: MessageStore, ids: dict[str, int]) -> None:
    from openroute.cli import build_parser
    from openroute.console.cli import run

    out, err = Tty(), io.StringIO()
    args = build_parser().parse_args(["messages", "list", "--database-url", store.url, "--state", "OK"])
    assert run(args, out, err) == 0
    header, row = out.getvalue().splitlines()
    assert header.split() == ["id", "state", "service", "operation", "sourceSystem", "correlationId",
                              "failedCount", "lastErrorCode", "receivedAt", "nextAttempt"]
    assert row.split()[:3] == [str(ids["ok"]), "OK", "orders"] and header.index("state") == row.index("OK")


def test_show_prints_the_history(store: MessageStore, ids: dict[str, int], capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = cli(capsys, "messages", "show", str(ids["failed1"]), "--database-url", store.url)
    assert code == 0
    assert "REFUSED" in out and "state path:" in out and "billing.charge" in out and "children:" in out
    assert '"customer": {\n    "id": "A-1"' in out
    code, out, _ = cli(capsys, "messages", "show", str(ids["failed1"]), "--database-url", store.url, "--json")
    assert json.loads(out)["confirmation"]["lastError"] == "HTTP 500: down"
    code, _, err = cli(capsys, "messages", "show", "999999", "--database-url", store.url)
    assert code == 2 and "no message 999999" in err


def test_restart_and_cancel_by_id_go_through_the_engine(store: MessageStore, ids: dict[str, int],
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    db = ("--database-url", store.url)
    code, out, err = cli(capsys, "messages", "restart", str(ids["failed1"]), str(ids["ok"]), *db, "--yes")
    assert code == 1  # one was refused
    assert f"{ids['failed1']}\tdone\tPARTLY_FAILED" in out and f"{ids['ok']}\trefused\t" in out
    assert "1 done, 1 refused" in err
    assert store.get(ids["failed1"]).state is MessageState.PARTLY_FAILED
    assert store.transitions.of(ids["failed1"])[-1]["cause"].startswith("cli:")
    code, out, _ = cli(capsys, "messages", "cancel", str(ids["new"]), *db, "--yes", "--json")
    assert code == 0 and json.loads(out)["done"] == 1
    cancelled = store.get(ids["new"])
    assert cancelled.state is MessageState.CANCEL and cancelled.last_error_code == "CANCELLED"


def test_bulk_restart_by_filter_with_dry_run_and_confirmation(
    store: MessageStore, ids: dict[str, int], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    db = ("--database-url", store.url)
    code, out, _ = cli(capsys, "messages", "restart", "--service", "orders", *db, "--dry-run")
    assert code == 0 and "restart: 1 messages match (dry run, nothing done)" in out  # state defaults to FAILED
    assert store.get(ids["failed1"]).state is MessageState.FAILED
    code, _, err = cli(capsys, "messages", "restart", "--service", "orders", *db)  # stdin is not a terminal
    assert code == 2 and "needs --yes" in err and store.get(ids["failed1"]).state is MessageState.FAILED
    monkeypatch.setattr("sys.stdin", Tty("n\n"))
    code, _, err = cli(capsys, "messages", "restart", "--service", "orders", *db)
    assert code == 1 and "Restart 1 messages? [y/N]" in err and "nothing done" in err
    assert store.get(ids["failed1"]).state is MessageState.FAILED
    monkeypatch.setattr("sys.stdin", Tty("y\n"))
    code, out, _ = cli(capsys, "messages", "restart", "--state", "FAILED", *db)
    assert code == 0 and {store.get(ids[n]).state for n in ("failed1", "failed2")} == {MessageState.PARTLY_FAILED}
    code, out, _ = cli(capsys, "messages", "cancel", "--state", "NEW", "--source-system", "CRM", *db, "--yes")
    assert code == 0
    assert store.get(ids["new"]).state is MessageState.CANCEL and store.get(ids["new2"]).state is MessageState.NEW


@pytest.mark.parametrize(
    ("argv", "reason"),
    [
        (["list", "--state", "BROKEN"], "unknown state"),
        (["list", "--received-from", "yesterday"], "ISO 8601"),
        (["list", "--cursor", "!!"], "is not one this search returned"),
        (["list", "--limit", "0"], "limit must be in"),
        (["restart", "--yes"], "give message ids or filters"),
        (["restart", "1", "--service", "x"], "not both"),
        (["cancel", "--state", "NOPE", "--yes"], "unknown state"),
    ],
)
def test_bad_input_is_exit_2_and_nothing_done(store: MessageStore, ids: dict[str, int], argv: list[str], reason: str,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    before = store.count_by_state()
    code, _, err = cli(capsys, "messages", *argv, "--database-url", store.url)
    assert code == 2 and reason in err
    assert store.count_by_state() == before


@pytest.mark.parametrize("argv", [["show", str(2**63)], ["restart", "1", str(2**63), "--yes"],
                                  ["cancel", "0", "--yes"], ["list", "--received-from", "0001-01-01T00:00:00+05:00"]])
def test_ids_and_times_out_of_range_are_exit_2_without_a_traceback(
    store: MessageStore, ids: dict[str, int], argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    before = store.count_by_state()
    try:
        code, _, err = cli(capsys, "messages", *argv, "--database-url", store.url)
    except SystemExit as usage:  # argparse refuses the argument itself
        code, err = int(usage.code or 0), capsys.readouterr().err
    assert code == 2 and ("1..9223372036854775807" in err or "out of range in UTC" in err), err
    assert "Traceback" not in err and store.count_by_state() == before


def test_a_database_without_the_schema_is_refused(tmp_path: Any, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "empty.db").touch()
    code, _, err = cli(capsys, "messages", "list", "--database-url", f"sqlite:///{tmp_path / 'empty.db'}")
    assert code == 2 and "has no openroute schema" in err and "openroute db upgrade" in err


@pytest.mark.parametrize("argv", [["show", "failed1"], ["list"], ["list", "--json"]])
def test_a_reader_that_leaves_early_gets_no_traceback(sqlite_url: str, argv: list[str]) -> None:
    """Issue 42: ``openroute messages show 42 | head`` printed a BrokenPipeError traceback."""
    import subprocess
    import sys

    ids = _populated(sqlite_url)
    argv = [str(ids[arg]) if arg in ids else arg for arg in argv]
    read, write = os.pipe()
    os.close(read)  # the reader is gone before the command writes a line
    try:
        done = subprocess.run([sys.executable, "-m", "openroute", "messages", *argv, "--database-url", sqlite_url],
                              stdout=write, stderr=subprocess.PIPE, text=True, timeout=120)
    finally:
        os.close(write)
    assert (done.returncode, done.stderr) == (0, "")


def test_no_store_file_is_created_where_there_is_none(tmp_path: Any, monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 42: without --config and without an openroute.db here, the command used to create an empty one."""
    monkeypatch.chdir(tmp_path)
    for name in [name for name in os.environ if name.startswith("OPENROUTE_")]:
        monkeypatch.delenv(name)
    for argv in (["messages", "list"], ["messages", "show", "1"],
                 ["messages", "list", "--database-url", "sqlite:///elsewhere/store.db"]):
        code, out, err = cli(capsys, *argv)
        assert code == 2 and out == "", err
        assert "there is no store file" in err and "(nothing created)" in err and "openroute db upgrade" in err
    assert list(tmp_path.iterdir()) == []


def test_messages_with_the_servers_config_needs_none_of_its_other_secrets(
        sqlite_url: str, tmp_path: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 42: ``openroute messages --config openroute.toml`` reads the store's keys alone: the server's secrets
    (password_env of [auth], its other sections) need not be set, nor even valid, in the operator's shell."""
    store = MessageStore(sqlite_url)
    store.create_schema()
    store.dispose()
    config = tmp_path / "openroute.toml"
    config.write_text(f"""database_url = "{sqlite_url}"

[[auth.admins]]
username = "ops"
password_env = "OPS_PASSWORD_ONLY_THE_SERVER_HAS"

[auth.source_systems.CRM]
basic = {{ username = "crm", password_env = "CRM_PASSWORD_ONLY_THE_SERVER_HAS" }}

[engine]
concurrency = "whatever the server says"
""", encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    for name in [name for name in os.environ if name.startswith("OPENROUTE_")]:
        monkeypatch.delenv(name)
    code, out, err = cli(capsys, "messages", "list", "--config", str(config), "--json")
    assert code == 0, err
    assert json.loads(out)["items"] == []
    # the store's own keys are still checked, and a URL with a password is shown masked
    config.write_text('database_url = "postgresql+psycopg://app@127.0.0.1:1/o"\n'
                      'database_password_env = "DB_PASSWORD"\n[auth]\nadmins = "not even a list"\n', encoding="utf-8")
    code, _, err = cli(capsys, "messages", "list", "--config", str(config))
    assert code == 2 and "database_password_env names 'DB_PASSWORD', which is not set" in err
    monkeypatch.setenv("DB_PASSWORD", "s3cret-pw")
    code, _, err = cli(capsys, "messages", "list", "--config", str(config))
    assert code == 2 and "cannot open the store postgresql+psycopg://app:***@127.0.0.1:1/o" in err
    assert "s3cret-pw" not in err


@pytest.fixture
def server(store: MessageStore, ids: dict[str, int]) -> Iterator[str]:
    engine = Engine(store, registry(), EngineSettings(repoll_interval=None, node_id="served"))
    with serving(create_app(engine, admin_auth=auth(), manage_engine=False)) as url:
        yield url
    asyncio.run(engine.stop())


def test_against_a_server(server: str, store: MessageStore, ids: dict[str, int], capsys: pytest.CaptureFixture[str],
                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENROUTE_ADMIN_PASSWORD", "ops-secret")
    remote = ("--url", server, "--user", "ops")
    code, out, _ = cli(capsys, "messages", "list", *remote, "--state", "FAILED", "--json")
    assert code == 0 and {m["id"] for m in json.loads(out)["items"]} == {ids["failed1"], ids["failed2"]}
    code, out, _ = cli(capsys, "messages", "show", str(ids["failed2"]), *remote)
    assert code == 0 and "<charge>\n  <fail>2</fail>" in out
    code, out, _ = cli(capsys, "messages", "restart", "--state", "FAILED", *remote, "--dry-run")
    assert "restart: 2 messages match" in out
    code, out, _ = cli(capsys, "messages", "restart", "--state", "FAILED", *remote, "--yes")
    assert code == 0 and {store.get(ids[n]).state for n in ("failed1", "failed2")} == {MessageState.PARTLY_FAILED}
    assert store.transitions.of(ids["failed1"])[-1]["cause"] == "admin:ops"
    code, out, _ = cli(capsys, "messages", "cancel", str(ids["ok"]), *remote, "--yes")
    assert code == 1 and "refused" in out
    monkeypatch.setenv("OPENROUTE_ADMIN_PASSWORD", "wrong")
    code, _, err = cli(capsys, "messages", "list", *remote)
    assert code == 2 and "HTTP 401" in err
    monkeypatch.delenv("OPENROUTE_ADMIN_PASSWORD")
    monkeypatch.setattr("sys.stdin", io.StringIO(""))
    code, _, err = cli(capsys, "messages", "list", *remote)
    assert code == 2 and "OPENROUTE_ADMIN_PASSWORD" in err
    monkeypatch.delenv("OPENROUTE_ADMIN_USER", raising=False)
    code, _, err = cli(capsys, "messages", "list", "--url", server)
    assert code == 2 and "--url needs --user" in err


def test_messages_and_spark_read_the_database_url_of_the_config_file(
        sqlite_url: str, tmp_path: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """One resolution of settings for every command: a database_url only in openroute.toml is the store of
    ``openroute messages`` (as of ``run`` and ``db``); OPENROUTE_DATABASE_URL and the flag are above the file."""
    from openroute.cli import build_parser, resolve_settings

    ids = _populated(sqlite_url)
    (tmp_path / "etc").mkdir()
    config = tmp_path / "etc" / "openroute.toml"
    config.write_text(f'database_url = "{sqlite_url}"\n', encoding="utf-8")
    monkeypatch.chdir(tmp_path)  # no openroute.db where the command runs: only the file names the store
    for name in [name for name in os.environ if name.startswith("OPENROUTE_")]:
        monkeypatch.delenv(name)
    code, out, err = cli(capsys, "messages", "list", "--config", str(config), "--json")
    assert code == 0, err
    assert {row["id"] for row in json.loads(out)["items"]} == set(ids.values())

    spark = build_parser().parse_args(["spark", "archive", "--config", str(config), "--keep", "OK=1d", "--to", "x"])
    assert resolve_settings(spark) is None and spark.database_url == sqlite_url
    monkeypatch.setenv("OPENROUTE_DATABASE_URL", "sqlite:///from-env.db")
    spark = build_parser().parse_args(["spark", "archive", "--config", str(config), "--keep", "OK=1d", "--to", "x"])
    assert resolve_settings(spark) is None and spark.database_url == "sqlite:///from-env.db"

    monkeypatch.delenv("OPENROUTE_DATABASE_URL")
    config.write_text('database_url = 42\n', encoding="utf-8")
    code, _, err = cli(capsys, "messages", "list", "--config", str(config))
    assert code == 2 and "openroute messages: configuration" in err and "database_url" in err


def test_search_by_what_went_wrong_and_restart_the_matches(
    store: MessageStore, ids: dict[str, int], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture
) -> None:
    db = ("--database-url", store.url)
    code, out, _ = cli(capsys, "messages", "list", "--error-code", "REFUSED", "--error-code", "OTHER", *db, "--json")
    assert code == 0 and {m["id"] for m in json.loads(out)["items"]} == {ids["failed1"], ids["failed2"]}
    code, out, _ = cli(capsys, "messages", "list", "--payload-text", "<AMOUNT>10", "--error-text", "blocked", *db,
                       "--json")
    assert code == 0 and [m["id"] for m in json.loads(out)["items"]] == [ids["failed2"]]
    caplog.set_level("INFO", logger="openroute.actions")
    monkeypatch.setattr("sys.stdin", Tty("y\n"))
    code, out, err = cli(capsys, "messages", "restart", "--error-code", "REFUSED", "--service", "billing", *db)
    assert code == 0 and "Restart 1 messages? [y/N]" in err
    assert store.get(ids["failed2"]).state is MessageState.PARTLY_FAILED
    assert store.get(ids["failed1"]).state is MessageState.FAILED
    cause = store.transitions.of(ids["failed2"])[-1]["cause"]
    assert cause.startswith("cli:") and "@" in cause  # who and from which host
    assert f"message {ids['failed2']} restarted by {cause} (FAILED -> PARTLY_FAILED)" in caplog.messages


def test_show_prints_each_failures_text(store: MessageStore, ids: dict[str, int],
                                        capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = cli(capsys, "messages", "show", str(ids["failed1"]), "--database-url", store.url)
    assert code == 0 and "customer blocked" in out.split("state path:")[1]
