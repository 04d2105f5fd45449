"""``Message``: a payload with typed metadata and at-most-once ``ack`` / ``nack`` callbacks."""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Awaitable, Callable, Generator, Iterable, Iterator
from typing import Any, Generic, TypeVar, cast

T = TypeVar("T")
P = TypeVar("P")
M = TypeVar("M")

AckCallback = Callable[[], "Awaitable[None] | None"]
NackCallback = Callable[[BaseException], "Awaitable[None] | None"]


class Acknowledgment(enum.Enum):
    """When the incoming message of a decorated function is acknowledged (MicroProfile Reactive Messaging)."""

    NONE = "none"
    """Never acknowledged by the framework."""
    PRE_PROCESSING = "pre-processing"
    """Acknowledged before the function is called."""
    POST_PROCESSING = "post-processing"
    """Acknowledged when the function has finished (or, for processors, when the produced message is acked)."""
    MANUAL = "manual"
    """The function calls ``await message.ack()`` / ``nack()`` itself."""


class Done:
    """An already-settled awaitable (avoids a task per acknowledgment when callbacks are synchronous)."""

    __slots__ = ("error",)

    def __init__(self, error: BaseException | None = None) -> None:
        self.error = error

    def __await__(self) -> Generator[Any, None, None]:
        if self.error is not None:
            raise self.error
        return None
        yield  # pragma: no cover - makes this a generator


DONE = Done()


def settle(result: Awaitable[None] | None) -> Awaitable[None]:
    """Turn a callback result into an awaitable that can be awaited any number of times."""
    if result is None:
        return DONE
    if isinstance(result, Done | asyncio.Future):
        return result
    return asyncio.ensure_future(result)


class Metadata:
    """Immutable set of typed metadata objects, at most one per class (a SmallRye-like extension of the spec)."""

    __slots__ = ("_items",)

    def __init__(self, *items: object) -> None:
        entries: dict[type, object] = {}
        for item in items:
            if item is None:
                raise TypeError("metadata items must not be None")
            entries[type(item)] = item
        self._items = entries

    @classmethod
    def of(cls, *items: object) -> Metadata:
        """Metadata holding ``items`` (a later item replaces an earlier one of the same class)."""
        return cls(*items)

    @classmethod
    def from_(cls, value: Metadata | Iterable[object] | None) -> Metadata:
        """Coerce ``None``, an iterable of objects, or a ``Metadata`` into ``Metadata``."""
        if value is None:
            return EMPTY_METADATA
        if isinstance(value, Metadata):
            return value
        return cls(*value)

    def with_(self, item: object) -> Metadata:
        """A copy with ``item`` added, replacing any item of the same class."""
        if item is None:
            raise TypeError("metadata items must not be None")
        copy = Metadata()
        copy._items = {**self._items, type(item): item}
        return copy

    def without(self, kind: type) -> Metadata:
        """A copy without the item of class ``kind``."""
        copy = Metadata()
        copy._items = {k: v for k, v in self._items.items() if k is not kind}
        return copy

    def get(self, kind: type[M]) -> M | None:
        """The item of class ``kind`` (or of a subclass of it), ``None`` when absent."""
        item = self._items.get(kind)
        if item is None:
            for key, value in self._items.items():
                if issubclass(key, kind):
                    return cast(M, value)
        return cast("M | None", item)

    def __contains__(self, kind: object) -> bool:
        return isinstance(kind, type) and self.get(kind) is not None

    def __iter__(self) -> Iterator[object]:
        return iter(self._items.values())

    def __len__(self) -> int:
        return len(self._items)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Metadata) and self._items == other._items

    def __hash__(self) -> int:
        return hash(tuple(self._items))

    def __repr__(self) -> str:
        return f"Metadata({', '.join(map(repr, self._items.values()))})"


EMPTY_METADATA = Metadata()


class _AckState:
    """Shared by a message and the copies that keep its callbacks: the first outcome wins."""

    __slots__ = ("ack_fn", "nack_fn", "outcome")

    def __init__(self, ack_fn: AckCallback | None, nack_fn: NackCallback | None) -> None:
        self.ack_fn = ack_fn
        self.nack_fn = nack_fn
        self.outcome: Awaitable[None] | None = None


