"""POST /v1/completions: legacy text completion on llama.cpp models, streamed or not.

Each prompt (times `n`) is one generation on the worker; choice i is prompt i // n.
Accounting, cancellation and the SSE error/[DONE] ending are the chat relay's.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import msgspec
from litestar import Request, Response, post
from litestar.di import NamedDependency
from litestar.params import RawBody
from litestar.response import ServerSentEvent

from gateway.chat.convert import cache_key, sampling_of, seeded, stop_list
from gateway.errors import BadRequest
from gateway.http import keepalive, relay
from gateway.http.auth import caller_of, tenant_of
from gateway.http.body import read_json
from gateway.http.disconnect import unless_disconnected
from gateway.http.encoding import encode
from gateway.http.headers import COMPUTE_FALLBACK_HEADER, header_flag
from gateway.http.request_id import current_request_id
from gateway.http.services import Services
from protocol import wire
from protocol.completions import (
    CompletionChoice,
    CompletionLogprobs,
    CompletionRequest,
    TextCompletion,
)
from protocol.wire import Generate

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
async def completions(
    request: Request, body: RawBody, services: NamedDependency[Services]
) -> Response[bytes] | ServerSentEvent:
    data = read_json(body, CompletionRequest)
    entry = services.model_for(data.model, "completion")
    data = services.with_defaults(data, entry)  # the models file's sampling and stop, where the request has none
    prompts = _prompts(data)
    base = Generate(
        req_id=0,
        log_id=current_request_id() or "",
        max_tokens=data.max_tokens,
        stop=stop_list(data.stop),
        sampling=sampling_of(data),
        suffix=data.suffix,
        logprobs=data.logprobs if data.logprobs is not None else -1,
        cache=data.cache_prompt,
        cache_key=cache_key(data, tenant_of(request)),
        priority=services.priority(request, entry),
    )
    total = len(prompts) * data.n
    accounting = services.accounting(entry.id, caller_of(request), data.user)
    acct = relay.Completion(entry.id, accounting, total, data.n, id_prefix="cmpl")
    longest = max(len(p) for p in prompts) + len(data.suffix or "")
    worker = await acct.guard(services.worker(entry, nctx=data.nctx, compute=data.compute, ngl=data.ngl,
                                              keep_alive=data.keep_alive, prompt_chars=longest,
                                              fallback=header_flag(request, COMPUTE_FALLBACK_HEADER)))  # fmt: skip
    # Choice i is prompt i // n, sample i % n of it.
    generations = [seeded(msgspec.structs.replace(base, prompt=prompts[i // data.n]), i % data.n) for i in range(total)]
    merged = acct.run_on(worker, generations)
    choices = [_Choice(i, prompts[i // data.n] if data.echo else "", data.logprobs is not None) for i in range(total)]
    if not data.stream:
        answer = await acct.guard(unless_disconnected(request, _collect(acct, choices, merged)))
        return Response(encode(answer), media_type="application/json")
    first = await acct.guard(anext(merged))
    include_usage = bool(data.stream_options and data.stream_options.include_usage)
    return keepalive.sse(_sse(acct, choices, first, merged, include_usage), services.settings.sse_ping_interval_s)


async def _collect(
    acct: relay.Completion, choices: list[_Choice], stream: AsyncIterator[relay.Tagged]
) -> TextCompletion:
    reasons: dict[int, str] = {}

    def on_done(i: int, msg: wire.Done) -> None:
        reasons[i] = msg.finish_reason

    def on_delta(i: int, msg: wire.Delta) -> None:
        choices[i].add(msg)

    await relay.collect_events(acct, stream, on_delta, on_done)
    out = [CompletionChoice(c.index, "".join(c.parts), reasons.get(c.index), c.lp) for c in choices]
    return TextCompletion(id=acct.id, object=OBJECT, created=acct.created, model=acct.model, choices=out,
                          usage=acct.usage())  # fmt: skip


def _chunk(acct: relay.Completion, choice: CompletionChoice) -> bytes:
    return encode(TextCompletion(id=acct.id, object=OBJECT, created=acct.created, model=acct.model, choices=[choice]))


def _sse(acct: relay.Completion, choices: list[_Choice], first: relay.Tagged,
         rest: AsyncIterator[relay.Tagged], include_usage: bool) -> AsyncIterator[bytes]:  # fmt: skip
    def on_delta(i: int, msg: wire.Delta) -> bytes | None:
        lp = choices[i].add(msg)
        return _chunk(acct, CompletionChoice(i, msg.text, None, lp)) if msg.text or lp else None

    def on_done(i: int, msg: wire.Done) -> tuple[bytes | None, bytes]:
        return None, _chunk(acct, CompletionChoice(i, "", msg.finish_reason))

    def usage() -> bytes:
        return encode(TextCompletion(id=acct.id, object=OBJECT, created=acct.created, model=acct.model, choices=[],
                                      usage=acct.usage()))  # fmt: skip

    # An echoed prompt goes out at once.
    opening = [_chunk(acct, CompletionChoice(c.index, c.parts[0])) for c in choices if c.parts]
    return relay.stream_events(acct, first, rest, opening, on_delta, on_done, usage if include_usage else None)


handlers = [completions]
