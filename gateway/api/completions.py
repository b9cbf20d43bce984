"""POST /v1/completions: legacy text completion on llama.cpp models, streamed or not.

Each prompt (times `n`) is one generation on the worker; choice i is prompt i // n.
Accounting, cancellation and the SSE error/[DONE] ending are the chat relay's.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any

import msgspec
import structlog
from litestar import Request, Response, post
from litestar.response import ServerSentEvent

from gateway.api import relay
from gateway.api.disconnect import unless_disconnected
from gateway.api.request_id import current_request_id
from gateway.chat.convert import sampling_of, stop_list
from gateway.errors import BadRequest
from gateway.models.store import ModelStore
from gateway.supervisor.pool import WorkerPool
from protocol import wire
from protocol.completions import (
    CompletionChoice,
    CompletionLogprobs,
    CompletionRequest,
    TextCompletion,
)

_encode = msgspec.json.Encoder().encode
OBJECT = "text_completion"


class _Choice:
    """One choice's text and legacy logprobs as they accumulate."""

    def __init__(self, index: int, echo: str, logprobs: bool) -> None:
        self.index = index
        self.parts = [echo] if echo else []
        self.offset = len(echo)
        self.lp: CompletionLogprobs | None = CompletionLogprobs([], [], [], []) if logprobs else None

    def add(self, msg: wire.Delta) -> CompletionLogprobs | None:
        self.parts.append(msg.text)
        if self.lp is None or not msg.logprobs:
            return None
        piece = CompletionLogprobs([], [], [], [])
        for t in msg.logprobs:
            token = t.token.decode(errors="replace")
            for lp in (self.lp, piece):
                lp.tokens.append(token)
                lp.token_logprobs.append(t.logprob)
                lp.top_logprobs.append({b.decode(errors="replace"): v for b, v in t.top})
                lp.text_offset.append(self.offset)
            self.offset += len(token)
        return piece


def _prompts(data: CompletionRequest) -> list[str]:
    prompts = [data.prompt] if isinstance(data.prompt, str) else data.prompt
    if not prompts:
        raise BadRequest("`prompt`: at least one prompt is required")
    if len(prompts) * data.n > 16:
        raise BadRequest("`prompt`, `n`: at most 16 completions per request")
    return prompts


@post("/v1/completions", status_code=200)
async def completions(request: Request, data: CompletionRequest) -> Response[bytes] | ServerSentEvent:
    store: ModelStore = request.app.state.store
    pool: WorkerPool = request.app.state.pool
    entry = store.resolve(data.model)
    if entry.engine != "llama_cpp":
        raise BadRequest(f"`model`: {entry.id} is served by {entry.engine}; text completion needs a llama.cpp model")
    prompts = _prompts(data)
    base: dict[str, Any] = {
        "log_id": current_request_id() or "",
        "max_tokens": data.max_tokens,
        "stop": stop_list(data.stop),
        "suffix": data.suffix,
        "logprobs": data.logprobs if data.logprobs is not None else -1,
    }
    sampling = sampling_of(data)
    total = len(prompts) * data.n
    acct = relay.accounted(request, entry.id, data.user, total, data.n)
    worker = await acct.guard(pool.get(pool.key_for(entry, data.nctx, data.compute, data.ngl), entry))
    structlog.contextvars.bind_contextvars(model=entry.id, worker_pid=worker.pid)
    if data.keep_alive is not None:
        worker.keepalive = data.keep_alive
    streams = []
    for i in range(total):
        seed = sampling.seed if sampling.seed is None else sampling.seed + i % data.n
        s = msgspec.structs.replace(sampling, seed=seed)
        streams.append(worker.generate(**base, prompt=prompts[i // data.n], sampling=s))
    merged = relay.merged(streams) if total > 1 else relay.tagged(streams[0])
    choices = [_Choice(i, prompts[i // data.n] if data.echo else "", data.logprobs is not None) for i in range(total)]
    cid = f"cmpl-{uuid.uuid4().hex[:24]}"
    if not data.stream:
        body = await acct.guard(unless_disconnected(request, _collect(acct, cid, choices, merged)))
        return Response(_encode(body), media_type="application/json")
    first = await acct.guard(anext(merged))
    include_usage = bool(data.stream_options and data.stream_options.include_usage)
    return ServerSentEvent(_sse(acct, cid, choices, first, merged, include_usage))


async def _collect(acct: relay.Completion, cid: str, choices: list[_Choice],
                   stream: AsyncIterator[relay.Tagged]) -> TextCompletion:  # fmt: skip
    reasons: dict[int, str] = {}
    async for i, msg in stream:
        if isinstance(msg, wire.Done):
            reasons[i] = msg.finish_reason
            if acct.settle_done(i, msg):
                break
            continue
        acct.first_token()
        acct.tokens[i] = msg.n_tokens
        choices[i].add(msg)
    out = [CompletionChoice(c.index, "".join(c.parts), reasons.get(c.index), c.lp) for c in choices]
    return TextCompletion(id=cid, object=OBJECT, created=acct.created, model=acct.model, choices=out, usage=acct.usage())


def _chunk(acct: relay.Completion, cid: str, choice: CompletionChoice) -> bytes:
    return _encode(TextCompletion(id=cid, object=OBJECT, created=acct.created, model=acct.model, choices=[choice]))


def _sse(acct: relay.Completion, cid: str, choices: list[_Choice], first: relay.Tagged,
         rest: AsyncIterator[relay.Tagged], include_usage: bool) -> AsyncIterator[bytes]:  # fmt: skip
    def on_delta(i: int, msg: wire.Delta) -> bytes | None:
        lp = choices[i].add(msg)
        return _chunk(acct, cid, CompletionChoice(i, msg.text, None, lp)) if msg.text or lp else None

    def on_done(i: int, msg: wire.Done) -> tuple[bytes | None, bytes]:
        return None, _chunk(acct, cid, CompletionChoice(i, "", msg.finish_reason))

    def usage() -> bytes:
        return _encode(TextCompletion(id=cid, object=OBJECT, created=acct.created, model=acct.model, choices=[],
                                      usage=acct.usage()))  # fmt: skip

    # An echoed prompt goes out at once.
    opening = [_chunk(acct, cid, CompletionChoice(c.index, c.parts[0])) for c in choices if c.parts]
    return relay.stream_events(acct, first, rest, opening, on_delta, on_done, usage if include_usage else None)


handlers = [completions]
