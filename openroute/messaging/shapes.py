"""Detects the shape of a decorated function and builds the code that calls it with the right acks.

Shapes come from ``inspect`` (async generator, generator, coroutine function, parameter count) and from type
annotations when present (``Message[...]``, ``PublisherBuilder``/``Publisher``/``AsyncIterator``,
``SubscriberBuilder``/``Subscriber``, ``ProcessorBuilder``/``Processor``).
"""

from __future__ import annotations

import collections.abc as cabc
import enum
import inspect
import logging
import typing
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import openroute.streams as rs
from openroute.messaging.errors import DefinitionError
from openroute.messaging.message import DONE, Acknowledgment, Message
from openroute.streams.protocol import Processor, Publisher, Subscriber

log = logging.getLogger("openroute.messaging")

A = Acknowledgment


class Shape(enum.Enum):
    """The function shapes the messaging layer knows."""

    CONSUMER = "consumer"                      # f(payload) / async f(payload) / async f(message)
    CONSUMER_SUBSCRIBER = "consumer-subscriber"  # f() -> Subscriber / SubscriberBuilder, called once
    PRODUCER_STREAM = "producer-stream"        # async generator / generator / f() -> Publisher(Builder)
    PRODUCER_VALUE = "producer-value"          # f() -> value / async f() -> value, called on demand
    PRODUCER_UNKNOWN = "producer-unknown"      # sync f() without annotation: called once at assembly to decide
    PROCESSOR_VALUE = "processor-value"        # payload -> payload, message -> message (sync or coroutine)
    PROCESSOR_FLATTEN = "processor-flatten"    # item -> publisher / async generator / generator, flattened in order
    PROCESSOR_STREAM = "processor-stream"      # stream -> stream, called once at assembly
    PROCESSOR_BUILDER = "processor-builder"    # f() -> Processor / ProcessorBuilder, called once at assembly


#: (default, supported) acknowledgment per shape and element kind (the spec's tables).
_ACKS: dict[tuple[Shape, bool], tuple[Acknowledgment, frozenset[Acknowledgment]]] = {
    (Shape.CONSUMER, False): (A.POST_PROCESSING, frozenset({A.NONE, A.PRE_PROCESSING, A.POST_PROCESSING})),
    (Shape.CONSUMER, True): (A.MANUAL, frozenset(A)),
    (Shape.CONSUMER_SUBSCRIBER, False): (A.POST_PROCESSING, frozenset({A.NONE, A.PRE_PROCESSING, A.POST_PROCESSING})),
    (Shape.CONSUMER_SUBSCRIBER, True): (A.MANUAL, frozenset(A)),
    (Shape.PROCESSOR_VALUE, False): (A.POST_PROCESSING, frozenset({A.NONE, A.PRE_PROCESSING, A.POST_PROCESSING})),
    (Shape.PROCESSOR_VALUE, True): (A.MANUAL, frozenset({A.NONE, A.PRE_PROCESSING, A.MANUAL})),
    (Shape.PROCESSOR_FLATTEN, False): (A.PRE_PROCESSING, frozenset({A.NONE, A.PRE_PROCESSING})),
    (Shape.PROCESSOR_FLATTEN, True): (A.MANUAL, frozenset({A.NONE, A.PRE_PROCESSING, A.MANUAL})),
    (Shape.PROCESSOR_STREAM, False): (A.PRE_PROCESSING, frozenset({A.NONE, A.PRE_PROCESSING})),
    (Shape.PROCESSOR_STREAM, True): (A.MANUAL, frozenset({A.NONE, A.PRE_PROCESSING, A.MANUAL})),
    (Shape.PROCESSOR_BUILDER, False): (A.PRE_PROCESSING, frozenset({A.NONE, A.PRE_PROCESSING})),
    (Shape.PROCESSOR_BUILDER, True): (A.MANUAL, frozenset({A.NONE, A.PRE_PROCESSING, A.MANUAL})),
}


@dataclass
class MethodSpec:
    """What the decorators recorded about one function."""

    fn: Callable[..., Any]
    incoming: str | None = None
    outgoing: str | None = None
    acknowledgment: Acknowledgment | None = None
    concurrency: int | None = None
    problems: list[str] = field(default_factory=list)

    @property
    def name(self) -> str:
        """The function's qualified name, for error messages."""
        return getattr(self.fn, "__qualname__", repr(self.fn))


