"""The retention of the jobs' output folders (openroute/spark/outputs.py): old plans and audit reports pruned."""

from __future__ import annotations

import os
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from openroute.spark.audit import audit
from openroute.spark.outputs import RETENTION_ENV, OutputKind, prune_outputs, retention_setting
from openroute.spark.reprocess import write_plan
from tests.spark.stores import reprocess_store

DAY = 86_400


def _output(folder: Path, kind: OutputKind, age_days: float) -> Path:
    """A folder that looks like a job's output of ``kind``, its marker file ``age_days`` old."""
    folder.mkdir(parents=True)
    if kind is OutputKind.PLAN:
        (folder / "plan").mkdir()
        marker = folder / "job.json"
    else:
        (folder / "report.html").write_text("<html></html>")
        marker = folder / "summary.json"
    marker.write_text("{}")
    stamp = time.time() - age_days * DAY
    os.utime(marker, (stamp, stamp))
    return folder


def test_only_old_folders_of_the_same_kind_are_pruned(tmp_path: Path) -> None:
    old_plan = _output(tmp_path / "reprocess-old", OutputKind.PLAN, 40)
    young_plan = _output(tmp_path / "reprocess-young", OutputKind.PLAN, 2)
    old_audit = _output(tmp_path / "audit-old", OutputKind.AUDIT, 40)
    stranger = tmp_path / "notes"
    stranger.mkdir()
    (stranger / "job.json").write_text("{}")  # a job.json without plan/ is not a plan folder
    os.utime(stranger / "job.json", (time.time() - 90 * DAY,) * 2)
    written = _output(tmp_path / "reprocess-new", OutputKind.PLAN, 50)  # the folder just written is never pruned

    assert prune_outputs(written, "30d", OutputKind.PLAN) == [old_plan]
    assert not old_plan.exists()
    assert young_plan.is_dir() and old_audit.is_dir() and stranger.is_dir() and written.is_dir()
    assert prune_outputs(written, None, OutputKind.AUDIT) == [], "no retention: everything is kept"
    assert prune_outputs(written, timedelta(days=30), OutputKind.AUDIT) == [old_audit]


def test_the_retention_comes_from_the_environment_and_bad_values_are_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert retention_setting(None) is None
    monkeypatch.setenv(RETENTION_ENV, "2w")
    assert retention_setting(None) == timedelta(weeks=2)
    assert retention_setting("1d") == timedelta(days=1), "the given value wins over the environment"
    with pytest.raises(ValueError, match="retention: not an age: 'soon'"):
        retention_setting("soon")
    monkeypatch.setenv(RETENTION_ENV, "0d")
    with pytest.raises(ValueError, match=f"{RETENTION_ENV}: not an age: '0d'"):
        prune_outputs(tmp_path, None, OutputKind.PLAN)


def test_a_dry_run_and_an_audit_prune_their_old_folders(spark: Any, sqlite_url: str, tmp_path: Path) -> None:
    reprocess_store(sqlite_url)
    old_plan = _output(tmp_path / "plans" / "reprocess-old", OutputKind.PLAN, 10)
    result = write_plan(spark, sqlite_url, tmp_path / "plans" / "reprocess-new", "new", retention="7d")
    assert result.pruned == [old_plan.resolve()] and not old_plan.exists()
    assert (tmp_path / "plans" / "reprocess-new" / "job.json").is_file()

    old_audit = _output(tmp_path / "audits" / "2024-05-01", OutputKind.AUDIT, 10)
    report = audit(spark, sqlite_url, partitions=2)
    report.write(tmp_path / "audits" / "2024-06-10", retention="7d")
    assert report.pruned == [old_audit.resolve()] and not old_audit.exists()
    with pytest.raises(ValueError, match="retention: not an age: 'weekly'"):
        report.write(tmp_path / "audits" / "again", retention="weekly")
    assert not (tmp_path / "audits" / "again").exists(), "a bad retention is refused before anything is written"
