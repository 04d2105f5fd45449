"""Assembly validation: every problem is a DeploymentError naming its channel, all listed at once."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, ClassVar

import pytest

from openroute.messaging import (
    ChannelConfig,
    DefinitionError,
    DeploymentError,
    IncomingConnectorFactory,
    Message,
    MessagingApp,
)
from openroute.streams.protocol import Publisher


def new_app(config: dict[str, Any] | None = None, **kwargs: Any) -> MessagingApp:
    return MessagingApp(config or {}, environ={}, **kwargs)


async def problems_of(app: MessagingApp) -> list[str]:
    with pytest.raises(DeploymentError) as raised:
        await app.start()
    return raised.value.problems


def consumer(app: MessagingApp, channel: str) -> None:
    """Add to ``app`` a payload consumer of ``channel`` that does nothing (its function is named ``consume``)."""

    def consume(payload: Any) -> None: ...

    app.incoming(channel)(consume)


async def test_incoming_without_upstream() -> None:
    app = new_app()
    consumer(app, "orders")
    [problem] = await problems_of(app)
    assert "channel 'orders'" in problem and "no upstream" in problem and "consume" in problem


async def test_outgoing_without_downstream() -> None:
    app = new_app()

    @app.outgoing("prices")
    async def produce() -> AsyncIterator[int]:
        yield 1

    [problem] = await problems_of(app)
    assert "channel 'prices'" in problem and "no downstream" in problem


async def test_multiple_upstreams_and_downstreams() -> None:
    app = new_app()
    app.emitter("a")
    app.emitter("a")

    @app.incoming("a")
    def one(payload: Any) -> None: ...

    @app.incoming("a")
    def two(payload: Any) -> None: ...

    problems = await problems_of(app)
    assert any("channel 'a' has several upstreams: emitter, emitter" in p for p in problems)
    assert any("channel 'a' has several downstreams" in p and "one" in p and "two" in p for p in problems)


async def test_emitter_and_injected_channel_with_none_or_several() -> None:
    app = new_app()
    app.emitter("lonely")
    app.channel("nothing")
    app.emitter("shared")
    app.channel("shared")
    app.channel("shared")
    problems = await problems_of(app)
    assert any("channel 'lonely' (emitter) has no downstream" in p for p in problems)
    assert any("channel 'nothing' (injected channel) has no upstream" in p for p in problems)
    assert any("channel 'shared' has several downstreams: injected channel, injected channel" in p
               for p in problems)


async def test_unknown_connector() -> None:
    app = new_app({"openroute.messaging.incoming.orders.connector": "kafka"})
    consumer(app, "orders")
    [problem] = await problems_of(app)
    assert "incoming channel 'orders': unknown connector 'kafka'" in problem


async def test_connector_channels_with_none_or_several_sides() -> None:
    app = new_app({
        "openroute.messaging.incoming.in-alone.connector": "memory",
        "openroute.messaging.outgoing.out-alone.connector": "memory",
        "openroute.messaging.incoming.doubled.connector": "memory",
    })
    app.emitter("doubled")
    consumer(app, "doubled")
    problems = await problems_of(app)
    assert any("channel 'in-alone' (incoming connector 'memory') has no downstream" in p for p in problems)
    assert any("channel 'out-alone' (outgoing connector 'memory') has no upstream" in p for p in problems)
    assert any("channel 'doubled' has several upstreams: emitter, incoming connector 'memory'" in p
               for p in problems)


class _NeedsTopic(IncomingConnectorFactory):
    incoming_mandatory: ClassVar[tuple[str, ...]] = ("topic", "group")

    async def create_publisher(self, config: ChannelConfig) -> Publisher[Message[Any]]:
        raise AssertionError("must not be called when validation fails")


async def test_missing_mandatory_attributes_and_wrong_direction() -> None:
    app = new_app({
        "openroute.messaging.incoming.orders.connector": "custom",
        "openroute.messaging.connector.custom.group": "g",
        "openroute.messaging.outgoing.audit.connector": "custom",
        "openroute.messaging.incoming.amqp-in.connector": "amqp",
    }, connectors={"custom": _NeedsTopic()})
    app.emitter("audit")
    consumer(app, "orders")
    consumer(app, "amqp-in")

    problems = await problems_of(app)
    assert any("incoming channel 'orders': mandatory attribute 'topic'" in p for p in problems)
    assert not any("'group'" in p for p in problems)  # provided at connector level
    assert any("outgoing channel 'audit': connector 'custom' cannot be used for outgoing" in p for p in problems)
    assert any("incoming channel 'amqp-in': mandatory attribute 'queue'" in p for p in problems)


async def test_same_channel_on_both_sides_of_a_processor() -> None:
    app = new_app()

    @app.incoming("loop")
    @app.outgoing("loop")
    def echo(payload: Any) -> Any:
        return payload

    with pytest.raises(DefinitionError, match="channel 'loop' is both its incoming and its outgoing"):
        await app.start()


async def test_every_problem_is_listed_together() -> None:
    app = new_app({"openroute.messaging.incoming.x.connector": "nope"})
    consumer(app, "a")
    @app.outgoing("b")
    def produce() -> int:
        return 1

    app.emitter("c")
    consumer(app, "x")
    problems = await problems_of(app)
    assert len(problems) == 4
    for name in ("channel 'a'", "channel 'b'", "channel 'c'", "channel 'x'"):
        assert sum(name in p for p in problems) == 1, name


# -- definition errors -----------------------------------------------------------------------------------------

def _sync_consumer_of_messages(message: Message[int]) -> None: ...


def _consumer_returning_a_value(payload: int) -> int:
    return payload


def _returns_the_wrong_kind():  # type: ignore[no-untyped-def]
    return 42


@pytest.mark.parametrize(("consume", "problem"), [
    (_sync_consumer_of_messages, "must be a coroutine"),
    (_consumer_returning_a_value, "must not return a value"),
    (_returns_the_wrong_kind, "not a Subscriber or SubscriberBuilder"),  # found only when called at assembly
], ids=["sync-consumer-taking-a-message", "incoming-only-returning-a-value", "returning-the-wrong-kind"])
async def test_a_consumer_of_the_wrong_shape_is_a_definition_error(consume: Any, problem: str) -> None:
    app = new_app()
    app.emitter("in")
    app.incoming("in")(consume)
    with pytest.raises(DefinitionError, match=problem):
        await app.start()


@pytest.mark.parametrize("case", ["outgoing-with-param", "two-params", "generator-consumer", "stream-consumer",
                                  "processor-no-param"])
async def test_other_definition_errors(case: str) -> None:
    app = new_app()
    app.emitter("in")
    if case == "outgoing-with-param":
        app.channel("out")

        @app.outgoing("out")
        def produce(x: int) -> int:
            return x
        app.emitter("unused")
        app.channel("unused")
    elif case == "two-params":
        @app.incoming("in")
        async def consume(a: int, b: int) -> None: ...
    elif case == "generator-consumer":
        @app.incoming("in")
        async def consume(a: int) -> AsyncIterator[int]:
            yield a
    elif case == "stream-consumer":
        @app.incoming("in")
        async def consume(stream: AsyncIterator[int]) -> None: ...
    else:
        app.channel("out")

        @app.incoming("in")
        @app.outgoing("out")
        def make() -> int:
            return 1
    with pytest.raises(DefinitionError) as raised:
        await app.start()
    assert any("function '" in p for p in raised.value.problems)


async def test_two_incoming_channels_on_one_function() -> None:
    app = new_app()
    app.emitter("a")
    app.emitter("b")

    @app.incoming("a")
    @app.incoming("b")
    def consume(payload: Any) -> None: ...

    with pytest.raises(DefinitionError, match="several incoming channels"):
        await app.start()


async def test_bad_concurrency_configuration() -> None:
    app = new_app({"openroute.messaging.incoming.in.concurrency": "lots"})
    app.emitter("in")
    consumer(app, "in")
    [problem] = await problems_of(app)
    assert "incoming channel 'in': concurrency must be a positive integer" in problem


def test_bad_decorator_arguments_fail_at_once() -> None:
    app = new_app()
    with pytest.raises(ValueError):
        app.incoming("")
    with pytest.raises(TypeError):
        app.outgoing(3)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        app.incoming("a", concurrency=0)
    with pytest.raises(TypeError):
        app.incoming("a", acknowledgment="manual")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        app.register_connector("x", object())  # type: ignore[arg-type]


async def test_concurrency_on_a_shape_that_cannot_use_it() -> None:
    app = new_app()
    app.emitter("in")
    app.channel("out")

    @app.incoming("in", concurrency=4)
    @app.outgoing("out")
    async def fan_out(value: int) -> AsyncIterator[int]:
        yield value

    with pytest.raises(DefinitionError, match="concurrency applies to consumers and value processors"):
        await app.start()


class _BrokenFactory(IncomingConnectorFactory):
    def __init__(self, error: Exception) -> None:
        self.error = error

    async def create_publisher(self, config: ChannelConfig) -> Publisher[Message[Any]]:
        raise self.error


@pytest.mark.parametrize("error", [ValueError("bad port"), KeyError("bootstrap.servers")])
async def test_connector_5_x_factory_exception_is_a_deployment_error_naming_channel_and_connector(
        error: Exception) -> None:
    app = new_app({"openroute.messaging.incoming.orders.connector": "broken"},
                  connectors={"broken": _BrokenFactory(error)})
    consumer(app, "orders")
    with pytest.raises(DeploymentError) as raised:
        await app.start()
    [problem] = raised.value.problems
    assert "incoming channel 'orders'" in problem and "connector 'broken'" in problem
    assert type(error).__name__ in problem and raised.value.__cause__ is error


async def test_connector_5_x_outgoing_factory_exception_is_a_deployment_error() -> None:
    from openroute.messaging import OutgoingConnectorFactory
    from openroute.streams.protocol import Subscriber

    class Broken(OutgoingConnectorFactory):
        async def create_subscriber(self, config: ChannelConfig) -> Subscriber[Message[Any]]:
            raise KeyError("topic")

    app = new_app({"openroute.messaging.outgoing.prices.connector": "broken"}, connectors={"broken": Broken()})
    app.emitter("prices")
    [problem] = await problems_of(app)
    assert "outgoing channel 'prices'" in problem and "connector 'broken'" in problem and "KeyError" in problem
