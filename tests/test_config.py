"""openroute/config.py: one TOML file, OPENROUTE_... environment over it, command-line overrides over both."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import pytest

from openroute.config import ServerConfig, load_config, read_legacy_auth_config
from openroute.definitions.errors import ConfigurationError
from openroute.engine import EngineSettings
from openroute.inbound import AdminAuth, SourceSystemAuth


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    for name in list(os.environ):
        if name.startswith("OPENROUTE_"):
            monkeypatch.delenv(name)


def write(tmp_path: Path, text: str, name: str = "openroute.toml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def problems(path: Path | None = None, overrides: dict | None = None, **kwargs: object) -> list[str]:
    with pytest.raises(ConfigurationError) as caught:
        load_config(path, overrides, **kwargs)  # type: ignore[arg-type]
    lines = str(caught.value).splitlines()
    return [line.strip() for line in lines[1:]] or lines


def test_defaults_without_a_file() -> None:
    config = load_config()
    assert config.database_url == "sqlite:///openroute.db"
    assert config.routes is None and config.port == 8080 and config.migrate is False
    assert (config.log.level, config.log.format, config.log.access) == ("INFO", "text", False)
    settings = config.engine.settings()
    assert isinstance(settings, EngineSettings)
    assert settings.concurrency == EngineSettings().concurrency
    assert config.auth.build() == (None, None)


def test_the_whole_file_is_read_and_built(tmp_path: Path) -> None:
    secret = write(tmp_path, "s3cret\n", "crm.secret")
    path = write(tmp_path, f"""