@dataclass(frozen=True)
class Analysis:
    """The detected shape of a function and its acknowledgment strategy."""

    shape: Shape
    messages: bool
    acknowledgment: Acknowledgment | None
    is_async: bool = False
    param_kind: str = "none"  # "payload" | "message" | "stream" | "iterator" | "none"


# -- annotation helpers ----------------------------------------------------------------------------------

_STREAM_NAMES = {"PublisherBuilder", "Publisher", "AsyncIterator", "AsyncIterable", "AsyncGenerator"}
_SUBSCRIBER_NAMES = {"SubscriberBuilder", "Subscriber", "CompletionSubscriber"}
_PROCESSOR_NAMES = {"ProcessorBuilder", "Processor"}


def _head(annotation: Any) -> tuple[str, tuple[Any, ...]]:
    """Name of an annotation's outer type and its arguments (works on strings when hints cannot resolve)."""
    if isinstance(annotation, str):
        text = annotation.strip()
        name, _, rest = text.partition("[")
        inner = rest[:-1] if rest.endswith("]") else ""
        args = tuple(part.strip() for part in _split_args(inner)) if inner else ()
        return name.split(".")[-1], args
    origin = typing.get_origin(annotation) or annotation
    name = getattr(origin, "__name__", "") or ""
    if origin is Message or (isinstance(origin, type) and issubclass(origin, Message)):
        name = "Message"
    return name, typing.get_args(annotation)


def _split_args(text: str) -> list[str]:
    parts, depth, current = [], 0, ""
    for char in text:
        if char == "," and depth == 0:
            parts.append(current)
            current = ""
            continue
        depth += char == "["
        depth -= char == "]"
        current += char
    parts.append(current)
    return parts


def _kind(annotation: Any) -> str:
    if annotation is inspect.Parameter.empty or annotation is None:
        return "none"
    name, _ = _head(annotation)
    if name == "Message":
        return "message"
    if name in _PROCESSOR_NAMES:
        return "processor"
    if name in _SUBSCRIBER_NAMES:
        return "subscriber"
    if name in {"AsyncIterator", "AsyncIterable", "AsyncGenerator"}:
        return "iterator"
    if name in _STREAM_NAMES:
        return "stream"
    if name in {"None", "NoneType"}:
        return "nothing"
    return "value"


def _elements_are_messages(annotation: Any) -> bool:
    _, args = _head(annotation)
    return bool(args) and _kind(args[0]) == "message"


def _hints(fn: Callable[..., Any]) -> dict[str, Any]:
    try:
        return typing.get_type_hints(fn)
    except Exception:  # unresolvable forward references: fall back to the raw (string) annotations
        return dict(getattr(fn, "__annotations__", {}))


@dataclass(frozen=True)
class _Signature:
    """What :func:`analyze` reads from a function: its parameter, its return annotation, its kind of def."""

    where: str
    required: bool
    param_kind: str
    param_messages: bool
    returns: Any
    return_kind: str
    is_asyncgen: bool
    is_gen: bool
    is_coro: bool


def _read_signature(spec: MethodSpec) -> _Signature:
    fn = spec.fn
    where = f"function '{spec.name}'"
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError) as error:
        raise DefinitionError(f"{where}: cannot inspect its signature ({error})") from None
    required = [p for p in signature.parameters.values()
                if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty]
    hints = _hints(fn)
    returns = hints.get("return", inspect.Parameter.empty)
    if len(required) > 1:
        raise DefinitionError(f"{where}: takes {len(required)} parameters; a messaging function takes at most one")
    param_kind = "none"
    param_messages = False
    if required:
        annotation = hints.get(required[0].name, inspect.Parameter.empty)
        kind = _kind(annotation)
        param_kind = {"message": "message", "stream": "stream", "iterator": "iterator"}.get(kind, "payload")
        param_messages = param_kind == "message" or (
            param_kind in {"stream", "iterator"} and _elements_are_messages(annotation))
    return _Signature(where, bool(required), param_kind, param_messages, returns, _kind(returns),
                      inspect.isasyncgenfunction(fn), inspect.isgeneratorfunction(fn), inspect.iscoroutinefunction(fn))


