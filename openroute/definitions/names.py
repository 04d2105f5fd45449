"""Declared things found by their unique name (external systems, alert rules)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol, TypeVar

from openroute.definitions.errors import ConfigurationError

__all__ = ["Named", "by_unique_name"]


class Named(Protocol):
    """Anything declared under a name."""

    @property
    def name(self) -> str:
        """The unique name it is declared under."""


N = TypeVar("N", bound=Named)


def by_unique_name(items: Iterable[N], what: str) -> dict[str, N]:
    """``items`` by name; a name that comes twice is a :class:`ConfigurationError` ("``what`` NAME ... twice")."""
    found: dict[str, N] = {}
    for item in items:
        if item.name in found:
            raise ConfigurationError(f"{what.format(name=item.name)} twice")
        found[item.name] = item
    return found