database_url = "sqlite:///{tmp_path}/x.db"
routes = "myapp:app"
port = 9000
migrate = true
[log]
level = "debug"
format = "json"
access = true
[engine]
node_id = "node-a"
concurrency = 4
processing_lease = "2m"
repoll_interval = 5
postpone_interval = "1.5s"
heartbeat_interval = "PT1M"
[engine.default_retry]
max_attempts = 5
interval = "500ms"
[inbound]
max_body_bytes = 2048
[auth.source_systems.CRM]
basic = {{ username = "crm", password_file = "{secret}" }}
[auth.source_systems.ERP]
api_key = "0123456789abcdef"
[[auth.admins]]
username = "ops"
password = "pw"
roles = ["admin", "viewer"]
[confirmations]
interval = "30s"
[confirmations.systems.CRM]
http = "http://127.0.0.1:9/confirm"
headers = {{ X-Token = "t" }}
""")
    config = load_config(path)
    assert config.routes == "myapp:app" and config.port == 9000 and config.migrate is True
    assert (config.log.level, config.log.format, config.log.access) == ("DEBUG", "json", True)
    settings = config.engine.settings()
    assert settings.node_id == "node-a" and settings.concurrency == 4
    assert settings.processing_lease == timedelta(minutes=2)
    assert settings.repoll_interval == timedelta(seconds=5)
    assert settings.postpone_interval == timedelta(seconds=1.5)
    assert settings.heartbeat_interval == timedelta(minutes=1)
    assert settings.default_retry_policy.max_attempts == 5
    assert settings.default_retry_policy.interval == timedelta(milliseconds=500)
    assert config.inbound.settings().max_body_bytes == 2048
    assert config.auth.source_systems["CRM"].basic is not None
    assert config.auth.source_systems["CRM"].basic.password == "s3cret"  # the file's trailing newline is dropped
    inbound, admin = config.auth.build()
    assert isinstance(inbound, SourceSystemAuth) and inbound.systems == frozenset({"CRM", "ERP"})
    assert isinstance(admin, AdminAuth)
    assert config.confirmations.interval == timedelta(seconds=30)
    callback = config.confirmations.callback()
    assert type(callback).__name__ == "DelegateConfirmationCallback"


def test_environment_over_file_and_command_line_over_both(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write(tmp_path, 'database_url = "sqlite:///file.db"\nport = 1000\n'
                           '[engine]\nconcurrency = 2\nqueue_size = 7\n')
    monkeypatch.setenv("OPENROUTE_DATABASE_URL", "sqlite:///env.db")
    monkeypatch.setenv("OPENROUTE_PORT", "2000")
    monkeypatch.setenv("OPENROUTE_ENGINE__CONCURRENCY", "3")
    monkeypatch.setenv("OPENROUTE_BILLING_URL", "http://other.use/")  # other OPENROUTE_ variables are not settings
    monkeypatch.setenv("OPENROUTE_MESSAGING_INCOMING_ORDERS_CONNECTOR", "memory")
    config = load_config(path, {"port": 3000, "host": None})
    assert config.database_url == "sqlite:///env.db"
    assert config.port == 3000
    assert config.host == "127.0.0.1"
    assert (config.engine.concurrency, config.engine.queue_size) == (3, 7)  # nested keys merge, not replace


def test_secrets_from_a_named_environment_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPS_PASSWORD", "from-env")
    config = load_config(None, {"auth": {"admins": [{"username": "ops", "password_env": "OPS_PASSWORD"}]}})
    assert config.auth.admins[0].password == "from-env"


def test_database_password_from_a_file_or_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    secret = write(tmp_path, "p@ss\n", "db.secret")
    config = load_config(None, {"database_url": "postgresql+psycopg://app@db/openroute",
                                "database_password_file": str(secret)})
    assert config.resolved_database_url() == "postgresql+psycopg://app:p%40ss@db/openroute"
    monkeypatch.setenv("DB_PW", "x")
    config = load_config(None, {"database_url": "postgresql+psycopg://app@db/o", "database_password_env": "DB_PW"})
    assert config.resolved_database_url() == "postgresql+psycopg://app:x@db/o"
    with pytest.raises(ConfigurationError, match="database_password_file: cannot read"):
        load_config(None, {"database_password_file": str(tmp_path / "none")}).resolved_database_url()
    with pytest.raises(ConfigurationError, match="'NOPE', which is not set"):
        load_config(None, {"database_password_env": "NOPE"}).resolved_database_url()


def test_the_store_part_alone_reads_the_database_keys_and_ignores_the_rest(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from openroute.config import load_database_config

    path = write(tmp_path, 'database_url = "postgresql+psycopg://app@db/o"\ndatabase_password_env = "DB_PW"\n'
                           '[[auth.admins]]\nusername = "ops"\npassword_env = "UNSET_ON_THIS_MACHINE"\n'
                           '[engine]\nconcurrency = -1\n[nonsense]\nx = 1\n')
    monkeypatch.setenv("DB_PW", "x")
    assert load_database_config(path).resolved_database_url() == "postgresql+psycopg://app:x@db/o"
    with pytest.raises(ConfigurationError):
        load_config(path)  # the server needs all of it
    monkeypatch.setenv("OPENROUTE_DATABASE_URL", "sqlite:///env.db")
    monkeypatch.setenv("OPENROUTE_ENGINE__CONCURRENCY", "not a number")  # not the store's: ignored
    assert load_database_config(path, {"database_url": None}).database_url == "sqlite:///env.db"
    assert load_database_config(path, {"database_url": "sqlite:///flag.db"}).database_url == "sqlite:///flag.db"
    both = write(tmp_path, 'database_password_env = "A"\ndatabase_password_file = "b"\n', "both.toml")
    with pytest.raises(ConfigurationError, match="give one of database_password_file, database_password_env"):
        load_database_config(both)
    with pytest.raises(ConfigurationError, match="is not valid TOML"):
        load_database_config(write(tmp_path, "[engine\n", "broken.toml"))


def test_messaging_keys_sit_in_the_same_file(tmp_path: Path) -> None:
    path = write(tmp_path, '[openroute.messaging.incoming.orders]\nconnector = "memory"\n'
                           '[mp.messaging.outgoing.out]\nconnector = "amqp"\n[engine]\nconcurrency = 2\n')
    config = load_config(path)
    assert config.messaging_config() == {"openroute.messaging.incoming.orders.connector": "memory",
                                         "mp.messaging.outgoing.out.connector": "amqp"}
    from openroute.messaging.config import MessagingConfig

    for messaging in (MessagingConfig(config.messaging_config()), MessagingConfig(files=[path])):
        assert messaging.channel("incoming", "orders").connector == "memory"
        assert messaging.channel("outgoing", "out").connector == "amqp"


def test_every_bad_key_is_reported_at_once_with_its_value(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write(tmp_path, """
routes = "no-colon"
colour = "blue"
[engine]
concurency = 3
queue_size = 0
processing_lease = "soon"
repoll_interval = -1
[engine.default_retry]
max_attempts = 0
jitter = 1.5
interval = "10m"
max_interval = "1m"
[log]
level = "loud"
format = "xml"
access = "sometimes"
[inbound]
max_depth = 1
[openroute.other]
x = 1
""")
    monkeypatch.setenv("OPENROUTE_PORT", "abc")
    found = problems(path)
    expected = [
        "port: Input should be a valid integer, unable to parse string as an integer, got 'abc' "
        "(environment: OPENROUTE_PORT)",
        "colour: unknown setting",
        "engine.concurency: unknown setting",
        "engine.queue_size: Input should be greater than or equal to 1, got 0 "
        "(environment: OPENROUTE_ENGINE__QUEUE_SIZE)",
        "log.level: Input should be 'DEBUG', 'INFO', 'WARNING', 'ERROR' or 'CRITICAL', got 'LOUD' "
        "(environment: OPENROUTE_LOG__LEVEL)",
        "log.format: Input should be 'text' or 'json', got 'xml' (environment: OPENROUTE_LOG__FORMAT)",
        "log.access: Input should be a valid boolean, unable to interpret input, got 'sometimes' "
        "(environment: OPENROUTE_LOG__ACCESS)",
        "inbound.max_depth: Input should be greater than or equal to 2, got 1 "
        "(environment: OPENROUTE_INBOUND__MAX_DEPTH)",
        "engine.default_retry.max_attempts: Input should be greater than or equal to 1, got 0 "
        "(environment: OPENROUTE_ENGINE__DEFAULT_RETRY__MAX_ATTEMPTS)",
        "engine.default_retry.jitter: Input should be less than 1, got 1.5 "
        "(environment: OPENROUTE_ENGINE__DEFAULT_RETRY__JITTER)",
    ]
    for line in expected:
        assert line in found, (line, found)
    joined = "\n".join(found)
    assert "engine.processing_lease:" in joined and "'soon'" in joined
    assert "(top level): only [openroute.messaging...] tables may sit under [openroute]" not in joined  # not reached
    with pytest.raises(ConfigurationError) as caught:
        load_config(path)
    assert str(caught.value).splitlines()[0] == f"configuration ({path}) has {len(found)} problems:"


def test_model_level_problems_name_the_section(tmp_path: Path) -> None:
    path = write(tmp_path, """