def analyze(spec: MethodSpec) -> Analysis:
    """The shape of ``spec.fn``; ``DefinitionError`` naming the function and channel when it is unusable."""
    sig = _read_signature(spec)
    if spec.incoming and not spec.outgoing:
        return _consumer(spec, sig)
    if spec.outgoing and not spec.incoming:
        return _producer(spec, sig)
    return _processor(spec, sig)


def _consumer(spec: MethodSpec, sig: _Signature) -> Analysis:
    where, channel = sig.where, f"incoming channel '{spec.incoming}'"
    if not sig.required:
        if sig.return_kind not in {"subscriber", "none"}:
            raise DefinitionError(f"{where} ({channel}): a consumer without parameters must return a "
                                  "Subscriber or SubscriberBuilder")
        if sig.is_asyncgen or sig.is_gen or sig.is_coro:
            raise DefinitionError(f"{where} ({channel}): a consumer must take the payload or the Message")
        messages = sig.return_kind == "subscriber" and _elements_are_messages(sig.returns)
        return _with_ack(spec, Shape.CONSUMER_SUBSCRIBER, messages, sig.is_coro, sig.param_kind)
    if sig.is_asyncgen or sig.is_gen:
        raise DefinitionError(f"{where} ({channel}): an incoming-only function cannot produce "
                              "(generator); add @outgoing or return nothing")
    if sig.param_kind in {"stream", "iterator"}:
        raise DefinitionError(f"{where} ({channel}): an incoming-only function cannot take a stream; "
                              "return a Subscriber from a function without parameters instead")
    if sig.returns is not inspect.Parameter.empty and sig.return_kind != "nothing":
        raise DefinitionError(f"{where} ({channel}): an incoming-only function must not return a value "
                              f"(annotated {sig.returns!r}); add @outgoing to make it a processor")
    if sig.param_kind == "message" and not sig.is_coro:
        raise DefinitionError(f"{where} ({channel}): a function taking a Message must be a coroutine "
                              "(async def) so that it can await message.ack()")
    return _with_ack(spec, Shape.CONSUMER, sig.param_kind == "message", sig.is_coro, sig.param_kind)


def _producer(spec: MethodSpec, sig: _Signature) -> Analysis:
    where, channel = sig.where, f"outgoing channel '{spec.outgoing}'"
    if sig.required:
        raise DefinitionError(f"{where} ({channel}): an outgoing-only function takes no parameters")
    if spec.acknowledgment is not None:
        raise DefinitionError(f"{where} ({channel}): acknowledgment applies to incoming channels only")
    if spec.concurrency is not None:
        raise DefinitionError(f"{where} ({channel}): concurrency applies to incoming channels only")
    if sig.is_asyncgen or sig.is_gen or sig.return_kind in {"stream", "iterator"}:
        shape = Shape.PRODUCER_STREAM
    elif sig.is_coro or sig.return_kind in {"value", "message"}:
        shape = Shape.PRODUCER_VALUE
    elif sig.return_kind in {"subscriber", "processor", "nothing"}:
        raise DefinitionError(f"{where} ({channel}): a producer must return values, messages or a stream")
    else:
        shape = Shape.PRODUCER_UNKNOWN
    return Analysis(shape, False, None, sig.is_coro)


def _processor(spec: MethodSpec, sig: _Signature) -> Analysis:
    where, channel = sig.where, f"channels '{spec.incoming}' -> '{spec.outgoing}'"
    if not sig.required:
        if sig.return_kind not in {"processor", "none"} or sig.is_asyncgen or sig.is_gen or sig.is_coro:
            raise DefinitionError(f"{where} ({channel}): a processor without parameters must return a "
                                  "Processor or ProcessorBuilder")
        return _with_ack(spec, Shape.PROCESSOR_BUILDER, _elements_are_messages(sig.returns), False, sig.param_kind)
    if sig.param_kind in {"stream", "iterator"}:
        return _with_ack(spec, Shape.PROCESSOR_STREAM, sig.param_messages, False, sig.param_kind)
    messages = sig.param_kind == "message"
    if sig.is_asyncgen or sig.is_gen or sig.return_kind in {"stream", "iterator"}:
        return _with_ack(spec, Shape.PROCESSOR_FLATTEN, messages, False, sig.param_kind)
    if sig.return_kind in {"subscriber", "processor"}:
        raise DefinitionError(f"{where} ({channel}): a processor must return a payload, a Message or a stream")
    return _with_ack(spec, Shape.PROCESSOR_VALUE, messages, sig.is_coro, sig.param_kind)


