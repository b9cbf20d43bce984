"""The Responses stream: the worker's messages for one answer as the Responses API's SSE events.

response.created and response.in_progress (once the prompt is admitted), then per output item
output_item.added, its part and text / reasoning / argument deltas and their `.done` events,
output_item.done; then response.completed, or response.incomplete when `max_output_tokens` cut
the answer. Every event has its `sequence_number` (gateway/chat/responses_events.py). An error
after the first byte becomes `response.failed`, with the error in the response. The driver is
gateway/api/dialect_stream.py.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

from litestar.response import ServerSentEventMessage

from gateway.api import dialect_stream
from gateway.api.relay import Completion, Tagged
from gateway.chat.responses_events import OutputStream
from gateway.chat.shape import ChoiceShaper
from protocol import responses as r
from protocol.chat import ChunkDelta, Usage
from protocol.wire import Done


class ResponsesEvents:
    def __init__(self, c: Completion, out: OutputStream, keep: Callable[[r.Response], None]) -> None:
        self.c = c
        self.out = out
        self.keep = keep

    def start(self, prompt_tokens: int, cached_tokens: int) -> list[r.StreamEvent]:
        if self.c.truncated is not None:  # from the first event on, what truncation dropped
            self.out.response.truncated = self.c.truncated
        return self.out.start()

    def text(self, text: str) -> list[r.StreamEvent]:
        return self.out.text(text)

    def piece(self, delta: ChunkDelta, n_tokens: int) -> list[r.StreamEvent]:
        return self.out.feed(delta, n_tokens)

    def close(self) -> list[r.StreamEvent]:
        return []  # finish() closes the last item, as completed or as cut short

    def end(self, finish_reason: str, done: Done, usage: Usage) -> list[r.StreamEvent]:
        events = self.out.finish(finish_reason, usage)
        self.keep(self.out.response)  # stored before its last event goes out: a client continuing at once finds it
        return events

    def fail(self, message: str, status: int, started: bool) -> list[r.StreamEvent]:
        return [*([] if started else self.out.start()), *self.out.fail(message)]


def sse(c: Completion, shaper: ChoiceShaper, out: OutputStream, first: Tagged, rest: AsyncIterator[Tagged],
        keep: Callable[[r.Response], None]) -> AsyncIterator[ServerSentEventMessage]:  # fmt: skip
    """`keep` stores the finished response (when asked to)."""
    return dialect_stream.sse(c, shaper, ResponsesEvents(c, out, keep), first, rest)
