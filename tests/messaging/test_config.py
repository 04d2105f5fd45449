"""Configuration sources, precedence, aliases and attribute resolution."""

from __future__ import annotations

from pathlib import Path

import pytest

from openroute.messaging import ChannelConfig, ConfigError, DeploymentError, MessagingConfig


def test_channel_value_wins_over_connector_value() -> None:
    config = MessagingConfig({
        "openroute.messaging.incoming.orders.connector": "amqp",
        "openroute.messaging.incoming.orders.queue": "orders-q",
        "openroute.messaging.connector.amqp.url": "amqp://broker/",
        "openroute.messaging.connector.amqp.queue": "default-q",
    })
    channel = config.channel("incoming", "orders")
    assert channel.connector == "amqp"
    assert channel.get("queue") == "orders-q"
    assert channel.get("url") == "amqp://broker/"
    assert config.names("incoming") == {"orders"}


def test_mp_alias_and_quoted_channel_names() -> None:
    config = MessagingConfig({
        "mp.messaging.outgoing.prices.connector": "memory",
        'openroute.messaging.incoming."orders.v1".max_prefetch': "7",
    })
    assert config.channel("outgoing", "prices").connector == "memory"
    assert config.channel("incoming", "orders.v1").get_int("max-prefetch") == 7


def test_properties_and_toml_files(tmp_path: Path) -> None:
    properties = tmp_path / "messaging.properties"
    properties.write_text("# comment\nopenroute.messaging.incoming.a.connector = memory\n"
                          "openroute.messaging.incoming.a.concurrency: 3\n", encoding="utf-8")
    toml = tmp_path / "messaging.toml"
    toml.write_text('[openroute.messaging.incoming.a]\nconcurrency = 4\n'
                    '[openroute.messaging.outgoing."b.c"]\nconnector = "memory"\n', encoding="utf-8")
    config = MessagingConfig(files=[properties, toml])
    assert config.channel("incoming", "a").connector == "memory"
    assert config.channel("incoming", "a").get_int("concurrency") == 4  # later file wins
    assert config.channel("outgoing", "b.c").connector == "memory"


def test_precedence_files_then_environment_then_dict(tmp_path: Path) -> None:
    properties = tmp_path / "m.properties"
    properties.write_text("openroute.messaging.incoming.orders.queue=from-file\n"
                          "openroute.messaging.incoming.orders.durable=true\n"
                          "openroute.messaging.incoming.orders.prefetch=1\n", encoding="utf-8")
    environ = {"OPENROUTE_MESSAGING_INCOMING_ORDERS_QUEUE": "from-env",
               "OPENROUTE_MESSAGING_INCOMING_ORDERS_DURABLE": "false",
               "MP_MESSAGING_CONNECTOR_AMQP_URL": "amqp://env/",
               "UNRELATED": "x"}
    config = MessagingConfig({"openroute.messaging.incoming.orders.queue": "from-dict",
                              "openroute.messaging.incoming.orders.connector": "amqp"},
                             files=[properties], environ=environ)
    channel = config.channel("incoming", "orders")
    assert channel.get("queue") == "from-dict"
    assert channel.get_bool("durable") is False
    assert channel.get_int("prefetch") == 1
    assert channel.get("url") == "amqp://env/"


def test_environment_names_map_non_alphanumerics() -> None:
    config = MessagingConfig(environ={"OPENROUTE_MESSAGING_INCOMING_ORDERS_V1_DEAD_LETTER_EXCHANGE": "dlx"})
    assert config.channel("incoming", "orders-v1").get("dead-letter-exchange") == "dlx"


def test_global_keys() -> None:
    config = MessagingConfig({"openroute.messaging.emitter.default-buffer-size": 5})
    assert config.get_global("emitter.default-buffer-size") == 5
    assert MessagingConfig(environ={"OPENROUTE_MESSAGING_EMITTER_DEFAULT_BUFFER_SIZE": "9"}).get_global(
        "emitter.default-buffer-size") == "9"


def test_typed_getters_name_the_channel() -> None:
    channel = ChannelConfig("incoming", "orders", "amqp", {"prefetch": "many", "durable": "perhaps"})
    with pytest.raises(ConfigError, match=r"orders.*prefetch"):
        channel.get_int("prefetch")
    with pytest.raises(ConfigError, match="durable"):
        channel.get_bool("durable")
    with pytest.raises(DeploymentError, match="incoming channel 'orders': mandatory attribute 'queue'"):
        channel.require("queue")
    assert channel.get_int("missing", 3) == 3


def test_bad_sources_are_config_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not found"):
        MessagingConfig(files=[tmp_path / "absent.properties"])
    broken = tmp_path / "broken.properties"
    broken.write_text("just words\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"broken\.properties:1"):
        MessagingConfig(files=[broken])
    bad_toml = tmp_path / "bad.toml"
    bad_toml.write_text("[unclosed\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="invalid TOML"):
        MessagingConfig(files=[bad_toml])
    with pytest.raises(ConfigError, match="malformed"):
        MessagingConfig({"openroute.messaging.incoming.orders": "x"})


def test_connector_5_x_dotted_connector_name_matches_the_longest_registered_name() -> None:
    config = MessagingConfig({
        "openroute.messaging.incoming.orders.connector": "acme.kafka",
        "openroute.messaging.connector.acme.kafka.bootstrap.servers": "broker:9092",
        "openroute.messaging.connector.acme.region": "eu",
    }, environ={"OPENROUTE_MESSAGING_CONNECTOR_ACME_KAFKA_CLIENT_ID": "me"})
    channel = config.channel("incoming", "orders", connectors=["acme", "acme.kafka", "memory"])
    assert channel.connector == "acme.kafka"
    assert channel.get("bootstrap.servers") == "broker:9092"
    assert channel.get("client-id") == "me"
    assert channel.get("region") is None
    acme = config.connector_section("acme", ["acme", "acme.kafka"])
    assert acme == {"region": "eu"}
