"""Keep-alives for a stream that goes quiet (`--sse-ping-interval-s`).

A long prompt can take minutes to prefill on a laptop's CPU, and a Responses stream is silent
while an MCP tool runs between its rounds; a client or proxy that reads with a 60 s timeout gives
up on a stream that sends nothing meanwhile. `kept_alive` passes a stream's items through and,
whenever none has gone out for the interval, sends the dialect's own no-op instead: an SSE
comment line (`: keep-alive`, which every SSE parser skips) for OpenAI's streams, Anthropic's
`ping` event, an Ollama line with no text. Keep-alives go on in every silent gap, not only
before the first token; one never goes before the stream's first item unless the dialect allows
it (`before_first`: Anthropic's `message_start` must come first).

A wait on the stream cannot be given a timeout without cancelling the stream itself, so the
stream runs in one task of its own for its whole life and hands its items over a one-place queue
(back-pressure is kept: it is at most one item ahead of the client). That costs one task switch
per item, and no task or timer per item: one timer per interval looks for silence. Cancelling
the consumer (the client left, Litestar cancels the response) cancels that task, whose stream
then ends as it would have: its request cancelled on the worker and billed as such.
"""

from __future__ import annotations

import asyncio
import typing
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Final, Generic, TypeVar

from litestar.response import ServerSentEvent, ServerSentEventMessage

T = TypeVar("T")

# Below this a keep-alive would be most of what a stream sends; `--sse-ping-interval-s` under it counts as it.
MIN_INTERVAL_S: Final = 0.1

COMMENT: Final = ServerSentEventMessage(data=None, comment="keep-alive")
"""`: keep-alive` and the blank line: no `data:` line, so no event reaches an SSE client."""

SSEItem = bytes | ServerSentEventMessage


def _comment() -> ServerSentEventMessage:
    return COMMENT


def sse(content: AsyncIterator[SSEItem], interval_s: float, *, ping: Callable[[], SSEItem] = _comment,
        headers: Mapping[str, str] | None = None) -> ServerSentEvent:  # fmt: skip
    """An SSE response of `content` (bytes are `data:` payloads), kept alive every `interval_s`."""
    return ServerSentEvent(kept_alive(content, interval_s, ping), headers=headers)


def kept_alive(source: AsyncIterator[T], interval_s: float, ping: Callable[[], T], *,
               before_first: bool = False) -> AsyncIterator[T]:  # fmt: skip
    """`source`'s items, with `ping()` sent whenever none went out for `interval_s` (0: `source` itself)."""
    if interval_s <= 0:
        return source
    return _kept_alive(source, max(interval_s, MIN_INTERVAL_S), ping, before_first)


class _Signal:
    pass


_PING: Final = _Signal()
_END: Final = _Signal()


class _Failed:
    def __init__(self, exc: Exception) -> None:
        self.exc = exc


class _Silence(Generic[T]):
    """When an item last went out, and the one timer that puts a ping in the queue once the stream has
    been silent for the interval while its consumer waits."""

    def __init__(self, queue: asyncio.Queue[T | _Signal | _Failed], interval_s: float, armed: bool) -> None:
        self.loop = asyncio.get_running_loop()
        self.queue = queue
        self.interval_s = interval_s
        self.armed = armed  # may a ping go out yet (not before the first item, unless the dialect allows it)
        self.waiting = False  # is the consumer waiting on the queue (not writing to a slow client)
        self.last = self.loop.time()
        self.timer = self.loop.call_at(self.last + interval_s, self.tick)

    def tick(self) -> None:
        now = self.loop.time()
        if self.waiting and self.armed and now - self.last >= self.interval_s and self.queue.empty():
            self.queue.put_nowait(_PING)
            self.last = now
        due = self.last + self.interval_s
        self.timer = self.loop.call_at(due if due > now else now + self.interval_s, self.tick)


async def _pump(source: AsyncIterator[T], queue: asyncio.Queue[T | _Signal | _Failed]) -> None:
    try:
        async for item in source:
            await queue.put(item)
        await queue.put(_END)
    except Exception as exc:  # noqa: BLE001 - handed to the consumer, who raises it
        await queue.put(_Failed(exc))
    finally:
        # Cancelled while the stream waits at a yield: close it now (its request cancelled, billed),
        # not when it is collected.
        aclose = getattr(source, "aclose", None)
        if aclose is not None:
            await aclose()


async def _kept_alive(source: AsyncIterator[T], interval_s: float, ping: Callable[[], T],
                      before_first: bool) -> AsyncIterator[T]:  # fmt: skip
    queue: asyncio.Queue[T | _Signal | _Failed] = asyncio.Queue(maxsize=1)
    pump = asyncio.create_task(_pump(source, queue))  # the request's context: its deadline, its request id
    silence = _Silence(queue, interval_s, before_first)
    loop = silence.loop
    try:
        while True:
            silence.waiting = True
            item = await queue.get()
            silence.waiting = False
            silence.last = loop.time()
            if item is _PING:
                yield ping()
            elif item is _END:
                return
            elif isinstance(item, _Failed):
                raise item.exc
            else:
                silence.armed = True
                yield typing.cast(T, item)
    finally:
        silence.timer.cancel()
        if not pump.done():
            pump.cancel()
            # The pump closes the stream as it ends; wait for that unless this task is being cancelled
            # again (an anyio cancel scope repeats it), in which case the pump ends on its own.
            await asyncio.gather(pump, return_exceptions=True)
