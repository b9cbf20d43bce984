"""Relays a worker's Deltas to the client: one JSON body, or SSE chunks as they come."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TypeVar

import msgspec
import structlog

from gateway.disconnect import ClientGone
from gateway.errors import GenieXError
from gateway.metrics import RequestTimer
from protocol.chat import (
    AssistantMessage,
    ChatCompletion,
    ChatCompletionChunk,
    Choice,
    ChunkChoice,
    ChunkDelta,
    CompletionTokensDetails,
    PromptTokensDetails,
    Usage,
)
from protocol.wire import Delta, Done

log = structlog.get_logger("gateway.relay")

_encode = msgspec.json.Encoder().encode
CHUNK = "chat.completion.chunk"
T = TypeVar("T")


def outcome_of(exc: BaseException) -> str:
    """How a request that raised is counted: the client left, or it failed."""
    return "cancelled" if isinstance(exc, (asyncio.CancelledError, GeneratorExit, ClientGone)) else "error"


class Completion:
    """Identity shared by a response and all of its chunks, and the request's accounting."""

    def __init__(self, model: str, timer: RequestTimer | None = None,
                 on_usage: Callable[[int, int], None] | None = None) -> None:  # fmt: skip
        self.id = f"chatcmpl-{uuid.uuid4().hex[:24]}"
        self.created = int(time.time())
        self.model = model
        self.done: Done | None = None
        self.completion_tokens = 0
        self.timer = timer
        self.on_usage = on_usage  # (prompt_tokens, completion_tokens) -> None: the usage ledger
        self.speculative = False  # report draft tokens accepted/rejected in the usage
        self._settled = False

    def first_token(self) -> None:
        if self.timer is not None:
            self.timer.first_token()

    def settle(self, outcome: str) -> None:
        """Count the request once, in the metrics and the ledger, whichever exit the relay takes."""
        if self._settled:
            return
        self._settled = True
        u = self.usage()
        # Read by the request's summary log line (same task, same context).
        structlog.contextvars.bind_contextvars(outcome=outcome, prompt_tokens=u.prompt_tokens,
                                               completion_tokens=u.completion_tokens)  # fmt: skip
        if self.timer is not None:
            self.timer.finish(u.prompt_tokens, u.completion_tokens, outcome)
        # The ledger bills what was answered: a finished request, or the tokens a cut-short one got.
        if self.on_usage is not None and (outcome == "ok" or u.completion_tokens > 0):
            try:
                self.on_usage(u.prompt_tokens, u.completion_tokens)
            except Exception as exc:  # accounting must never break an answer already produced
                log.error("usage not recorded", error=repr(exc))

    def settle_done(self, done: Done) -> None:
        self.done = done
        self.settle("cancelled" if done.finish_reason == "cancelled" else "ok")

    async def guard(self, work: Awaitable[T]) -> T:
        """Await `work`; if it raises, count the request as failed or cancelled, then re-raise."""
        try:
            return await work
        except BaseException as exc:
            self.settle(outcome_of(exc))
            raise

    def usage(self) -> Usage:
        d = self.done
        prompt = d.prompt_tokens if d else 0
        completion = d.completion_tokens if d else self.completion_tokens
        details = PromptTokensDetails(cached_tokens=d.cached_tokens) if d and d.cached_tokens else None
        spec = None
        if self.speculative and d is not None:
            spec = CompletionTokensDetails(accepted_prediction_tokens=d.accepted_tokens,
                                           rejected_prediction_tokens=d.rejected_tokens)  # fmt: skip
        return Usage(prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion,
                     prompt_tokens_details=details, completion_tokens_details=spec)  # fmt: skip


async def collect(c: Completion, stream: AsyncIterator[Delta | Done]) -> ChatCompletion:
    parts: list[str] = []
    async for msg in stream:
        if isinstance(msg, Done):
            c.settle_done(msg)
            break
        if not c.completion_tokens:  # per-token cost: one int test; the clock is read once
            c.first_token()
        c.completion_tokens = msg.n_tokens
        parts.append(msg.text)
    assert c.done is not None
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
    try:
        yield _chunk(c, ChunkDelta(role="assistant", content=""))
        while True:
            if isinstance(msg, Done):
                c.settle_done(msg)  # counted before the final bytes go out
                yield _chunk(c, ChunkDelta(), msg.finish_reason)
                break
            if not c.completion_tokens:  # per-token cost: one int test; the clock is read once
                c.first_token()
            c.completion_tokens = msg.n_tokens
            if msg.text:
                yield _chunk(c, ChunkDelta(content=msg.text))
            msg = await anext(rest)
    except GenieXError as exc:
        c.settle("error")
        log.warning("stream failed", error=exc.message, status=exc.status)
        yield _encode({"error": exc.message})
    except BaseException as exc:  # the client went away (GeneratorExit, CancelledError), or a bug
        c.settle(outcome_of(exc))
        raise
    if include_usage and c.done is not None:
        yield _encode(ChatCompletionChunk(id=c.id, object=CHUNK, created=c.created, model=c.model, choices=[], usage=c.usage()))
    yield b"[DONE]"
