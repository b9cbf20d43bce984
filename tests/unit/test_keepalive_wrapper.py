"""gateway/http/keepalive.py with fake streams: keep-alives fill a silent gap and never come before
the first item unless allowed; items keep their order and back-pressure; closing or cancelling the
consumer closes the stream; one task per stream, not one per item."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

import pytest

from gateway.http.keepalive import COMMENT, kept_alive

INTERVAL_S = 0.1
HANG_GUARD_S = 10.0  # a bound on a wait that only a broken keep-alive would make long; not a speed claim


def ping() -> str:
    return "ping"


async def gated(gate: asyncio.Event, closed: list[str], before: bool = False) -> AsyncGenerator[str, None]:
    """'a', then (once `gate` is set) 'b'; or with `before`, the gate comes first."""
    try:
        if before:
            await gate.wait()
        yield "a"
        await gate.wait()
        yield "b"
    finally:
        closed.append("closed")


async def take(it: AsyncIterator[str]) -> str:
    async with asyncio.timeout(HANG_GUARD_S):
        return await anext(it)


async def test_a_silent_gap_gets_keep_alives_and_the_items_still_come_in_order() -> None:
    gate, closed = asyncio.Event(), list[str]()
    it = kept_alive(gated(gate, closed), INTERVAL_S, ping)
    assert await take(it) == "a"
    assert await take(it) == "ping"  # only a keep-alive ends this wait: the gate is shut
    assert await take(it) == "ping"
    gate.set()
    got = [x async for x in it]
    assert got[-1] == "b" and set(got[:-1]) <= {"ping"}
    assert closed == ["closed"]


async def test_no_keep_alive_before_the_first_item_unless_the_dialect_allows_one() -> None:
    gate, closed = asyncio.Event(), list[str]()
    it = kept_alive(gated(gate, closed, before=True), INTERVAL_S, ping)
    first = asyncio.ensure_future(anext(it))
    await asyncio.sleep(INTERVAL_S * 4)  # several intervals of silence before the first item
    gate.set()
    assert await first == "a"
    assert [x async for x in it] == ["b"]

    gate2 = asyncio.Event()
    allowed = kept_alive(gated(gate2, [], before=True), INTERVAL_S, ping, before_first=True)
    assert await take(allowed) == "ping"
    gate2.set()
    assert [x async for x in allowed][-1] == "b"


async def test_off_is_the_stream_itself() -> None:
    source = gated(asyncio.Event(), [])
    assert kept_alive(source, 0, ping) is source


async def test_the_stream_is_closed_when_the_consumer_is_cancelled_or_leaves() -> None:
    for leave in ("cancel", "aclose"):
        gate, closed = asyncio.Event(), list[str]()
        it = kept_alive(gated(gate, closed), INTERVAL_S, ping)
        assert await take(it) == "a"
        if leave == "cancel":  # as Litestar does when the client disconnects mid-wait
            waiting = asyncio.ensure_future(anext(it))
            await asyncio.sleep(0)
            waiting.cancel()
            with pytest.raises(asyncio.CancelledError):
                await waiting
        else:
            await it.aclose()  # type: ignore[attr-defined]
        async with asyncio.timeout(HANG_GUARD_S):
            while not closed:
                await asyncio.sleep(0.01)
        assert closed == ["closed"], leave


async def test_a_stream_left_waiting_at_a_yield_is_closed_too() -> None:
    closed = []

    async def eager() -> AsyncIterator[int]:
        try:
            for i in range(100):
                yield i  # never waits: the pump holds one item, blocked on the full queue
        finally:
            closed.append("closed")

    it = kept_alive(eager(), INTERVAL_S, lambda: -1)
    assert await anext(it) == 0
    await asyncio.sleep(0)
    await it.aclose()  # type: ignore[attr-defined]
    assert closed == ["closed"]


async def test_an_error_of_the_stream_reaches_the_consumer() -> None:
    async def failing() -> AsyncIterator[str]:
        yield "a"
        raise ValueError("broken")

    it = kept_alive(failing(), INTERVAL_S, ping)
    assert await take(it) == "a"
    with pytest.raises(ValueError, match="broken"):
        await take(it)


async def test_the_stream_runs_at_most_one_item_ahead_of_its_consumer() -> None:
    produced = 0

    async def counting() -> AsyncIterator[int]:
        nonlocal produced
        for i in range(100):
            produced += 1
            yield i

    it = kept_alive(counting(), INTERVAL_S, lambda: -1)
    assert await anext(it) == 0
    for _ in range(10):
        await asyncio.sleep(0)
    assert produced <= 3  # the one taken, the one in the queue, the one the pump holds
    assert [x async for x in it] == list(range(1, 100))


async def test_one_task_per_stream_not_one_per_item() -> None:
    loop = asyncio.get_running_loop()
    created = 0
    factory = loop.get_task_factory()

    def counting(loop: asyncio.AbstractEventLoop, coro: Any, **kw: Any) -> asyncio.Future[Any]:
        nonlocal created
        created += 1
        return factory(loop, coro, **kw) if factory else asyncio.Task(coro, loop=loop, **kw)

    async def ticking() -> AsyncIterator[int]:
        for i in range(1000):
            await asyncio.sleep(0)  # every item waits, as a token does for the worker
            yield i

    loop.set_task_factory(counting)
    try:
        assert [x async for x in kept_alive(ticking(), INTERVAL_S, lambda: -1)] == list(range(1000))
    finally:
        loop.set_task_factory(factory)
    assert created == 1


def test_the_sse_keep_alive_is_a_comment_without_data() -> None:
    assert COMMENT.encode() == b": keep-alive\r\n\r\n"


def test_the_interval_is_bounded() -> None:
    from gateway import cli
    from gateway.ops.settings import out_of_bounds

    def problems(value: str) -> list[str]:
        return out_of_bounds(cli.settings_from(cli.serve_parser().parse_args(["--sse-ping-interval-s", value])))

    assert problems("0") == problems("0.1") == problems("3600") == []
    assert problems("-1") == ["--sse-ping-interval-s must be 0..3600, not -1"]
    assert problems("3601") == ["--sse-ping-interval-s must be 0..3600, not 3601"]
    assert cli.settings_from(cli.serve_parser().parse_args([])).sse_ping_interval_s == 15.0
