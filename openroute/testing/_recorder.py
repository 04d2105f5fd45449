"""A fake external function: :class:`CallRecorder`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from openroute.definitions.errors import TechnicalError

__all__ = ["CallRecorder"]


@dataclass
class CallRecorder:
    """A fake external function: counts its calls, fails the first ``fail_first`` of them, then returns ``result``
    (or ``result(*args)`` when callable).

    ``error`` is what a failing call raises: an exception class or a callable making one (a fresh exception per
    call), or an exception instance; by default a :class:`~openroute.definitions.errors.TechnicalError` (code ``DOWN``),
    which makes the attempt PARTLY_FAILED and retried. Use it wherever a step takes a function of the exchange:
    ``.ext_call("billing", CallRecorder(fail_first=1))``; ``arguments`` keeps what each call received.
    """

    result: Any = field(default_factory=lambda: {"ok": True})
    fail_first: int = 0
    error: Callable[[], BaseException] | BaseException = field(
        default=lambda: TechnicalError("remote system unavailable", code="DOWN"))
    calls: int = 0
    arguments: list[Any] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not isinstance(self.fail_first, int) or isinstance(self.fail_first, bool) or self.fail_first < 0:
            raise ValueError(f"fail_first must be an integer >= 0, got {self.fail_first!r}")
        if not (isinstance(self.error, BaseException) or callable(self.error)):
            raise TypeError(f"error must be an exception, an exception class or a callable, got {self.error!r}")

    def __call__(self, *args: Any) -> Any:
        self.calls += 1
        self.arguments.append(args[0] if len(args) == 1 else args)
        if self.calls <= self.fail_first:
            raise self.error if isinstance(self.error, BaseException) else self.error()
        return self.result(*args) if callable(self.result) else self.result

    @property
    def failures(self) -> int:
        """How many calls failed (at most ``fail_first``)."""
        return min(self.calls, self.fail_first)
