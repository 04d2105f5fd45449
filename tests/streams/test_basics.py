"""First end-to-end checks of the operators API (the full operator and rule suites live beside this file)."""

from __future__ import annotations

import asyncio

import pytest

from openroute import streams as rs


async def test_map_filter_to_list() -> None:
    assert await rs.of(1, 2, 3).map(lambda x: x * 2).filter(lambda x: x > 2).to_list() == [4, 6]


async def test_run_returns_future_started_eagerly() -> None:
    seen: list[int] = []
    future = rs.of(1, 2).for_each(seen.append).run()
    assert isinstance(future, asyncio.Future)
    assert seen == [1, 2]  # a synchronous source has already run by the time run() returns
    assert await asyncio.wait_for(future, 5) is None


async def test_async_source_and_flat_map_async() -> None:
    async def numbers():
        for i in range(5):
            await asyncio.sleep(0)
            yield i

    async def plus_one(x: int) -> int:
        await asyncio.sleep(0)
        return x + 1

    result = await asyncio.wait_for(rs.from_async_iterable(numbers()).flat_map_async(plus_one).to_list().run(), 5)
    assert result == [1, 2, 3, 4, 5]


async def test_via_processor_builder_and_to_subscriber_builder() -> None:
    subscriber = rs.builder().map(lambda x: x * 10).to_list().build()
    rs.of(1, 2).via(rs.builder().map(lambda x: x + 1)).build().subscribe(subscriber)
    assert await asyncio.wait_for(subscriber.completion, 5) == [20, 30]


async def test_from_publisher_and_from_subscriber() -> None:
    publisher = rs.of("a", "b").build()
    seen: list[str] = []
    completion = rs.from_publisher(publisher).to(rs.builder().for_each(seen.append)).run()
    await asyncio.wait_for(completion, 5)
    assert seen == ["a", "b"]


async def test_user_exception_arrives_as_same_object() -> None:
    boom = RuntimeError("boom")

    def explode(_: int) -> int:
        raise boom

    with pytest.raises(RuntimeError) as caught:
        await rs.of(1).map(explode).to_list()
    assert caught.value is boom


def test_a_fused_take_while_ends_each_stream_with_its_own_stop() -> None:
    """One shared exception instance, re-raised by every stream that a take_while ends, would chain each raise's
    traceback onto the last and keep every frame it passed through alive."""
    from openroute.streams import stages as st
    from openroute.streams.fusion import Stop, compile_stage

    take_below_one = compile_stage(st.TakeWhile(lambda x: x < 1))
    raised: list[Stop] = []
    for _ in range(3):
        with pytest.raises(Stop) as caught:
            take_below_one(5)
        raised.append(caught.value)
    assert len({id(stop) for stop in raised}) == 3
    depths = [len(list(_frames(stop.__traceback__))) for stop in raised]
    assert depths[0] == depths[-1]


def _frames(tb: object) -> list[object]:
    frames = []
    while tb is not None:
        frames.append(tb)
        tb = tb.tb_next  # type: ignore[attr-defined]
    return frames
