"""Relays a worker's Deltas to the client: one JSON body, or SSE chunks as they come."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
import msgspec
import structlog

from gateway.errors import GenieXError
from protocol.chat import (
    AssistantMessage,
    ChatCompletion,
    ChatCompletionChunk,
    Choice,
    ChunkChoice,
    ChunkDelta,
    Usage,
)
from protocol.wire import Delta, Done

log = structlog.get_logger("gateway.relay")

_encode = msgspec.json.Encoder().encode
CHUNK = "chat.completion.chunk"


class Completion:
    """Identity shared by a response and all of its chunks."""

    def __init__(self, model: str) -> None:
        self.id = f"chatcmpl-{uuid.uuid4().hex[:24]}"
        self.created = int(time.time())
        self.model = model
        self.done: Done | None = None
        self.completion_tokens = 0

    def usage(self) -> Usage:
        d = self.done
        prompt = d.prompt_tokens if d else 0
        completion = d.completion_tokens if d else self.completion_tokens
        return Usage(prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion)


async def collect(c: Completion, first: Delta | Done, rest: AsyncIterator[Delta | Done]) -> ChatCompletion:
    parts: list[str] = []
    msg: Delta | Done = first
    while True:
        if isinstance(msg, Done):
            c.done = msg
            break
        parts.append(msg.text)
        msg = await anext(rest)
    choice = Choice(index=0, message=AssistantMessage(content="".join(parts)), finish_reason=c.done.finish_reason)
    return ChatCompletion(id=c.id, created=c.created, model=c.model, choices=[choice], usage=c.usage())


def _chunk(c: Completion, delta: ChunkDelta, finish: str | None = None) -> bytes:
    return _encode(
        ChatCompletionChunk(
            id=c.id, object=CHUNK, created=c.created, model=c.model, choices=[ChunkChoice(index=0, delta=delta, finish_reason=finish)]
        )
    )


async def sse(
    c: Completion, first: Delta | Done, rest: AsyncIterator[Delta | Done], include_usage: bool
) -> AsyncIterator[bytes]:
    """SSE `data:` payloads. Errors after the first byte become an error event, then [DONE]."""
    msg: Delta | Done = first
    yield _chunk(c, ChunkDelta(role="assistant", content=""))
    try:
        while True:
            if isinstance(msg, Done):
                c.done = msg
                yield _chunk(c, ChunkDelta(), msg.finish_reason)
                break
            if msg.text:
                yield _chunk(c, ChunkDelta(content=msg.text))
            c.completion_tokens = msg.n_tokens
            msg = await anext(rest)
    except GenieXError as exc:
        log.warning("stream failed", error=exc.message, status=exc.status)
        yield _encode({"error": exc.message})
    if include_usage and c.done is not None:
        yield _encode(ChatCompletionChunk(id=c.id, object=CHUNK, created=c.created, model=c.model, choices=[], usage=c.usage()))
    yield b"[DONE]"