[engine.default_retry]
interval = "10m"
max_interval = "1m"
[auth.source_systems.CRM]
basic = { username = "crm" }
[auth.source_systems.ERP]
api_key = "a"
api_key_env = "B"
[auth.source_systems.MES]
[[auth.admins]]
username = "ops"
password_file = "/nonexistent/secret"
[[auth.admins]]
username = "dev"
password_env = "OPENROUTE_TEST_UNSET_VARIABLE"
[confirmations.systems.CRM]
soap = "http://x"
http = "http://y"
[confirmations.systems.ERP]
soap = "http://x"
headers = { A = "b" }
""")
    found = problems(path)
    assert "engine.default_retry: max_interval 0:01:00 is shorter than interval 0:10:00" in found
    assert "auth.source_systems.CRM.basic: give password, password_file or password_env" in found
    assert "auth.source_systems.ERP: give one of api_key, api_key_env, not several" in found
    assert "auth.source_systems.MES: give basic and/or api_key (or api_key_file / api_key_env)" in found
    assert ("auth.admins.0: cannot read password_file '/nonexistent/secret': No such file or directory" in found)
    assert ("auth.admins.1: password_env names the environment variable 'OPENROUTE_TEST_UNSET_VARIABLE', "
            "which is not set") in found
    assert "confirmations.systems.CRM: give exactly one of soap = url or http = url" in found
    assert "confirmations.systems.ERP: headers apply to http targets only" in found


def test_bad_files_are_one_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match=r"cannot read configuration file .*missing.toml: No such file"):
        load_config(tmp_path / "missing.toml")
    with pytest.raises(ConfigurationError, match="is not valid TOML"):
        load_config(write(tmp_path, "port = = 1"))
    assert problems(None, {"routes": "nocolon"}) == ["(top level): routes must be 'module:attribute', got 'nocolon'"]
    assert problems(None, {"database_password_file": "/a", "database_password_env": "B"}) == [
        "(top level): give one of database_password_file, database_password_env, not both"]
    assert problems(None, {"engine": {"repoll_interval": True}}) == [
        "engine.repoll_interval: a duration must be seconds or a string like '30s', got True"]


def test_values_checked_across_fields_and_by_the_built_objects() -> None:
    assert problems(None, {"engine": {"repoll_interval": -1}}) == [
        "engine: repoll_interval must be positive or 'off', got -1 day, 23:59:59"]
    assert problems(None, {"auth": {"source_systems": {"ERP": {"api_key": "short"}}}}) == [
        "auth: source system 'ERP': an API key needs at least 16 characters"]
    assert problems(None, {"confirmations": {"systems": {"CRM": {"http": "ftp://x"}}}}) == [
        "confirmations.systems.CRM: url must be an absolute http(s) URL, got 'ftp://x'"]


def test_repoll_can_be_switched_off() -> None:
    assert load_config(None, {"engine": {"repoll_interval": "off"}}).engine.settings().repoll_interval is None


def test_the_legacy_auth_config_json_with_confirmations_works(tmp_path: Path) -> None:
    legacy = tmp_path / "auth.json"
    legacy.write_text(json.dumps({
        "sourceSystems": {"CRM": {"basic": {"username": "crm", "password": "pw"}},
                          "ERP": {"apiKey": "0123456789abcdef"}},
        "admins": [{"username": "ops", "password": "pw", "roles": ["admin"]}],
        "confirmations": {"CRM": {"soap": "http://127.0.0.1:9/ws"}},
    }), encoding="utf-8")
    config = load_config(None, auth_config=legacy)
    inbound, admin = config.auth.build()
    assert inbound.systems == frozenset({"CRM", "ERP"}) and admin is not None
    assert list(config.confirmations.systems) == ["CRM"]
    assert config.confirmations.systems["CRM"].soap == "http://127.0.0.1:9/ws"


def test_bad_legacy_auth_config_files(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"sourceSystems": {}, "colour": 1}', encoding="utf-8")
    with pytest.raises(ConfigurationError, match=r"unknown keys \['colour'\]"):
        read_legacy_auth_config(bad)
    bad.write_text("[]", encoding="utf-8")
    with pytest.raises(ConfigurationError, match="must hold a JSON object"):
        read_legacy_auth_config(bad)
    bad.write_text("{", encoding="utf-8")
    with pytest.raises(ConfigurationError, match="cannot read --auth-config"):
        read_legacy_auth_config(bad)
    bad.write_text('{"confirmations": {"CRM": {"ftp": "x"}}}', encoding="utf-8")
    assert problems(None, auth_config=bad) == [
        "confirmations.systems.CRM.ftp: unknown setting",
        "confirmations.systems.CRM: give exactly one of soap = url or http = url",
    ] or "confirmations.systems.CRM.ftp: unknown setting" in problems(None, auth_config=bad)


def test_the_model_is_frozen() -> None:
    config = load_config()
    with pytest.raises(Exception, match="frozen"):
        config.port = 1  # type: ignore[misc]
    assert isinstance(config, ServerConfig)


def test_the_documented_example_loads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The TOML example of docs/configuration.md, with its secrets present, is a valid configuration."""
    text = (Path(__file__).resolve().parents[1] / "docs" / "configuration.md").read_text(encoding="utf-8")
    example = text.split("```toml\n", 1)[1].split("```", 1)[0]
    secret = write(tmp_path, "crm-secret\n", "crm")
    path = write(tmp_path, example.replace("/run/secrets/crm", str(secret)))
    monkeypatch.setenv("ERP_API_KEY", "0123456789abcdef-erp")
    monkeypatch.setenv("OPENROUTE_OPS_PASSWORD", "ops-secret")
    monkeypatch.setenv("OPENROUTE_DB_PASSWORD", "db secret")
    config = load_config(path)
    assert config.routes == "myapp:app" and config.log.format == "json"
    assert config.engine.settings().default_retry_policy.max_attempts == 5
    assert config.auth.source_systems["CRM"].basic.password == "crm-secret"  # type: ignore[union-attr]
    assert config.auth.source_systems["ERP"].api_key == "0123456789abcdef-erp"
    assert config.auth.admins[0].password == "ops-secret"
    assert set(config.confirmations.systems) == {"CRM", "ERP"}
    from sqlalchemy.engine import make_url

    assert make_url(config.resolved_database_url()).password == "db secret"  # the URL round-trips the secret
    assert config.messaging_config() == {"openroute.messaging.incoming.orders.connector": "memory"}
    assert config.inbound.request_deadline == timedelta(seconds=30)
    assert config.admin.allowed_origins == ["https://ops.example"] and config.admin.metrics_auth
    _, admin = config.auth.build()
    assert (admin.limiter.max_failures, admin.limiter.max_failures_per_address, admin.limiter.window) == (10, 50, 60)


