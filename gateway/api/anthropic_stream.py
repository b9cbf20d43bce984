"""The Anthropic Messages stream: the worker's messages for one answer as Anthropic's SSE events.

message_start (once the prompt is admitted, so it carries the prompt's token count), then per
content block content_block_start / content_block_delta... / content_block_stop, then
message_delta (stop reason and the final usage) and message_stop. The answer is shaped by the same
ChoiceShaper as a chat stream (reasoning split, tool calls parsed); only the rendering differs.
An error after the first byte becomes an `error` event in Anthropic's error shape.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import msgspec
import structlog
from litestar.response import ServerSentEventMessage

from gateway.api.error_body import anthropic_error
from gateway.api.relay import Completion, Tagged
from gateway.chat.anthropic import BlockStream, message_id, stop_reason
from gateway.chat.shape import ChoiceShaper
from gateway.errors import GenieXError
from gateway.ops.accounting import outcome_of
from protocol import anthropic as a
from protocol.wire import Done, Started

log = structlog.get_logger("gateway.relay")

_encode = msgspec.json.Encoder().encode


def event(ev: a.StreamEvent) -> ServerSentEventMessage:
    """`event: <type>` and `data: <json>`, as Anthropic names every event after its `type`."""
    return ServerSentEventMessage(data=_encode(ev), event=ev.__struct_config__.tag)  # type: ignore[arg-type]


def _start(c: Completion, prompt_tokens: int, cached: int) -> ServerSentEventMessage:
    usage = a.Usage(input_tokens=prompt_tokens - cached, output_tokens=0, cache_read_input_tokens=cached)
    return event(a.MessageStart(a.Message(id=message_id(c.id), model=c.model, content=[], usage=usage)))


def _end(c: Completion, shaper: ChoiceShaper, done: Done) -> list[ServerSentEventMessage]:
    u = c.usage()
    cached = u.prompt_tokens_details.cached_tokens if u.prompt_tokens_details else 0
    reason = stop_reason(shaper.finish_reason(done.finish_reason), done.stop_sequence)
    usage = a.MessageDeltaUsage(output_tokens=u.completion_tokens, input_tokens=u.prompt_tokens - cached,
                                cache_read_input_tokens=cached)  # fmt: skip
    delta = a.MessageDelta(a.MessageDeltaBody(stop_reason=reason, stop_sequence=done.stop_sequence or None), usage)
    return [event(delta), event(a.MessageStop())]


async def sse(c: Completion, shaper: ChoiceShaper, first: Tagged,
              rest: AsyncIterator[Tagged]) -> AsyncIterator[ServerSentEventMessage]:  # fmt: skip
    blocks = BlockStream()
    started = False
    item = first
    try:
        while True:
            _, msg = item
            if isinstance(msg, Started):
                shaper.start(msg.reasoning_open)
                if not started:
                    started = True
                    yield _start(c, msg.prompt_tokens, msg.cached_tokens)
            elif isinstance(msg, Done):
                if not started:
                    yield _start(c, msg.prompt_tokens, msg.cached_tokens)
                tail = shaper.finish()
                for ev in [*(blocks.feed(tail[0]) if tail else []), *blocks.finish()]:
                    yield event(ev)
                c.settle_done(0, msg)  # counted before the last bytes go out
                for e in _end(c, shaper, msg):
                    yield e
                return
            else:
                if not started:  # a worker always sends Started first; never leave the client without one
                    started = True
                    yield _start(c, 0, 0)
                c.first_token()
                c.tokens[0] = msg.n_tokens
                if shaper.plain:  # the common case: text straight into the text block
                    events = blocks.text(msg.text) if msg.text else []
                else:
                    piece = shaper.feed(msg.text, msg.logprobs)
                    events = blocks.feed(piece[0]) if piece is not None else []
                for ev in events:
                    yield event(ev)
            item = await anext(rest)
    except GenieXError as exc:
        c.settle("error")
        log.warning("stream failed", error=exc.message, status=exc.status)
        yield event(anthropic_error(exc.status, exc.message)[1])
    except BaseException as exc:  # the client went away (GeneratorExit, CancelledError), or a bug
        c.settle(outcome_of(exc))
        raise
