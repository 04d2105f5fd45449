"""Message, Metadata and at-most-once ack/nack."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from openroute.messaging import Message, Metadata


@dataclass(frozen=True)
class Trace:
    correlation_id: str


@dataclass(frozen=True)
class Tenant:
    name: str


def test_metadata_is_typed_and_immutable() -> None:
    metadata = Metadata.of(Trace("a"), Tenant("t"))
    assert metadata.get(Trace) == Trace("a")
    replaced = metadata.with_(Trace("b"))
    assert replaced.get(Trace) == Trace("b") and metadata.get(Trace) == Trace("a")
    assert len(replaced) == 2
    assert replaced.without(Tenant).get(Tenant) is None and Tenant in metadata
    with pytest.raises(TypeError):
        Metadata.of(None)


def test_with_payload_and_metadata_keep_the_original() -> None:
    message = Message.of(1, Trace("a"))
    other = message.with_payload("x")
    assert other.payload == "x" and other.get_metadata(Trace) == Trace("a")
    assert message.payload == 1
    assert message.with_metadata([Tenant("t")]).metadata == Metadata(Tenant("t"))
    assert message.add_metadata(Tenant("t")).get_metadata(Trace) == Trace("a")
    with pytest.raises(TypeError):
        message.with_payload(None)
    with pytest.raises(TypeError):
        Message(None)


async def test_ack_runs_callback_once_and_first_outcome_wins() -> None:
    calls: list[object] = []

    async def ack() -> None:
        calls.append("ack")

    message = Message(1, ack=ack, nack=lambda reason: calls.append(reason))
    await message.ack()
    await message.ack()
    await message.nack(RuntimeError("late"))
    await message.with_payload(2).ack()  # copies share the outcome
    assert calls == ["ack"]
    assert message.settled


async def test_nack_passes_the_reason_and_wins_over_later_ack() -> None:
    reasons: list[BaseException] = []
    message = Message(1, ack=lambda: reasons.append(AssertionError("acked")), nack=reasons.append)
    error = ValueError("bad")
    await message.nack(error)
    await message.ack()
    assert reasons == [error]


async def test_nack_needs_an_exception() -> None:
    message = Message(1)
    with pytest.raises(ValueError):
        message.nack(None)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        message.nack("reason")  # type: ignore[arg-type]
    assert not message.settled


async def test_with_ack_and_with_nack_replace_callbacks() -> None:
    seen: list[str] = []
    base = Message(1, ack=lambda: seen.append("base-ack"), nack=lambda r: seen.append("base-nack"))
    replaced = base.with_ack(lambda: seen.append("new-ack"))
    await replaced.ack()
    assert seen == ["new-ack"]
    await base.with_nack(lambda r: seen.append("new-nack")).nack(RuntimeError())
    assert seen == ["new-ack", "new-nack"]
    await replaced.nack(RuntimeError())  # already acked: nothing
    assert seen == ["new-ack", "new-nack"]


async def test_failing_ack_callback_is_reported_to_the_awaiter() -> None:
    def ack() -> None:
        raise RuntimeError("broker gone")

    message = Message(1, ack=ack)
    with pytest.raises(RuntimeError, match="broker gone"):
        await message.ack()


async def test_message_without_callbacks_acks_trivially() -> None:
    await Message("x").ack()
    await Message("x").nack(RuntimeError())
