"""The streamed routes' billing rule (gateway/http/stream_billing.py): counted once, before the
final bytes go out, and once however the stream stops."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import pytest

from gateway.chat.convert import Shape
from gateway.chat.shape import ChoiceShaper
from gateway.dialects.openai.speech import Tally, events
from gateway.errors import WorkerDied
from gateway.http.relay import Completion, sse
from gateway.http.stream_billing import FINAL, Stream, billed
from protocol.wire import Audio, Delta, Done

Log = list[object]


def driven(log: Log, *items: bytes | Exception, wait: bool = False) -> AsyncIterator[bytes]:
    """`billed` over a route that yields `items` (FINAL before the "end"), logging each chunk as
    the consumer gets it and each settle as it happens, so their order is the log's."""

    async def route() -> Stream[bytes]:
        try:
            for item in items:
                if isinstance(item, Exception):
                    raise item
                if item == b"end":
                    yield FINAL
                yield item
            if wait:
                await asyncio.sleep(60)
        finally:
            log.append("route closed")

    return billed(
        route(), lambda outcome: log.append(("settle", outcome)), lambda exc: [b"error: " + exc.message.encode()]
    )


async def consume(log: Log, stream: AsyncIterator[bytes]) -> None:
    async for chunk in stream:
        log.append(chunk)


def settles(log: Log) -> list[object]:
    return [x for x in log if isinstance(x, tuple)]


async def test_settled_once_before_the_final_bytes() -> None:
    log: Log = []
    await consume(log, driven(log, b"a", b"b", b"end", b"[DONE]"))
    assert log == [b"a", b"b", ("settle", "ok"), b"end", b"[DONE]", "route closed"]


async def test_a_client_that_leaves_is_counted_once_as_cancelled() -> None:
    log: Log = []
    stream = driven(log, b"a", b"b", b"end", b"[DONE]")
    assert await anext(stream) == b"a"
    await stream.aclose()  # what Litestar does when the write to a gone client fails
    assert log == [("settle", "cancelled"), "route closed"]

    # left while reading the ending: already counted, and not again
    log = []
    stream = driven(log, b"a", b"end", b"[DONE]")
    chunks = [await anext(stream), await anext(stream)]
    await stream.aclose()
    assert chunks == [b"a", b"end"] and settles(log) == [("settle", "ok")]


async def test_a_cancelled_stream_is_counted_once() -> None:
    log: Log = []
    task = asyncio.ensure_future(consume(log, driven(log, b"a", wait=True)))
    while b"a" not in log:
        await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert log == [b"a", "route closed", ("settle", "cancelled")]  # the route's await was cancelled first


async def test_a_failing_route_is_counted_once_then_sends_its_error_chunks() -> None:
    log: Log = []
    await consume(log, driven(log, b"a", WorkerDied("gone"), b"end"))
    assert log == [b"a", "route closed", ("settle", "error"), b"error: gone"]

    # a bug is counted as an error too, and raised
    log = []
    with pytest.raises(ZeroDivisionError):
        await consume(log, driven(log, b"a", ZeroDivisionError()))
    assert settles(log) == [("settle", "error")]


async def test_a_route_that_marks_no_ending_is_still_counted_once() -> None:
    log: Log = []
    await consume(log, driven(log, b"a"))
    assert log == [b"a", "route closed", ("settle", "ok")]


# ---- the routes that run it -------------------------------------------------


class Books:
    """An Accounting stand-in that logs its settles into the stream's log."""

    def __init__(self, log: Log) -> None:
        self.log = log

    def first_token(self) -> None:
        pass

    def running(self) -> None:
        pass

    def energy_j(self) -> float | None:
        return None

    def settle(self, outcome: str, prompt: int, completion: int, cached: int = 0) -> None:
        self.log.append(("settle", outcome, prompt, completion))


async def messages(*msgs: tuple[int, Delta | Done]) -> AsyncIterator[tuple[int, Delta | Done]]:
    for msg in msgs:
        yield msg


async def test_chat_counts_before_the_last_finish_chunk_and_a_cancelled_choice_as_cancelled() -> None:
    log: Log = []
    c = Completion("m", Books(log), n=2)  # type: ignore[arg-type]
    rest = messages((1, Delta(2, "b", 1)), (0, Done(1, "stop", 3, 1)), (1, Done(2, "cancelled", 3, 1)))
    shapers = [ChoiceShaper(i, Shape()) for i in range(2)]
    async for chunk in sse(c, shapers, (0, Delta(1, "a", 1)), rest, include_usage=True):
        log.append(json.loads(chunk) if chunk != b"[DONE]" else chunk)
    at = log.index(("settle", "cancelled", 3, 2))
    finishes = [
        i for i, x in enumerate(log) if isinstance(x, dict) and x["choices"] and x["choices"][0]["finish_reason"]
    ]
    assert finishes[0] < at < finishes[1] and log[-2]["usage"]["completion_tokens"] == 2 and log[-1] == b"[DONE]"


async def test_speech_counts_before_the_done_event_and_once_on_an_error() -> None:
    log: Log = []
    tally = Tally(Books(log), 5)  # type: ignore[arg-type]

    async def sentences(*msgs: Audio | Done | Exception) -> AsyncIterator[Audio | Done]:
        for msg in msgs:
            if isinstance(msg, Exception):
                raise msg
            yield msg

    async for ev in events(Audio(1, b"\0\0" * 8, 8), sentences(Done(1, "stop", 4)), tally):
        log.append(ev.event)
    assert log == ["speech.audio.delta", ("settle", "ok", 4, 0), "speech.audio.done"]

    log = []
    tally = Tally(Books(log), 5)  # type: ignore[arg-type]
    async for ev in events(Audio(1, b"\0\0", 8), sentences(WorkerDied("gone")), tally):
        log.append((ev.event, ev.data))
    assert log[1:] == [("settle", "error", 0, 0), ("error", b'{"error":"gone"}')]