def test_security_settings_are_checked_at_start() -> None:
    assert problems(None, {"admin": {"allowed_origins": ["ops.example"]}}) == [
        "admin: allowed_origins: 'ops.example' is not an origin like https://ops.example:8443"]
    assert problems(None, {"admin": {"metrics_auth": True}}) == [
        "(top level): admin.metrics_auth needs admin users ([[auth.admins]]): /metrics would refuse everyone"]
    assert problems(None, {"inbound": {"request_deadline": 0}}) == [
        "inbound: request_deadline must be positive, got 0:00:00"]
    assert problems(None, {"auth": {"max_failed_logins": 0}})
    assert problems(None, {"server": {"forwarded_allow_ips": ["10.0.0.0/8", "proxy.example"]}}) == [
        "server: forwarded_allow_ips: 'proxy.example' is not an IP address, a network (10.0.0.0/8) or \"*\""]
    assert problems(None, {"inbound": {"max_header_bytes": 100}}) == [
        "inbound.max_header_bytes: Input should be greater than or equal to 1024, got 100 "
        "(environment: OPENROUTE_INBOUND__MAX_HEADER_BYTES)"]
    default = load_config()
    assert default.server.forwarded_allow_ips == [] and default.secret_names == []  # no proxy is trusted
    assert (default.inbound.max_header_bytes, default.inbound.max_headers) == (65536, 100)
    limits = load_config(None, {"inbound": {"max_header_bytes": 8192, "max_headers": 20}}).inbound.header_limits()
    assert (limits.max_bytes, limits.max_headers) == (8192, 20)


