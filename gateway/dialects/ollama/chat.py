"""POST /api/chat and /api/generate: Ollama's chat and completion, read like its API.

Each is translated to the chat plan (gateway/dialects/ollama/translate.py) and run, accounted and billed as
`/v1/chat/completions` is; only the answer's shape differs: newline-delimited JSON, streamed by
default, ending with a `done: true` line that carries the reason, the token counts and the
durations. An empty request loads the model (Ollama's warm-up); with `keep_alive: 0` it unloads it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import msgspec
from litestar import Request, Response, post
from litestar.di import NamedDependency
from litestar.params import RawBody
from litestar.response import Stream

from gateway.chat.convert import Shape, cache_key, plan_chat, prompt_chars, sampling_of, stop_list
from gateway.chat.shape import ChoiceShaper
from gateway.dialects.ollama.options import keep_alive_s
from gateway.dialects.ollama.resolve import entry_for, fitted
from gateway.dialects.ollama.translate import (
    TOOL_CHOICE_HEADER,
    Clock,
    chat_request,
    done_reason,
    generate_request,
    now_rfc3339,
    raw_request,
    tool_calls_of,
)
from gateway.http import keepalive, relay
from gateway.http.auth import caller_of, tenant_of
from gateway.http.body import read_json
from gateway.http.dialect_stream import drive
from gateway.http.disconnect import unless_disconnected
from gateway.http.headers import COMPUTE_FALLBACK_HEADER, KEEP_CACHE_HEADER, header_flag, header_true
from gateway.http.request_id import current_request_id
from gateway.http.services import Services
from gateway.models.store import ModelEntry
from gateway.ops.accounting import Accounting
from gateway.supervisor.handle import WorkerHandle
from protocol import chat
from protocol import ollama as o
from protocol.wire import Done, Generate

NDJSON = "application/x-ndjson"
_encode = msgspec.json.Encoder().encode


def line(item: msgspec.Struct) -> bytes:
    return _encode(item) + b"\n"


class Timed(relay.Completion):
    """A completion whose first token is also noted on the answer's clock."""

    def __init__(self, model: str, accounting: Accounting, clock: Clock) -> None:
        super().__init__(model, accounting, id_prefix="ollama")
        self.clock = clock

    def first_token(self) -> None:
        self.clock.token()
        super().first_token()


Make = Callable[..., msgspec.Struct]  # (content, thinking, calls, done fields) -> one line of the answer


def chat_line(model: str) -> Make:
    def make(content: str = "", thinking: str | None = None, calls: list[o.OllamaToolCall] | None = None,
             **end: Any) -> msgspec.Struct:  # fmt: skip
        message = o.OutMessage(role="assistant", content=content, thinking=thinking or None, tool_calls=calls)
        return o.ChatChunk(model=model, created_at=now_rfc3339(), message=message, **{"done": False, **end})

    return make


def generate_line(model: str) -> Make:
    def make(content: str = "", thinking: str | None = None, calls: list[o.OllamaToolCall] | None = None,
             **end: Any) -> msgspec.Struct:  # fmt: skip
        return o.GenerateChunk(model=model, created_at=now_rfc3339(), response=content, thinking=thinking or None,
                               **{"done": False, **end})  # fmt: skip

    return make


def _end_fields(clock: Clock, finish_reason: str | None, usage: chat.Usage) -> dict[str, Any]:
    return {"done": True, "done_reason": done_reason(finish_reason),
            **clock.timings(usage.prompt_tokens, usage.completion_tokens), "energy_j": usage.energy_j}  # fmt: skip


class OllamaLines:
    """The dialect_stream Renderer of Ollama's answer: a line per piece of text or thinking; tool
    calls whole, in one line once the answer is done (Ollama's clients read their arguments as
    objects, never fragments); then the `done` line."""

    def __init__(self, make: Make, clock: Clock) -> None:
        self.make = make
        self.clock = clock
        self.calls: dict[int, list[str]] = {}  # index -> [name, arguments so far]

    def start(self, prompt_tokens: int, cached_tokens: int) -> Sequence[msgspec.Struct]:
        return ()

    def text(self, text: str) -> Sequence[msgspec.Struct]:
        return [self.make(text)]

    def piece(self, delta: chat.ChunkDelta, n_tokens: int) -> Sequence[msgspec.Struct]:
        for call in delta.tool_calls or ():
            name_args = self.calls.setdefault(call.index, ["", ""])
            name_args[0] = name_args[0] or call.function.name or ""
            name_args[1] += call.function.arguments or ""
        thinking = delta.reasoning_content or delta.reasoning
        return [self.make(delta.content or "", thinking)] if delta.content or thinking else []

    def close(self) -> Sequence[msgspec.Struct]:
        if not self.calls:
            return ()
        calls = [chat.ToolCall(id=f"call_{i}", function=chat.FunctionCall(n, a))
                 for i, (n, a) in sorted(self.calls.items())]  # fmt: skip
        return [self.make("", None, tool_calls_of(calls))]

    def end(self, finish_reason: str, done: Done, usage: chat.Usage) -> Sequence[msgspec.Struct]:
        return [self.make("", None, None, **_end_fields(self.clock, finish_reason, usage))]

    def fail(self, message: str, status: int, started: bool) -> Sequence[msgspec.Struct]:
        return [o.Error(message)]


