"""The pause points of the Spark jobs: nothing happens unless ``$OPENROUTE_SPARK_PAUSE_AT`` names the point."""

from __future__ import annotations

import pytest

from openroute.spark import _pause


def test_an_unnamed_point_returns_at_once_and_a_named_one_pauses_the_nth_time(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(_pause, "_seen", {})
    monkeypatch.delenv(_pause.PAUSE_AT_ENV, raising=False)
    _pause.pause_point("written")
    monkeypatch.setenv(_pause.PAUSE_AT_ENV, "deleted-batch:2")
    monkeypatch.setenv(_pause.PAUSE_SECONDS_ENV, "0")
    _pause.pause_point("written")
    _pause.pause_point("deleted-batch")
    assert capsys.readouterr().err == ""
    _pause.pause_point("deleted-batch")
    assert capsys.readouterr().err.startswith("openroute spark: paused at deleted-batch #2 (pid ")
    _pause.pause_point("deleted-batch")
    assert capsys.readouterr().err == "", "only the n-th time"


def test_a_malformed_pause_setting_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(_pause.PAUSE_AT_ENV, "written:twice")
    with pytest.raises(ValueError, match="OPENROUTE_SPARK_PAUSE_AT: 'written:twice' is not <point> or <point>:<n>"):
        _pause.pause_point("written")
