"""One answer's worker messages as a dialect's stream (Anthropic Messages and OpenAI Responses as
SSE events, Ollama as JSON lines): the one driver they all run, with each dialect's rendering
behind `Renderer` and its framing (`event`, or a JSON line) passed in.

The driver owns what must not differ between them: the answer is shaped by the same ChoiceShaper
as a chat stream (reasoning split, tool calls parsed); the stream opens once the prompt is
admitted (so the opening can carry its token count), and always opens before anything else goes
out; `render.end`'s events are the stream's ending, sent once the answer is counted; an error
after the first byte becomes the dialect's error events (the counting is stream_billing's).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from typing import Protocol, TypeVar

import msgspec
from litestar.response import ServerSentEventMessage

from gateway.chat.shape import ChoiceShaper
from gateway.errors import GenieXError
from gateway.http.encoding import encode
from gateway.http.relay import Completion, Tagged
from gateway.http.stream_billing import FINAL, Stream, billed
from protocol.chat import ChunkDelta, Usage
from protocol.wire import Done, Started

T = TypeVar("T")


def event(ev: msgspec.Struct) -> ServerSentEventMessage:
    """`event: <type>` and `data: <json>`: the dialects (and the audio routes' streams) name every
    event after its `type` tag."""
    return ServerSentEventMessage(data=encode(ev), event=ev.__struct_config__.tag)  # type: ignore[arg-type]


class Renderer(Protocol):
    """One dialect's events for each step of an answer."""

    def start(self, prompt_tokens: int, cached_tokens: int) -> Sequence[msgspec.Struct]: ...

    def text(self, text: str) -> Sequence[msgspec.Struct]:
        """Plain text, the common case (no reasoning, no tools)."""
        ...

    def piece(self, delta: ChunkDelta, n_tokens: int) -> Sequence[msgspec.Struct]:
        """A piece the shaper made: reasoning, content or a tool call's fragment."""
        ...

    def close(self) -> Sequence[msgspec.Struct]:
        """The answer's last output, before it is counted."""
        ...

    def end(self, finish_reason: str, done: Done, usage: Usage) -> Sequence[msgspec.Struct]:
        """The closing events, once the answer is counted."""
        ...

    def fail(self, message: str, status: int, started: bool) -> Sequence[msgspec.Struct]: ...


def sse(c: Completion, shaper: ChoiceShaper, render: Renderer, first: Tagged,
        rest: AsyncIterator[Tagged]) -> AsyncIterator[ServerSentEventMessage]:  # fmt: skip
    return drive(c, shaper, render, first, rest, event)


def drive(c: Completion, shaper: ChoiceShaper, render: Renderer, first: Tagged, rest: AsyncIterator[Tagged],
          frame: Callable[[msgspec.Struct], T]) -> AsyncIterator[T]:  # fmt: skip
    """The stream of one answer, each of `render`'s events framed by `frame`."""
    started = False

    async def answer() -> Stream[T]:
        nonlocal started
        item = first
        while True:
            _, msg = item
            if not started:  # a worker always sends Started first; never leave the client without the opening
                if isinstance(msg, Started):
                    c.started(msg)  # the opening says what truncation dropped
                tokens = (msg.prompt_tokens, msg.cached_tokens) if isinstance(msg, Started | Done) else (0, 0)
                for ev in render.start(*tokens):
                    yield frame(ev)
                started = True
            events: Sequence[msgspec.Struct] = ()
            if isinstance(msg, Started):
                shaper.start(msg.reasoning_open)
            elif isinstance(msg, Done):
                tail = shaper.finish()
                for ev in [*(render.piece(tail[0], msg.completion_tokens) if tail else []), *render.close()]:
                    yield frame(ev)
                c.record_done(0, msg)
                yield FINAL
                for ev in render.end(shaper.finish_reason(msg.finish_reason), msg, c.usage()):
                    yield frame(ev)
                return
            else:
                c.first_token()
                c.tokens[0] = msg.n_tokens
                if shaper.plain:
                    events = render.text(msg.text) if msg.text else []
                else:
                    piece = shaper.feed(msg.text, msg.logprobs)
                    events = render.piece(piece[0], msg.n_tokens) if piece is not None else []
            for ev in events:
                yield frame(ev)
            item = await anext(rest)

    def fail(exc: GenieXError) -> list[T]:
        return [frame(ev) for ev in render.fail(exc.message, exc.status, started)]

    return billed(answer(), c.settle, fail)
