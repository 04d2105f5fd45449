"""Retention of the jobs' output folders: old reprocessing plans and audit reports pruned beside a new one.

Each dry run writes a plan folder (``job.json`` + ``plan/``) and each audit a report folder (``summary.json`` +
``report.html``); run daily they pile up. With a retention (``--retention 30d`` or ``$OPENROUTE_SPARK_RETENTION``),
a job that has written its folder deletes the folders of the same kind beside it (same parent folder) whose
marker file (``job.json``, ``summary.json``) is older than the retention. Only folders holding both markers of
that kind are touched; the folder just written never is::

    from openroute.spark.outputs import OutputKind, prune_outputs

    removed = prune_outputs(Path("audits/2024-06-10"), "30d", OutputKind.AUDIT)
"""

from __future__ import annotations

import os
import shutil
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from pathlib import Path

from openroute.spark._ages import parse_age

#: environment variable giving the retention when the command line gives none (``30d``, ``12h``...)
RETENTION_ENV = "OPENROUTE_SPARK_RETENTION"


class OutputKind(StrEnum):
    """What a job writes: a reprocessing plan or an audit report."""

    PLAN = "plan"
    AUDIT = "audit"


#: the files or folders that make a folder an output of each kind (the first one's age counts)
MARKERS: dict[OutputKind, tuple[str, str]] = {
    OutputKind.PLAN: ("job.json", "plan"),
    OutputKind.AUDIT: ("summary.json", "report.html"),
}


def retention_setting(given: str | timedelta | None) -> timedelta | None:
    """The retention: ``given``, else ``$OPENROUTE_SPARK_RETENTION``, else None (keep everything).

    Raises ``ValueError`` naming the value for anything but a positive age like ``30d``, ``12h``, ``2w``."""
    value = given if given is not None else (os.environ.get(RETENTION_ENV) or None)
    if value is None:
        return None
    age = value if isinstance(value, timedelta) else parse_age(value)
    if age is None or age <= timedelta(0):
        source = "retention" if given is not None else RETENTION_ENV
        raise ValueError(f"{source}: not an age: {value!r} (use a positive number and s, m, h, d or w, e.g. 30d)")
    return age


def prune_outputs(
    written: str | os.PathLike[str],
    retention: str | timedelta | None,
    kind: OutputKind,
    *,
    now: datetime | None = None,
) -> list[Path]:
    """Delete the ``kind`` output folders beside ``written`` older than ``retention``; return them, sorted.

    Nothing is deleted when ``retention`` is None (and ``$OPENROUTE_SPARK_RETENTION`` unset). Raises
    ``ValueError`` for a bad retention.
    """
    keep = retention_setting(retention)
    if keep is None:
        return []
    folder = Path(written).resolve()
    cutoff = (now or datetime.now(UTC)) - keep
    marker, other = MARKERS[kind]
    removed: list[Path] = []
    for sibling in sorted(folder.parent.iterdir()):
        stamp = sibling / marker
        if sibling == folder or not sibling.is_dir() or not stamp.is_file() or not (sibling / other).exists():
            continue
        if datetime.fromtimestamp(stamp.stat().st_mtime, UTC) < cutoff:
            shutil.rmtree(sibling)
            removed.append(sibling)
    return removed


def pruned_line(pruned: list[Path], kind: OutputKind) -> str | None:
    """The line the commands print for the folders the retention deleted (None when it deleted none)."""
    if not pruned:
        return None
    return f"retention: deleted {len(pruned)} older {kind.value} folder(s): {', '.join(p.name for p in pruned)}"
