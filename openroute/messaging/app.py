"""``MessagingApp``: declares channels (decorators, emitters, injected channels), assembles and runs them."""

from __future__ import annotations

import asyncio
import logging
import os
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

import openroute.streams as rs
from openroute.messaging._stages import (
    DEFAULT_PREFETCH,
    ChannelTap,
    ConsumerSubscriber,
    PostAckSubscriber,
    ProcessorStage,
    WatchedSubscriber,
)
from openroute.messaging.config import ChannelConfig, ConfigError, MessagingConfig
from openroute.messaging.connector import ConnectorFactory, IncomingConnectorFactory, OutgoingConnectorFactory
from openroute.messaging.emitter import DEFAULT_BUFFER_SIZE, Emitter, OnOverflow
from openroute.messaging.errors import DefinitionError, DeploymentError
from openroute.messaging.memory import InMemoryConnector
from openroute.messaging.message import Acknowledgment, Message
from openroute.messaging.shapes import (
    Analysis,
    MethodSpec,
    Shape,
    analyze,
    consumer_handler,
    flatten_function,
    forever,
    is_stream,
    processor_of,
    subscriber_of,
    to_builder,
    to_message,
    unwrap_function,
    value_processor_handler,
)
from openroute.streams.protocol import NOOP_SUBSCRIPTION, Publisher, Subscriber

log = logging.getLogger("openroute.messaging")

F = TypeVar("F", bound=Callable[..., Any])


def _check_channel(name: Any) -> str:
    if not isinstance(name, str):
        raise TypeError(f"a channel name must be a string, got {type(name).__name__}")
    if not name.strip():
        raise ValueError("a channel name must not be empty")
    return name


def _check_concurrency(value: Any, what: str) -> int:
    if isinstance(value, bool):
        raise ValueError(f"{what}: concurrency must be a positive integer, got {value!r}")
    try:
        number = int(value)
    except (TypeError, ValueError):
        raise ValueError(f"{what}: concurrency must be a positive integer, got {value!r}") from None
    if number < 1 or str(number) != str(value).strip():
        raise ValueError(f"{what}: concurrency must be a positive integer, got {value!r}")
    return number


class ChannelPublisher(Publisher[Any]):
    """The stream of a channel, obtained with ``app.channel(name)`` (the spec's injected ``@Channel``).

    Subscribe (or ``async for``) after ``app.start()``. Payload streams ack each message as it is delivered;
    ``messages=True`` gives the ``Message`` objects and leaves acknowledgment to the subscriber.
    """

    def __init__(self, channel: str, messages: bool) -> None:
        self.channel = channel
        self.messages = messages
        self._tap: ChannelTap | None = None

    def subscribe(self, subscriber: Subscriber[Any]) -> None:
        """Subscribe to the running channel: its messages with ``messages=True``, else their payloads (each message
        acked as it is delivered). Before ``app.start()`` the subscriber gets ``on_error(RuntimeError)``."""
        if subscriber is None:
            raise TypeError("subscriber must not be None")
        if self._tap is None:
            subscriber.on_subscribe(NOOP_SUBSCRIPTION)
            subscriber.on_error(RuntimeError(f"channel '{self.channel}' is not running (start the app first)"))
            return
        if self.messages:
            self._tap.subscribe(subscriber)
        else:
            rs.from_publisher(self._tap).map(_ack_payload).build().subscribe(subscriber)

    def builder(self) -> rs.PublisherBuilder[Any]:
        """The channel's stream as a ``PublisherBuilder``."""
        return rs.from_publisher(self)

    def __aiter__(self) -> Any:
        return self.builder().__aiter__()


def _factory_problem(direction: str, channel: str, config: ChannelConfig, what: str, error: Exception) -> str:
    return (f"{direction} channel '{channel}': connector '{config.connector}' failed to create its {what}: "
            f"{type(error).__name__}: {error}")


def _ack_payload(message: Message[Any]) -> Any:
    message.ack()
    return message.payload