async def _answer(request: Request, c: Timed, worker: WorkerHandle, generations: list[Generate], shape: Shape,
                  stream: bool, make: Make, ping_s: float) -> Response[bytes] | Stream:  # fmt: skip
    """Run the generation; the whole answer as one JSON object, or its lines as they come, with a line
    of no text whenever none went out for `ping_s` (a blank line would break Ollama's clients, which
    parse every line as JSON; an empty piece is one they already read)."""
    c.clock.ready()
    shaper = ChoiceShaper(0, shape, worker.ready_info.tool_format if worker.ready_info else "")
    messages = c.run_on(worker, generations)
    if not stream:
        done = await c.guard(unless_disconnected(request, relay.collect(c, [shaper], messages)))
        choice = done.choices[0]
        m = choice.message
        end = _end_fields(c.clock, choice.finish_reason, done.usage)
        body = make(m.content or "", m.reasoning_content or m.reasoning, tool_calls_of(m.tool_calls), **end)
        return Response(_encode(body), media_type="application/json")
    first = await c.guard(anext(messages))  # a refused prompt is a 400, not a broken stream
    lines = drive(c, shaper, OllamaLines(make, c.clock), first, messages, line)
    return Stream(keepalive.kept_alive(lines, ping_s, lambda: line(make()), before_first=True), media_type=NDJSON)


async def _load_or_unload(services: Services, entry: ModelEntry, keep_alive: float | None, make: Make,
                          clock: Clock) -> Response[bytes]:  # fmt: skip
    """Ollama's empty request: load the model (`done_reason: load`), or with `keep_alive: 0` unload
    it (`unload`; a worker still answering stops once it is done)."""
    if keep_alive == 0:
        residents = services.pool.residents_of(entry.id)
        for h in residents:
            h.keep_alive = 0.0  # the idle reaper stops it as soon as it has no request
        if residents and all(h.idle for h in residents):
            await services.pool.unload(entry.id)
        reason = "unload"
    else:
        worker = await services.worker(entry, keep_alive=keep_alive, claim=False)
        await worker.warmup()
        reason = "load"
    clock.ready()
    return Response(_encode(make("", None, None, done=True, done_reason=reason)), media_type="application/json")


@post("/api/chat", status_code=200)
async def ollama_chat(request: Request, body: RawBody, services: NamedDependency[Services]) -> Response[bytes] | Stream:
    clock = Clock()
    data = read_json(body, o.OllamaChatRequest)
    keep_alive = keep_alive_s(data.keep_alive)
    entry = entry_for(services, data.model, "chat")
    make = chat_line(data.model)
    if not data.messages:
        return await _load_or_unload(services, entry, keep_alive, make, clock)
    req = services.with_defaults(chat_request(data, keep_alive, request.headers.get(TOOL_CHOICE_HEADER)), entry)
    req = fitted(services, entry, req)
    images = await services.images(req.messages, entry)
    plan = plan_chat(req, current_request_id() or "", services.store, services.settings.grammar_dirs,
                     keep_cache=header_true(request, KEEP_CACHE_HEADER), tenant=tenant_of(request), images=images,
                     truncation=services.settings.truncation, priority=services.priority(request, entry))  # fmt: skip
    c = Timed(entry.id, services.accounting(entry.id, caller_of(request), None), clock)
    worker = await c.guard(services.worker(entry, nctx=req.nctx, ngl=req.ngl, keep_alive=keep_alive,
                                           prompt_chars=prompt_chars(req.messages, plan.generate.truncation),
                                           fallback=header_flag(request, COMPUTE_FALLBACK_HEADER)))  # fmt: skip
    return await _answer(
        request, c, worker, plan.generations(), plan.shape, data.stream, make, services.settings.sse_ping_interval_s
    )


@post("/api/generate", status_code=200)
async def ollama_generate(request: Request, body: RawBody,
                          services: NamedDependency[Services]) -> Response[bytes] | Stream:  # fmt: skip
    clock = Clock()
    data = read_json(body, o.GenerateRequest)
    keep_alive = keep_alive_s(data.keep_alive)
    raw = data.raw or bool(data.suffix)
    entry = entry_for(services, data.model, "completion" if raw else "chat")
    make = generate_line(data.model)
    if not data.prompt and not data.suffix and not data.images:
        return await _load_or_unload(services, entry, keep_alive, make, clock)
    tenant = tenant_of(request)
    if raw:
        req = services.with_defaults(raw_request(data), entry)
        req = fitted(services, entry, req)
        generations = [Generate(req_id=0, log_id=current_request_id() or "", prompt=data.prompt or "",
                                suffix=data.suffix or None, max_tokens=req.max_tokens, stop=stop_list(req.stop),
                                sampling=sampling_of(req), cache_key=cache_key(req, tenant),
                                priority=services.priority(request, entry))]  # fmt: skip
        shape, chars = Shape(), len(data.prompt or "") + len(data.suffix or "")
    else:
        req = services.with_defaults(generate_request(data, keep_alive), entry)
        req = fitted(services, entry, req)
        images = await services.images(req.messages, entry)
        plan = plan_chat(req, current_request_id() or "", services.store, services.settings.grammar_dirs,
                         tenant=tenant, images=images, truncation=services.settings.truncation,
                         priority=services.priority(request, entry))  # fmt: skip
        generations, shape = plan.generations(), plan.shape
        chars = prompt_chars(req.messages, plan.generate.truncation)
    c = Timed(entry.id, services.accounting(entry.id, caller_of(request), None), clock)
    worker = await c.guard(services.worker(entry, nctx=req.nctx, ngl=req.ngl, keep_alive=keep_alive,
                                           prompt_chars=chars,
                                           fallback=header_flag(request, COMPUTE_FALLBACK_HEADER)))  # fmt: skip
    return await _answer(
        request, c, worker, generations, shape, data.stream, make, services.settings.sse_ping_interval_s
    )


handlers = [ollama_chat, ollama_generate]