def _with_ack(spec: MethodSpec, shape: Shape, messages: bool, is_async: bool, param_kind: str) -> Analysis:
    default, supported = _ACKS[(shape, messages)]
    chosen = spec.acknowledgment or default
    if chosen not in supported:
        allowed = ", ".join(sorted(a.name for a in supported))
        raise DefinitionError(f"function '{spec.name}' (incoming channel '{spec.incoming}'): acknowledgment "
                              f"{chosen.name} is not supported for this shape ({shape.value}, "
                              f"{'messages' if messages else 'payloads'}); use one of {allowed}")
    return Analysis(shape, messages, chosen, is_async, param_kind)


# -- conversions -------------------------------------------------------------------------------------------

def to_message(item: Any) -> Message[Any]:
    """A ``Message`` as is, anything else wrapped as a payload."""
    return item if isinstance(item, Message) else Message(item)


def is_stream(value: Any) -> bool:
    """True for what ``to_builder`` accepts."""
    return isinstance(value, rs.PublisherBuilder | Publisher) or hasattr(value, "__aiter__")


def to_builder(value: Any, what: str) -> rs.PublisherBuilder[Any]:
    """A ``PublisherBuilder`` from a builder, a publisher, an async iterable or (for generators) an iterator."""
    if isinstance(value, rs.PublisherBuilder):
        return value
    if isinstance(value, Publisher) or callable(getattr(value, "subscribe", None)):
        return rs.from_publisher(value)
    if hasattr(value, "__aiter__"):
        return rs.from_async_iterable(value)
    if isinstance(value, cabc.Iterator):
        return rs.from_iterable(value)
    raise TypeError(f"{what} returned {type(value).__name__}, not a PublisherBuilder, Publisher or async iterable")


def _awaitable(value: Any) -> bool:
    return value is not None and hasattr(value, "__await__")


def _consume_error(channel: str, name: str, message: Message[Any], error: Exception,
                   ack: Acknowledgment) -> Awaitable[None]:
    log.warning("channel '%s': %s failed on %r: %r", channel, name, message, error)
    return DONE if ack is A.NONE else message.nack(error)


# -- per-message handlers ------------------------------------------------------------------------------------

def _invoker(spec: MethodSpec, analysis: Analysis) -> Callable[[Message[Any]], Any]:
    """Calls the function with the message (or its payload), acknowledging it first under PRE_PROCESSING."""
    fn, messages = spec.fn, analysis.messages
    pre_processing = analysis.acknowledgment is A.PRE_PROCESSING

    def invoke(message: Message[Any]) -> Any:
        if pre_processing:
            message.ack()  # never raises: a failing callback is seen by whoever awaits the outcome
        return fn(message if messages else message.payload)

    return invoke


def consumer_handler(spec: MethodSpec, analysis: Analysis) -> Callable[[Message[Any]], Any]:
    """The per-message callable a ``ConsumerSubscriber`` runs for a consumer function."""
    invoke, ack, channel, name = _invoker(spec, analysis), analysis.acknowledgment, spec.incoming or "", spec.name
    returned_value = f"incoming-only function '{name}' returned a value"

    async def finish_async(message: Message[Any], pending: Awaitable[Any]) -> None:
        try:
            result = await pending
        except Exception as error:
            await _consume_error(channel, name, message, error, ack)  # type: ignore[arg-type]
            return
        if result is not None:
            await message.nack(TypeError(returned_value))
            return
        if ack is A.POST_PROCESSING:
            await message.ack()

    def handle(message: Message[Any]) -> Any:
        try:
            result = invoke(message)
        except Exception as error:
            return _consume_error(channel, name, message, error, ack)  # type: ignore[arg-type]
        if _awaitable(result):
            return finish_async(message, result)
        if result is not None:
            return message.nack(TypeError(returned_value))
        if ack is A.POST_PROCESSING:
            outcome = message.ack()
            return None if outcome is DONE else outcome
        return None

    return handle


