"""External systems declared in openroute.toml (openroute/outbound/systems.py, ``[external_systems.NAME]``)."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest

from openroute import ConfigurationError, route
from openroute.config import load_config
from openroute.definitions.errors import DeploymentError
from openroute.outbound import systems


def test_a_system_is_declared_once_with_its_breaker_and_records(tmp_path: Path) -> None:
    path = tmp_path / "openroute.toml"
    documented = systems.__doc__.split("```toml\n")[1].split("```")[0]  # the module's own example
    path.write_text(documented + "\n[external_systems.LEGACY.breaker]\nenabled = false\n")
    hlr, legacy = load_config(path).external_system_list()
    assert (hlr.name, hlr.base_url, hlr.timeout, hlr.call_timeout) == ("HLR", "http://hlr.internal:8080/", 5.0,
                                                                      timedelta(seconds=10))
    assert hlr.breaker is not None and (hlr.breaker.window_size, hlr.breaker.minimum_calls) == (20, 10)
    assert hlr.breaker.open_wait == timedelta(seconds=20) and hlr.breaker.failure_rate_threshold == 50
    assert hlr.records.records("activateSim") and not hlr.records.records("lookup")
    assert hlr.headers == {"X-Client": "openroute"}
    assert legacy.breaker is None and not legacy.records.enabled


def test_every_bad_system_is_named_in_one_error(tmp_path: Path) -> None:
    path = tmp_path / "openroute.toml"
    path.write_text("""
[external_systems.A]
base_url = "ftp://a"

[external_systems.B.breaker]
minimum_calls = 200

[external_systems.C.records]
operations = "("

[external_systems.D]
unknown = 1
""")
    with pytest.raises(ConfigurationError) as raised:
        load_config(path)
    text = str(raised.value)
    assert "external_systems.D.unknown: unknown setting" in text
    path.write_text(path.read_text().replace("unknown = 1", ""))
    with pytest.raises(ConfigurationError) as raised:
        load_config(path)
    text = str(raised.value)
    assert "external_systems.A: external system A: base_url must be an absolute http(s) URL, got 'ftp://a'" in text
    assert "external_systems.B: breaker: minimum_calls (200) must not exceed window_size (100)" in text
    assert "external_systems.C: records: operations is not a regular expression" in text


def test_the_dsl_refuses_a_bad_system_name() -> None:
    with pytest.raises(DeploymentError, match="system must be a name of 1-100 characters, got ''"):
        route("crm", "op").ext_call("x", lambda exchange: None, system="")
