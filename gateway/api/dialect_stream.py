"""One answer's worker messages as an agent dialect's SSE events (Anthropic Messages, OpenAI
Responses): the one driver both streams run, with each dialect's rendering behind `Renderer`.

The driver owns what must not differ between them: the answer is shaped by the same ChoiceShaper
as a chat stream (reasoning split, tool calls parsed); the stream opens once the prompt is
admitted (so the opening can carry its token count), and always opens before anything else goes
out; the answer is counted before its last bytes go out; an error after the first byte becomes
the dialect's error events; a client that leaves is counted as such.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Protocol

import msgspec
import structlog
from litestar.response import ServerSentEventMessage

from gateway.api.relay import Completion, Tagged
from gateway.chat.shape import ChoiceShaper
from gateway.errors import GenieXError
from gateway.ops.accounting import outcome_of
from protocol.chat import ChunkDelta, Usage
from protocol.wire import Done, Started

log = structlog.get_logger("gateway.relay")

_encode = msgspec.json.Encoder().encode


def event(ev: msgspec.Struct) -> ServerSentEventMessage:
    """`event: <type>` and `data: <json>`: both dialects name every event after its `type` tag."""
    return ServerSentEventMessage(data=_encode(ev), event=ev.__struct_config__.tag)  # type: ignore[arg-type]


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


async def sse(c: Completion, shaper: ChoiceShaper, render: Renderer, first: Tagged,
              rest: AsyncIterator[Tagged]) -> AsyncIterator[ServerSentEventMessage]:  # fmt: skip
    started = False
    item = first
    try:
        while True:
            _, msg = item
            if not started:  # a worker always sends Started first; never leave the client without the opening
                tokens = (msg.prompt_tokens, msg.cached_tokens) if isinstance(msg, Started | Done) else (0, 0)
                for ev in render.start(*tokens):
                    yield event(ev)
                started = True
            events: Sequence[msgspec.Struct] = ()
            if isinstance(msg, Started):
                shaper.start(msg.reasoning_open)
            elif isinstance(msg, Done):
                tail = shaper.finish()
                for ev in [*(render.piece(tail[0], msg.completion_tokens) if tail else []), *render.close()]:
                    yield event(ev)
                c.settle_done(0, msg)  # counted before the last bytes go out
                for ev in render.end(shaper.finish_reason(msg.finish_reason), msg, c.usage()):
                    yield event(ev)
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
                yield event(ev)
            item = await anext(rest)
    except GenieXError as exc:
        c.settle("error")
        log.warning("stream failed", error=exc.message, status=exc.status)
        for ev in render.fail(exc.message, exc.status, started):
            yield event(ev)
    except BaseException as exc:  # the client went away (GeneratorExit, CancelledError), or a bug
        c.settle(outcome_of(exc))
        raise