# C901 over 12: one branch per acknowledgment strategy and argument kind of the spec
def value_processor_handler(spec: MethodSpec, analysis: Analysis) -> Callable[[Message[Any]], Any]:  # noqa: C901
    """Per-message callable for a value processor: returns the messages to forward (maybe awaitable)."""
    invoke, ack, channel, name = _invoker(spec, analysis), analysis.acknowledgment, spec.incoming or "", spec.name
    messages = analysis.messages

    def outputs(message: Message[Any], result: Any) -> tuple[Message[Any], ...]:
        if messages:
            if result is None:
                return ()
            return (result if isinstance(result, Message) else message.with_payload(result),)
        if result is None:
            message.nack(TypeError(f"processor '{name}' returned None for a payload"))
            return ()
        if ack is A.POST_PROCESSING:
            if isinstance(result, Message):
                return (result.with_ack(message.ack).with_nack(message.nack),)
            return (message.with_payload(result),)
        if isinstance(result, Message):
            return (result,)
        return (Message(result, message.metadata),)

    async def finish_async(message: Message[Any], pending: Awaitable[Any]) -> tuple[Message[Any], ...]:
        try:
            result = await pending
        except Exception as error:
            _consume_error(channel, name, message, error, ack)  # type: ignore[arg-type]
            return ()
        return outputs(message, result)

    def handle(message: Message[Any]) -> Any:
        try:
            result = invoke(message)
        except Exception as error:
            _consume_error(channel, name, message, error, ack)  # type: ignore[arg-type]
            return ()
        if _awaitable(result):
            return finish_async(message, result)
        return outputs(message, result)

    return handle


def flatten_function(spec: MethodSpec, analysis: Analysis) -> Callable[[Message[Any]], rs.PublisherBuilder[Any]]:
    """Per-message function for ``flat_map``: the stream of output messages of one input message."""
    fn, ack, channel, name = spec.fn, analysis.acknowledgment, spec.incoming or "", spec.name
    messages = analysis.messages

    def handle(message: Message[Any]) -> rs.PublisherBuilder[Any]:
        if ack is A.PRE_PROCESSING:
            message.ack()

        def recover(error: BaseException) -> rs.PublisherBuilder[Any]:
            if isinstance(error, Exception):
                _consume_error(channel, name, message, error, ack)  # type: ignore[arg-type]
                return rs.empty()
            return rs.failed(error)

        try:
            produced = to_builder(fn(message if messages else message.payload), f"processor '{name}'")
        except Exception as error:
            return recover(error)
        if messages:
            wrap: Callable[[Any], Message[Any]] = to_message
        else:
            metadata = message.metadata

            def wrap(item: Any) -> Message[Any]:
                return item if isinstance(item, Message) else Message(item, metadata)
        return produced.map(wrap).on_error_resume_with(recover)

    return handle


def unwrap_function(analysis: Analysis) -> Callable[[Message[Any]], Any] | None:
    """Maps messages to what the function sees (payloads acked on entry for PRE_PROCESSING); None: identity."""
    if analysis.messages:
        if analysis.acknowledgment is A.PRE_PROCESSING:
            def pre(message: Message[Any]) -> Message[Any]:
                message.ack()
                return message
            return pre
        return None
    if analysis.acknowledgment is A.PRE_PROCESSING:
        def payload_pre(message: Message[Any]) -> Any:
            message.ack()
            return message.payload
        return payload_pre
    return _payload


def _payload(message: Message[Any]) -> Any:
    return message.payload


def subscriber_of(value: Any, what: str) -> Subscriber[Any] | rs.SubscriberBuilder[Any, Any]:
    """Check a consumer function's result."""
    if isinstance(value, rs.SubscriberBuilder | Subscriber):
        return value
    raise TypeError(f"{what} returned {type(value).__name__}, not a Subscriber or SubscriberBuilder")


def processor_of(value: Any, what: str) -> Processor[Any, Any] | rs.ProcessorBuilder[Any, Any]:
    """Check a processor-builder function's result."""
    if isinstance(value, rs.ProcessorBuilder | Processor):
        return value
    raise TypeError(f"{what} returned {type(value).__name__}, not a Processor or ProcessorBuilder")


def forever(fn: Callable[[], Awaitable[Any]]) -> cabc.AsyncIterator[Any]:
    """The values of a coroutine producer, one call per element (sequential)."""
    async def loop() -> cabc.AsyncIterator[Any]:
        while True:
            yield await fn()
    return loop()


def is_iterable_result(value: Any) -> bool:
    """True for generator results a processor flattens."""
    return isinstance(value, Iterable) and not isinstance(value, str | bytes)