class Message(Generic[T]):
    """A payload, immutable typed metadata, and asynchronous ``ack()`` / ``nack(reason)``.

    ``ack`` and ``nack`` start the callback at once and return an awaitable of its completion; the
    callbacks run at most once for a message and the copies made by ``with_payload`` /
    ``with_metadata`` (they share the outcome); the first outcome wins and later calls return it.
    """

    __slots__ = ("_metadata", "_payload", "_state")

    def __init__(
        self,
        payload: T,
        metadata: Metadata | Iterable[object] | None = None,
        *,
        ack: AckCallback | None = None,
        nack: NackCallback | None = None,
    ) -> None:
        if payload is None:
            raise TypeError("a message payload must not be None")
        self._payload = payload
        # most messages have none (the processing channel's, one a message): no call for them
        self._metadata = EMPTY_METADATA if metadata is None else Metadata.from_(metadata)
        self._state = _AckState(ack, nack)

    @classmethod
    def of(cls, payload: P, *metadata: object, ack: AckCallback | None = None,
           nack: NackCallback | None = None) -> Message[P]:
        """Shorthand: ``Message.of(payload, meta1, meta2, ack=..., nack=...)``."""
        return cast("Message[P]", cls(cast(T, payload), Metadata(*metadata), ack=ack, nack=nack))

    @property
    def payload(self) -> T:
        """The payload (never ``None``)."""
        return self._payload

    @property
    def metadata(self) -> Metadata:
        """The typed metadata."""
        return self._metadata

    def get_metadata(self, kind: type[M]) -> M | None:
        """The metadata item of class ``kind``, or ``None``."""
        return self._metadata.get(kind)

    def _copy(self, payload: Any, metadata: Metadata, state: _AckState) -> Message[Any]:
        copy: Message[Any] = Message.__new__(Message)
        copy._payload = payload
        copy._metadata = metadata
        copy._state = state
        return copy

    def with_payload(self, payload: P) -> Message[P]:
        """Same metadata and acknowledgment, new payload."""
        if payload is None:
            raise TypeError("a message payload must not be None")
        return self._copy(payload, self._metadata, self._state)

    def with_metadata(self, metadata: Metadata | Iterable[object]) -> Message[T]:
        """Same payload and acknowledgment, metadata replaced."""
        return self._copy(self._payload, Metadata.from_(metadata), self._state)

    def add_metadata(self, item: object) -> Message[T]:
        """Same payload and acknowledgment, ``item`` added to (or replacing its class in) the metadata."""
        return self._copy(self._payload, self._metadata.with_(item), self._state)

    def with_ack(self, ack: AckCallback | None) -> Message[T]:
        """A copy whose ``ack()`` runs ``ack`` (its own at-most-once outcome); ``nack`` is kept."""
        return self._copy(self._payload, self._metadata, _AckState(ack, self._state.nack_fn))

    def with_nack(self, nack: NackCallback | None) -> Message[T]:
        """A copy whose ``nack()`` runs ``nack`` (its own at-most-once outcome); ``ack`` is kept."""
        return self._copy(self._payload, self._metadata, _AckState(self._state.ack_fn, nack))

    @property
    def ack_callback(self) -> AckCallback | None:
        """The acknowledgment callback (for connectors and chaining)."""
        return self._state.ack_fn

    @property
    def nack_callback(self) -> NackCallback | None:
        """The negative-acknowledgment callback."""
        return self._state.nack_fn

    @property
    def settled(self) -> bool:
        """True once ``ack()`` or ``nack()`` has been called on this message (or a copy sharing its outcome)."""
        return self._state.outcome is not None

    def ack(self) -> Awaitable[None]:
        """Acknowledge: run the ack callback (once) and return an awaitable of its completion."""
        state = self._state
        if state.outcome is None:
            fn = state.ack_fn
            try:
                state.outcome = DONE if fn is None else settle(fn())
            except Exception as error:  # the caller sees the callback's failure when awaiting
                state.outcome = Done(error)
        return state.outcome

    def nack(self, reason: BaseException) -> Awaitable[None]:
        """Negative acknowledgment with ``reason`` (an exception; ``None`` raises ``ValueError``)."""
        if reason is None:
            raise ValueError("nack needs a reason (an exception), not None")
        if not isinstance(reason, BaseException):
            raise TypeError(f"nack reason must be an exception, not {type(reason).__name__}")
        state = self._state
        if state.outcome is None:
            fn = state.nack_fn
            try:
                state.outcome = DONE if fn is None else settle(fn(reason))
            except Exception as error:
                state.outcome = Done(error)
        return state.outcome

    def __repr__(self) -> str:
        return f"Message({self._payload!r}, {self._metadata!r})"
