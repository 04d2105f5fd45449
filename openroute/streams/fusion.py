"""Fusion of consecutive synchronous 1:1 stages into one loop (a processor, or the drain loop of a source).

A fused plan is a tuple of ``(kind, fn)``: ``MAP`` and ``FILTER`` call the user function inline, ``OTHER``
calls a compiled function returning the item, or ``DROP``, or raising :class:`Stop` to end the stream.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from . import stages as st

DROP: Any = object()


class Stop(Exception):
    """Raised by a fused operation to end the stream early (take_while).

    Raised as a fresh instance each time: re-raising one shared instance would chain each raise's traceback onto
    it and keep every frame it passed through alive.
    """


def none_element_error(where: str) -> TypeError:
    """The error a stream fails with when ``None`` shows up as an element."""
    return TypeError(f"None is not a valid stream element ({where})")


# C901 over 12: one branch per fusable stage type
def compile_stage(stage: st.Stage) -> Callable[[Any], Any]:  # noqa: C901
    """One synchronous stage as a function ``item -> item | DROP`` (raising :class:`Stop` to end the stream)."""
    if isinstance(stage, st.Map):
        fn = stage.fn

        def map_op(item: Any) -> Any:
            result = fn(item)
            if result is None:
                raise none_element_error("map returned None")
            return result

        return map_op
    if isinstance(stage, st.Filter):
        predicate = stage.predicate
        return lambda item: item if predicate(item) else DROP
    if isinstance(stage, st.Peek):
        peek = stage.fn

        def peek_op(item: Any) -> Any:
            peek(item)
            return item

        return peek_op
    if isinstance(stage, st.TakeWhile):
        take = stage.predicate

        def take_while_op(item: Any) -> Any:
            if take(item):
                return item
            raise Stop

        return take_while_op
    if isinstance(stage, st.DropWhile):
        drop = stage.predicate
        dropping = True

        def drop_while_op(item: Any) -> Any:
            nonlocal dropping
            if dropping:
                if drop(item):
                    return DROP
                dropping = False
            return item

        return drop_while_op
    if isinstance(stage, st.Skip):
        remaining = stage.n

        def skip_op(item: Any) -> Any:
            nonlocal remaining
            if remaining > 0:
                remaining -= 1
                return DROP
            return item

        return skip_op
    if isinstance(stage, st.Distinct):
        seen: set[Any] = set()

        def distinct_op(item: Any) -> Any:
            if item in seen:
                return DROP
            seen.add(item)
            return item

        return distinct_op
    raise TypeError(f"not a fusable stage: {stage!r}")


FUSABLE = (st.Map, st.Filter, st.Peek, st.TakeWhile, st.DropWhile, st.Skip, st.Distinct)


MAP, FILTER, OTHER = 0, 1, 2


def plan_stage(stage: st.Stage) -> tuple[int, Callable[[Any], Any]]:
    """Map and filter run inline in the fused loop (no wrapper call); other stages as compiled functions."""
    if isinstance(stage, st.Map):
        return MAP, stage.fn
    if isinstance(stage, st.Filter):
        return FILTER, stage.predicate
    return OTHER, compile_stage(stage)


def plan(stages: Sequence[st.Stage]) -> tuple[tuple[int, Callable[[Any], Any]], ...]:
    """A fresh fused plan (fresh state for stateful stages) for a run of fusable stages."""
    return tuple(plan_stage(stage) for stage in stages)
