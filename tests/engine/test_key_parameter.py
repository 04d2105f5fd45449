"""How an external call takes its idempotency key, read from its signature (and remembered for plain functions)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from openroute.engine.exchange import _key_parameter


def _decorated(call: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(call)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return call(*args, **kwargs)

    return wrapper


def test_each_shape_of_call_is_told_apart() -> None:
    def no_key() -> None: ...
    def keyword(idempotency_key: str) -> None: ...
    def keyword_only(*, idempotency_key: str = "") -> None: ...
    def positional(key: str, timeout: float = 1.0) -> None: ...

    assert [_key_parameter(call) for call in (no_key, keyword, keyword_only, positional)] == [
        None, "keyword", "keyword", "positional"]


def test_closures_made_per_message_answer_as_their_first() -> None:
    def make(n: int) -> Callable[..., Any]:
        return lambda idempotency_key: n

    assert {_key_parameter(make(n)) for n in range(3)} == {"keyword"}
    assert _key_parameter(lambda: None) is None


def test_wrappers_sharing_one_code_answer_for_what_they_wrap() -> None:
    """functools.wraps gives every wrapper the same code: the remembered answer must not carry over."""
    def no_key() -> None: ...
    def keyword(idempotency_key: str) -> None: ...

    assert _key_parameter(_decorated(no_key)) is None
    assert _key_parameter(_decorated(keyword)) == "keyword"
    assert _key_parameter(_decorated(no_key)) is None


def test_partials_and_builtins() -> None:
    def keyword(idempotency_key: str, other: int) -> None: ...

    assert _key_parameter(functools.partial(keyword, other=1)) == "keyword"
    assert _key_parameter(len) == "positional"