def test_retention_section_builds_the_policy_of_the_scheduled_job(tmp_path: Path) -> None:
    from openroute.persistence import MessageState

    assert ServerConfig().retention.policy() is None  # no keep times: nothing is deleted, no job runs
    config = load_config(write(tmp_path, """
[retention]
keep = { OK = "30d", failed = "180d" }
batch_size = 500
interval = "10m"
"""))
    policy = config.retention.policy()
    assert policy.keep == {MessageState.OK: timedelta(days=30), MessageState.FAILED: timedelta(days=180)}
    assert (policy.batch_size, policy.interval, policy.max_batches) == (500, timedelta(minutes=10), 100)


@pytest.mark.parametrize(("text", "expected"), [
    ('keep = { NEW = "1d" }', "NEW is not final"),
    ('keep = { DONE = "1d" }', "unknown state 'DONE'"),
    ('keep = { OK = "soon" }', "retention.keep.OK"),
    ('keep = { OK = "1d" }\nbatch_size = 0', "retention.batch_size"),
    ('keep = { OK = "1d" }\nsize = 3', "retention.size"),
])
def test_bad_retention_settings_are_refused_at_start(tmp_path: Path, text: str, expected: str) -> None:
    found = problems(write(tmp_path, f"[retention]\n{text}\n"))
    assert any(expected in line for line in found), found
