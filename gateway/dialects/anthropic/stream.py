"""The Anthropic Messages stream: the worker's messages for one answer as Anthropic's SSE events.

message_start (once the prompt is admitted, so it carries the prompt's token count), then per
content block content_block_start / content_block_delta... / content_block_stop, then
message_delta (stop reason and the final usage) and message_stop; a `ping` after message_start
whenever the stream is silent for `--sse-ping-interval-s`. An error after the first byte becomes an
`error` event in Anthropic's error shape. The driver is gateway/http/dialect_stream.py.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import msgspec
from litestar.response import ServerSentEventMessage

from gateway.chat.shape import ChoiceShaper
from gateway.dialects.anthropic.translate import BlockStream, message_id, stop_reason
from gateway.http import dialect_stream
from gateway.http.error_body import anthropic_error
from gateway.http.relay import Completion, Tagged
from protocol import anthropic as a
from protocol.chat import ChunkDelta, Usage
from protocol.wire import Done


class AnthropicEvents:
    def __init__(self, c: Completion) -> None:
        self.c = c
        self.blocks = BlockStream()

    def start(self, prompt_tokens: int, cached_tokens: int) -> list[a.StreamEvent]:
        usage = a.Usage(input_tokens=prompt_tokens - cached_tokens, output_tokens=0,
                        cache_read_input_tokens=cached_tokens)  # fmt: skip
        message = a.Message(id=message_id(self.c.id), model=self.c.model, content=[], usage=usage,
                            truncated=self.c.truncated or msgspec.UNSET)  # fmt: skip
        return [a.MessageStart(message)]

    def text(self, text: str) -> list[a.StreamEvent]:
        return self.blocks.text(text)

    def piece(self, delta: ChunkDelta, n_tokens: int) -> list[a.StreamEvent]:
        return self.blocks.feed(delta)

    def close(self) -> list[a.StreamEvent]:
        return self.blocks.finish()

    def end(self, finish_reason: str, done: Done, usage: Usage) -> list[a.StreamEvent]:
        cached = usage.prompt_tokens_details.cached_tokens if usage.prompt_tokens_details else 0
        body = a.MessageDeltaBody(stop_reason=stop_reason(finish_reason, done.stop_sequence),
                                  stop_sequence=done.stop_sequence or None)  # fmt: skip
        counts = a.MessageDeltaUsage(output_tokens=usage.completion_tokens, input_tokens=usage.prompt_tokens - cached,
                                     cache_read_input_tokens=cached, energy_j=usage.energy_j)  # fmt: skip
        return [a.MessageDelta(body, counts), a.MessageStop()]

    def fail(self, message: str, status: int, started: bool) -> list[a.ErrorResponse]:
        return [anthropic_error(status, message)[1]]


PING = dialect_stream.event(a.Ping())


def ping() -> ServerSentEventMessage:
    """The stream's keep-alive (gateway/http/keepalive.py): Anthropic's own `ping` event, which its
    clients skip; it may come anywhere after `message_start`."""
    return PING


def sse(c: Completion, shaper: ChoiceShaper, first: Tagged,
        rest: AsyncIterator[Tagged]) -> AsyncIterator[ServerSentEventMessage]:  # fmt: skip
    return dialect_stream.sse(c, shaper, AnthropicEvents(c), first, rest)