class MessagingApp:
    """One messaging application: its functions, emitters, connectors and configuration (no global state).

    ``config`` is a dict of ``openroute.messaging.*`` keys or a ``MessagingConfig``; ``config_files`` are
    properties or TOML files; ``environ`` defaults to ``os.environ`` (only ``OPENROUTE_MESSAGING_*`` and
    ``MP_MESSAGING_*`` variables are read); ``connectors`` adds or replaces named connector factories.
    """

    def __init__(
        self,
        config: Mapping[str, Any] | MessagingConfig | None = None,
        *,
        config_files: Iterable[str | os.PathLike[str]] = (),
        environ: Mapping[str, str] | None = None,
        connectors: Mapping[str, ConnectorFactory] | None = None,
    ) -> None:
        if isinstance(config, MessagingConfig):
            self.config = config
        else:
            self.config = MessagingConfig(config, files=config_files,
                                          environ=os.environ if environ is None else environ)
        from openroute.messaging.amqp import AmqpConnector  # aio-pika is imported only with this module

        self._connectors: dict[str, ConnectorFactory] = {"memory": InMemoryConnector(), "amqp": AmqpConnector()}
        for name, factory in (connectors or {}).items():
            self.register_connector(name, factory)
        self._methods: dict[Callable[..., Any], MethodSpec] = {}
        self._emitters: dict[str, list[Emitter[Any]]] = defaultdict(list)
        self._injected: dict[str, list[ChannelPublisher]] = defaultdict(list)
        self._taps: dict[str, ChannelTap] = {}
        self._terminals: list[ConsumerSubscriber | WatchedSubscriber] = []
        self._stoppable: list[ChannelTap] = []
        self._connector_fed: set[str] = set()
        self._used_connectors: list[ConnectorFactory] = []
        self._state = "new"

    # -- declaration ---------------------------------------------------------------------------------------
    def register_connector(self, name: str, factory: ConnectorFactory) -> None:
        """Register (or replace) the connector ``name``."""
        if not isinstance(factory, IncomingConnectorFactory | OutgoingConnectorFactory):
            raise TypeError(f"connector '{name}' must be an IncomingConnectorFactory or OutgoingConnectorFactory")
        self._connectors[_check_channel(name)] = factory

    def connector(self, name: str) -> Any:
        """The connector registered as ``name`` (e.g. ``app.connector("memory").source("orders")``)."""
        try:
            return self._connectors[name]
        except KeyError:
            raise KeyError(f"no connector named '{name}' (known: {', '.join(sorted(self._connectors))})") from None

    def _spec(self, fn: Callable[..., Any]) -> MethodSpec:
        if self._state != "new":
            raise RuntimeError("functions must be declared before app.start()")
        if not callable(fn):
            raise TypeError(f"@incoming/@outgoing decorate functions, not {type(fn).__name__}")
        if fn not in self._methods:
            self._methods[fn] = MethodSpec(fn)
        return self._methods[fn]

    def incoming(self, channel: str, *, acknowledgment: Acknowledgment | None = None,
                 concurrency: int | None = None) -> Callable[[F], F]:
        """Decorator: the function consumes channel ``channel`` (stack with ``outgoing`` for a processor).

        ``concurrency``: how many calls may run at once (default 1: never concurrently with itself);
        ``openroute.messaging.incoming.<channel>.concurrency`` overrides it.
        """
        _check_channel(channel)
        if acknowledgment is not None and not isinstance(acknowledgment, Acknowledgment):
            raise TypeError(f"acknowledgment must be an Acknowledgment, got {acknowledgment!r}")
        if concurrency is not None:
            concurrency = _check_concurrency(concurrency, f"incoming channel '{channel}'")
        return self._marking("incoming", channel, "; one function consumes one channel",
                             acknowledgment=acknowledgment, concurrency=concurrency)

    def outgoing(self, channel: str) -> Callable[[F], F]:
        """Decorator: the function's results go to channel ``channel``."""
        _check_channel(channel)
        return self._marking("outgoing", channel)

    def _marking(self, direction: str, channel: str, why: str = "", **settings: Any) -> Callable[[F], F]:
        """The decorator that sets a function's ``direction`` channel (and ``settings``); one channel per
        direction: a second one is a problem of the assembly."""

        def decorate(fn: F) -> F:
            spec = self._spec(fn)
            current = getattr(spec, direction)
            if current is not None:
                spec.problems.append(f"function '{spec.name}': several {direction} channels "
                                     f"('{current}', '{channel}'){why}")
            setattr(spec, direction, channel)
            for name, value in settings.items():
                setattr(spec, name, value)
            return fn

        return decorate

    def emitter(self, channel: str, overflow: OnOverflow = OnOverflow.BUFFER,
                buffer_size: int | None = None) -> Emitter[Any]:
        """An ``Emitter`` feeding ``channel``. ``buffer_size`` defaults to
        ``openroute.messaging.emitter.default-buffer-size`` (128)."""
        _check_channel(channel)
        if self._state != "new":
            raise RuntimeError("emitters must be created before app.start()")
        if buffer_size is None:
            raw = self.config.get_global("emitter.default-buffer-size", DEFAULT_BUFFER_SIZE)
            try:
                buffer_size = int(raw)
            except (TypeError, ValueError):
                raise ConfigError(f"emitter.default-buffer-size must be an integer, got {raw!r}") from None
        emitter: Emitter[Any] = Emitter(channel, overflow, buffer_size)
        self._emitters[channel].append(emitter)
        return emitter

    def channel(self, name: str, *, messages: bool = False) -> ChannelPublisher:
        """The stream of channel ``name`` (payloads, or ``Message`` objects with ``messages=True``)."""
        _check_channel(name)
        if self._state != "new":
            raise RuntimeError("injected channels must be obtained before app.start()")
        handle = ChannelPublisher(name, messages)
        self._injected[name].append(handle)
        return handle

    # -- metrics -------------------------------------------------------------------------------------------------
    def counters(self) -> dict[str, int]:
        """Messages that passed through each channel so far."""
        return {name: tap.count for name, tap in self._taps.items()}

    # -- lifecycle -------------------------------------------------------------------------------------------------
    async def __aenter__(self) -> MessagingApp:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    def _channel_names(self) -> set[str]:
        names: set[str] = set(self._emitters) | set(self._injected)
        for spec in self._methods.values():
            names.update(c for c in (spec.incoming, spec.outgoing) if c)
        return names | self.config.names("incoming") | self.config.names("outgoing")

    def _connector_config(self, direction: str, channel: str, problems: list[str]) -> ChannelConfig | None:
        config = self.config.channel(direction, channel, self._connectors)
        if config.connector is None:
            return None
        factory = self._connectors.get(config.connector)
        kind = IncomingConnectorFactory if direction == "incoming" else OutgoingConnectorFactory
        if factory is None:
            problems.append(f"{direction} channel '{channel}': unknown connector '{config.connector}' "
                            f"(known: {', '.join(sorted(self._connectors))})")
            return config
        if not isinstance(factory, kind):
            problems.append(f"{direction} channel '{channel}': connector '{config.connector}' cannot be used "
                            f"for {direction} channels")
            return config
        mandatory = (factory.incoming_mandatory if direction == "incoming"  # type: ignore[union-attr]
                     else factory.outgoing_mandatory)  # type: ignore[union-attr]
        for attribute in mandatory:
            if config.get(attribute) in (None, ""):
                problems.append(f"{direction} channel '{channel}': mandatory attribute '{attribute}' of "
                                f"connector '{config.connector}' is missing")
        return config

    # C901 over 12: one check per kind of wiring mistake, so the DeploymentError lists every problem at once
    def _validate(self) -> tuple[dict[str, Analysis], dict[str, ChannelConfig], dict[str, ChannelConfig]]:  # noqa: C901
        problems: list[str] = []
        definition = False
        analyses: dict[str, Analysis] = {}
        ups: dict[str, list[str]] = defaultdict(list)
        downs: dict[str, list[str]] = defaultdict(list)
        for spec in self._methods.values():
            if spec.problems:
                definition = True
                problems.extend(spec.problems)
            if spec.incoming and spec.incoming == spec.outgoing:
                definition = True
                problems.append(f"function '{spec.name}': channel '{spec.incoming}' is both its incoming and "
                                "its outgoing channel")
            try:
                analyses[spec.name] = analyze(spec)
            except DefinitionError as error:
                definition = True
                problems.extend(error.problems)
            else:
                section = self.config.section("incoming", spec.incoming) if spec.incoming else {}
                configured = section.get("concurrency")
                if (spec.concurrency or configured) and analyses[spec.name].shape not in (
                        Shape.CONSUMER, Shape.PROCESSOR_VALUE):
                    definition = True
                    problems.append(f"function '{spec.name}' (incoming channel '{spec.incoming}'): concurrency "
                                    f"applies to consumers and value processors, not to the "
                                    f"{analyses[spec.name].shape.value} shape")
            if spec.incoming:
                downs[spec.incoming].append(f"function '{spec.name}'")
            if spec.outgoing:
                ups[spec.outgoing].append(f"function '{spec.name}'")
        for channel, emitters in self._emitters.items():
            ups[channel].extend(["emitter"] * len(emitters))
        for channel, handles in self._injected.items():
            downs[channel].extend(["injected channel"] * len(handles))
        incoming: dict[str, ChannelConfig] = {}
        outgoing: dict[str, ChannelConfig] = {}
        for channel in sorted(self._channel_names()):
            config = self._connector_config("incoming", channel, problems)
            if config is not None:
                incoming[channel] = config
                ups[channel].append(f"incoming connector '{config.connector}'")
            config = self._connector_config("outgoing", channel, problems)
            if config is not None:
                outgoing[channel] = config
                downs[channel].append(f"outgoing connector '{config.connector}'")
            raw = self.config.section("incoming", channel).get("concurrency")
            if raw is not None:
                try:
                    _check_concurrency(raw, f"incoming channel '{channel}'")
                except ValueError as error:
                    problems.append(str(error))
        for channel in sorted(set(ups) | set(downs)):
            problems += _end_problems(channel, ups.get(channel, []), downs.get(channel, []))
        if problems:
            raise (DefinitionError if definition else DeploymentError)(problems)
        return analyses, incoming, outgoing

    def _concurrency(self, spec: MethodSpec) -> int:
        raw = self.config.section("incoming", spec.incoming or "").get("concurrency")
        if raw is not None:
            return _check_concurrency(raw, f"incoming channel '{spec.incoming}'")
        return spec.concurrency or 1

    async def start(self) -> None:
        """Assemble, validate (``DeploymentError`` listing every problem), connect connectors, start streams."""
        if self._state != "new":
            raise RuntimeError(f"the app is {self._state}; an app starts once")
        analyses, incoming, outgoing = self._validate()
        self._state = "starting"
        try:
            await self._assemble(analyses, incoming, outgoing)
        except BaseException:
            await self._teardown()
            self._state = "failed"
            raise
        self._state = "running"

    # C901 over 12: the assembly steps in their order (connectors, emitters, methods, taps); splitting hides the order
    async def _assemble(self, analyses: dict[str, Analysis], incoming: dict[str, ChannelConfig],  # noqa: C901
                        outgoing: dict[str, ChannelConfig]) -> None:
        taps = self._taps
        for name in self._channel_names():
            taps[name] = ChannelTap(name)
        sources: dict[str, Publisher[Any]] = {}
        sinks: list[tuple[str, Subscriber[Any]]] = []
        problems: list[str] = []
        causes: list[Exception] = []  # connector factories' own exceptions, chained to the DeploymentError
        for channel, emitters in self._emitters.items():
            sources[channel] = emitters[0]
        for channel, handles in self._injected.items():
            handles[0]._tap = taps[channel]
        self._connector_fed = set(incoming)
        for channel, config in incoming.items():
            made, created = await self._connector_end("incoming", channel, config, problems, causes)
            if not made:
                continue
            sources[channel] = created.build() if isinstance(created, rs.PublisherBuilder) else created
            self._stoppable.append(taps[channel])
        for channel, config in outgoing.items():
            made, sink = await self._connector_end("outgoing", channel, config, problems, causes)
            if not made:
                continue
            built = sink.build() if isinstance(sink, rs.SubscriberBuilder) else sink
            watched = WatchedSubscriber(built)
            self._terminals.append(watched)
            sinks.append((channel, watched))
        definition = False
        for spec in self._methods.values():
            try:
                self._wire_method(spec, analyses[spec.name], sources, sinks)
            except (TypeError, ValueError, DeploymentError) as error:
                definition = True
                problems.extend(error.problems if isinstance(error, DeploymentError) else
                                [f"function '{spec.name}': {error}"])
        if problems:
            raise (DefinitionError if definition else DeploymentError)(problems) from (causes[0] if causes else None)
        # downstream first, so that every source finds its subscriber chain in place
        for channel, sink in sinks:
            taps[channel].subscribe(sink)
        for channel, source in sources.items():
            source.subscribe(taps[channel])

    async def _connector_end(self, direction: str, channel: str, config: ChannelConfig, problems: list[str],
                             causes: list[Exception]) -> tuple[bool, Any]:
        """(True, the publisher or subscriber the channel's connector creates for ``direction``), or (False, None)
        with the problem recorded when the factory refuses (its own exception kept in ``causes``)."""
        factory = self._connectors[config.connector]  # type: ignore[index]
        self._use(factory)
        incoming = direction == "incoming"
        try:
            if incoming:
                return True, await factory.create_publisher(config)  # type: ignore[union-attr]
            return True, await factory.create_subscriber(config)  # type: ignore[union-attr]
        except DeploymentError as error:
            problems.extend(error.problems)
        except Exception as error:
            problems.append(_factory_problem(direction, channel, config, "publisher" if incoming else "subscriber",
                                             error))
            causes.append(error)
        return False, None

    def _use(self, factory: ConnectorFactory) -> None:
        if factory not in self._used_connectors:
            self._used_connectors.append(factory)

    # C901 over 12: one branch per method shape (shapes.Shape), each a few lines
    def _wire_method(self, spec: MethodSpec, analysis: Analysis, sources: dict[str, Publisher[Any]],  # noqa: C901
                     sinks: list[tuple[str, Subscriber[Any]]]) -> None:
        shape, what = analysis.shape, f"function '{spec.name}'"
        tap_in = self._taps.get(spec.incoming or "")
        if shape is Shape.CONSUMER:
            assert spec.incoming is not None  # noqa: S101  narrows an Optional for mypy: set before this point
            # a connector-fed channel keeps the connector's own prefetch (AMQP: the broker's, following demand)
            prefetch = 0 if spec.incoming in self._connector_fed else DEFAULT_PREFETCH
            consumer = ConsumerSubscriber(spec.incoming, consumer_handler(spec, analysis), self._concurrency(spec),
                                          prefetch)
            self._terminals.append(consumer)
            sinks.append((spec.incoming, consumer))
            return
        if shape is Shape.CONSUMER_SUBSCRIBER:
            assert spec.incoming is not None  # noqa: S101  narrows an Optional for mypy: set before this point
            target = subscriber_of(spec.fn(), what)
            unwrap = unwrap_function(analysis)
            if analysis.acknowledgment is Acknowledgment.POST_PROCESSING:
                inner = target.build() if isinstance(target, rs.SubscriberBuilder) else target
                built = rs.builder().to(PostAckSubscriber(inner, unwrap)).build()
            else:
                chain = rs.builder() if unwrap is None else rs.builder().map(unwrap)
                built = chain.to(target).build()
            watched = WatchedSubscriber(built)
            self._terminals.append(watched)
            sinks.append((spec.incoming, watched))
            return
        if spec.outgoing is None:
            raise AssertionError(f"unexpected shape {shape}")
        if shape is Shape.PRODUCER_STREAM:
            produced = to_builder(spec.fn(), what)
            sources[spec.outgoing] = produced.map(to_message).build()
            self._stoppable.append(self._taps[spec.outgoing])
            return
        if shape in (Shape.PRODUCER_VALUE, Shape.PRODUCER_UNKNOWN):
            if analysis.is_async:
                builder = rs.from_async_iterable(forever(spec.fn))
            elif shape is Shape.PRODUCER_UNKNOWN:
                first = spec.fn()
                if first is None:
                    raise DefinitionError(f"{what} (outgoing channel '{spec.outgoing}'): returned None at assembly")
                builder = (to_builder(first, what) if is_stream(first)
                           else rs.concat(rs.of(first), rs.generate(spec.fn)))
            else:
                builder = rs.generate(spec.fn)
            sources[spec.outgoing] = builder.map(to_message).build()
            self._stoppable.append(self._taps[spec.outgoing])
            return
        assert tap_in is not None  # noqa: S101  narrows an Optional for mypy: set before this point
        if shape is Shape.PROCESSOR_VALUE:
            # requests a prefetch beyond its call slots, as a consumer does: LATEST drops only what outruns it
            prefetch = 0 if spec.incoming in self._connector_fed else DEFAULT_PREFETCH
            stage = ProcessorStage(spec.name, value_processor_handler(spec, analysis), self._concurrency(spec),
                                   prefetch)
            sinks.append((spec.incoming or "", stage))
            sources[spec.outgoing] = stage
            return
        if shape is Shape.PROCESSOR_FLATTEN:
            sources[spec.outgoing] = rs.from_publisher(tap_in).flat_map(flatten_function(spec, analysis)).build()
            return
        unwrap = unwrap_function(analysis)
        stream = rs.from_publisher(tap_in) if unwrap is None else rs.from_publisher(tap_in).map(unwrap)
        if shape is Shape.PROCESSOR_STREAM:
            argument: Any = stream.__aiter__() if analysis.param_kind == "iterator" else stream
            result = to_builder(spec.fn(argument), what)
        else:
            result = stream.via(processor_of(spec.fn(), what))
        sources[spec.outgoing] = result.map(to_message).build()

    async def stop(self, timeout: float = 5.0) -> None:
        """Stop: complete emitters (their buffers drain), stop connector and producer sources, wait up to
        ``timeout`` seconds for consumers to finish their messages, cancel what is left, close connectors."""
        if self._state not in ("running", "failed"):
            return
        self._state = "stopping"
        for emitters in self._emitters.values():
            for emitter in emitters:
                emitter.complete()
        for tap in self._stoppable:
            tap.stop()
        pending = [t.completion for t in self._terminals if not t.completion.done()]
        if pending:
            await asyncio.wait(pending, timeout=timeout)
        await self._teardown()
        self._state = "stopped"

    async def _teardown(self) -> None:
        for terminal in self._terminals:
            terminal.cancel()
        for tap in self._taps.values():
            tap.cancel()
        for factory in self._used_connectors:
            try:
                await factory.close()
            except Exception:  # closing must go on for the other connectors
                log.exception("closing connector %r failed", factory)


#: a channel's two ends: what is missing when it has none
_ENDS = (("upstream", "no emitter, @outgoing function or incoming connector feeds it"),
         ("downstream", "no @incoming function, injected channel or outgoing connector consumes it"))


def _end_problems(channel: str, up: list[str], down: list[str]) -> list[str]:
    """What is wrong with the ends of ``channel``: each end needs exactly one of ``up`` (its feeders) and of
    ``down`` (its consumers)."""
    problems: list[str] = []
    for (end, missing), these, those in zip(_ENDS, (up, down), (down, up), strict=True):
        if not these:
            problems += [f"channel '{channel}' ({who}) has no {end}: {missing}" for who in those]
        elif len(these) > 1:
            problems.append(f"channel '{channel}' has several {end}s: {', '.join(these)}")
    return problems
