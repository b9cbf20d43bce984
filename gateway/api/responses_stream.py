"""The Responses stream: the worker's messages for one answer as the Responses API's SSE events.

response.created and response.in_progress (once the prompt is admitted), then per output item
output_item.added, its part and text / reasoning / argument deltas and their `.done` events,
output_item.done; then response.completed, or response.incomplete when `max_output_tokens` cut
the answer. Every event has its `sequence_number`. The answer is shaped by the same ChoiceShaper
as a chat stream (reasoning split, tool calls parsed); only the rendering differs. An error after
the first byte becomes `response.failed`, with the error in the response.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

import msgspec
import structlog
from litestar.response import ServerSentEventMessage

from gateway.api.relay import Completion, Tagged
from gateway.chat.responses_events import OutputStream
from gateway.chat.shape import ChoiceShaper
from gateway.errors import GenieXError
from gateway.ops.accounting import outcome_of
from protocol import responses as r
from protocol.wire import Done, Started

log = structlog.get_logger("gateway.relay")

_encode = msgspec.json.Encoder().encode


def event(ev: r.StreamEvent) -> ServerSentEventMessage:
    """`event: <type>` and `data: <json>`, as OpenAI names every event after its `type`."""
    return ServerSentEventMessage(data=_encode(ev), event=ev.__struct_config__.tag)  # type: ignore[arg-type]


async def sse(c: Completion, shaper: ChoiceShaper, out: OutputStream, first: Tagged, rest: AsyncIterator[Tagged],
              keep: Callable[[r.Response], None]) -> AsyncIterator[ServerSentEventMessage]:  # fmt: skip
    """`keep` stores the finished response (when asked to), before its last event goes out, so
    that a client continuing from it at once finds it."""
    started = False
    item = first
    try:
        while True:
            _, msg = item
            if not started:  # a worker always sends Started first; never leave the client without it
                started = True
                for ev in out.start():
                    yield event(ev)
            if isinstance(msg, Started):
                shaper.start(msg.reasoning_open)
            elif isinstance(msg, Done):
                tail = shaper.finish()
                for ev in out.feed(tail[0], msg.completion_tokens) if tail else []:
                    yield event(ev)
                c.settle_done(0, msg)  # counted before the last bytes go out
                events = out.finish(shaper.finish_reason(msg.finish_reason), c.usage())
                keep(out.response)
                for ev in events:
                    yield event(ev)
                return
            else:
                c.first_token()
                c.tokens[0] = msg.n_tokens
                if shaper.plain:  # plain text straight into the message's text part
                    events = out.text(msg.text) if msg.text else []
                else:
                    piece = shaper.feed(msg.text, msg.logprobs)
                    events = out.feed(piece[0], msg.n_tokens) if piece is not None else []
                for ev in events:
                    yield event(ev)
            item = await anext(rest)
    except GenieXError as exc:
        c.settle("error")
        log.warning("stream failed", error=exc.message, status=exc.status)
        if not started:
            for ev in out.start():
                yield event(ev)
        for ev in out.fail(exc.message):
            yield event(ev)
    except BaseException as exc:  # the client went away (GeneratorExit, CancelledError), or a bug
        c.settle(outcome_of(exc))
        raise
