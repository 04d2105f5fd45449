"""A child message a split step creates: a definition value (the DSL's ``split`` builds them, the exchange stores
them), so it lives below the runtime; route authors import it from ``openroute``."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ChildMessage"]


@dataclass(frozen=True)
class ChildMessage:
    """One child message a split step creates (see :meth:`Exchange.split`).

    ``service`` and ``content_type`` default to the parent's; ``entity_type`` defaults to ``operation`` when
    the child has an ``object_id``; ``key`` names the child in its correlation id (default: its position).
    """

    payload: str
    operation: str
    service: str | None = None
    content_type: str | None = None
    object_id: str | None = None
    entity_type: str | None = None
    funnel_value: str | None = None
    key: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.payload, str):
            raise TypeError(f"a child payload must be text, got {type(self.payload).__name__}")
        if not isinstance(self.operation, str) or not self.operation:
            raise ValueError("a child message needs an operation")
