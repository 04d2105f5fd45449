"""The value types every section of the configuration shares: durations, the frozen section base, secrets."""

from __future__ import annotations

import os
import re
from datetime import timedelta
from pathlib import Path
from typing import Annotated, Any, ClassVar, Self

from pydantic import BaseModel, BeforeValidator, ConfigDict, model_validator

ENV_PREFIX = "OPENROUTE_"

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")


def _duration(value: Any) -> Any:
    """Seconds (int, float or numeric string) or a number with a unit (``500ms``, ``30s``, ``5m``, ``2h``, ``1d``);
    anything else is left to pydantic (a timedelta, ISO 8601 ``PT5M``)."""
    if isinstance(value, bool):
        raise ValueError("a duration must be seconds or a string like '30s'")
    if isinstance(value, int | float):
        return timedelta(seconds=value)
    if isinstance(value, str):
        match = _DURATION.match(value)
        if match:
            return timedelta(seconds=float(match.group(1)) * _UNITS[match.group(2) or "s"])
    return value


Duration = Annotated[timedelta, BeforeValidator(_duration)]


class Section(BaseModel):
    """A table of the configuration: unknown keys are errors, values are frozen."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    #: the section's secrets: each NAME may be given as NAME, NAME_file or NAME_env, and NAME holds it once validated
    secrets: ClassVar[tuple[str, ...]] = ()

    @model_validator(mode="after")
    def _read_secrets(self) -> Self:
        for name in self.secrets:
            object.__setattr__(self, name, read_secret(self, name))
        return self


class PasswordSection(Section):
    """A section with a password given inline, in ``password_file`` or in the variable ``password_env`` (one of
    them); once validated, ``password`` holds it (None when none is given)."""

    secrets = ("password",)

    password: str | None = None
    password_file: Path | None = None
    password_env: str | None = None


def read_secret(owner: Section, name: str) -> str | None:
    """The secret ``name`` of ``owner`` from exactly one of ``name``, ``name_file``, ``name_env`` (None if none)."""
    inline: str | None
    inline, file, env = (getattr(owner, name), getattr(owner, f"{name}_file"), getattr(owner, f"{name}_env"))
    given = [key for key, value in ((name, inline), (f"{name}_file", file), (f"{name}_env", env)) if value is not None]
    if len(given) > 1:
        raise ValueError(f"give one of {', '.join(given)}, not several")
    if file is not None:
        try:
            return Path(file).read_text(encoding="utf-8").rstrip("\r\n")
        except OSError as error:
            raise ValueError(f"cannot read {name}_file {str(file)!r}: {error.strerror or error}") from None
    if env is not None:
        if env not in os.environ:
            raise ValueError(f"{name}_env names the environment variable {env!r}, which is not set")
        return os.environ[env]
    return inline

