"""Ages as the Spark commands write them: a whole number and a unit, ``90s``, ``30m``, ``12h``, ``7d``, ``2w``."""

from __future__ import annotations

import re
from datetime import timedelta

_AGE = re.compile(r"^\s*(\d+)\s*([smhdw])\s*$")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}


def parse_age(value: str) -> timedelta | None:
    """``value`` as a timedelta, or None when it is not an age (each caller says why in its own words)."""
    match = _AGE.match(value)
    if not match:
        return None
    return timedelta(**{_UNITS[match.group(2)]: int(match.group(1))})
