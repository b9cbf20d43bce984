"""POST /v1/chat/completions: read like the spec, delegate everything else."""

from __future__ import annotations

from litestar import Request, Response, post
from litestar.di import NamedDependency
from litestar.params import RawBody
from litestar.response import ServerSentEvent

from gateway.chat.convert import plan_chat, prompt_chars
from gateway.chat.shape import ChoiceShaper
from gateway.http import keepalive, relay
from gateway.http.auth import caller_of, tenant_of
from gateway.http.body import read_json
from gateway.http.disconnect import unless_disconnected
from gateway.http.headers import COMPUTE_FALLBACK_HEADER, KEEP_CACHE_HEADER, header_flag, header_true
from gateway.http.request_id import current_request_id
from gateway.http.services import Services
from protocol.chat import ChatCompletion, ChatRequest


@post("/v1/chat/completions", status_code=200)
async def chat_completions(request: Request, body: RawBody,
                           services: NamedDependency[Services]) -> Response[ChatCompletion] | Response[bytes] | ServerSentEvent:  # fmt: skip
    data = read_json(body, ChatRequest)
    entry = services.model_for(data.model, "chat")
    data = services.with_defaults(data, entry)  # the models file's, where the request has none
    # Everything about the request is checked before a model is loaded for it.
    images = await services.images(data.messages, entry, max_length=data.image_max_length)
    plan = plan_chat(data, current_request_id() or "", services.store, services.settings.grammar_dirs,
                     keep_cache=header_true(request, KEEP_CACHE_HEADER), tenant=tenant_of(request),
                     images=images, truncation=services.settings.truncation,
                     priority=services.priority(request, entry))  # fmt: skip
    accounting = services.accounting(entry.id, caller_of(request), data.user)
    completion = relay.Completion(entry.id, accounting, data.n)  # a warm-up never settles it: not counted
    worker = await completion.guard(services.worker(entry, nctx=data.nctx, compute=data.compute, ngl=data.ngl,
                                                    keep_alive=data.keep_alive,
                                                    prompt_chars=prompt_chars(data.messages, plan.generate.truncation),
                                                    draft_path=plan.draft_path,
                                                    fallback=header_flag(request, COMPUTE_FALLBACK_HEADER)))  # fmt: skip
    if not data.messages:  # warm-up: load the model, answer null
        await worker.warmup()
        return Response(content=b"null", media_type="application/json")
    completion.speculative = plan.generate.speculation is not None
    tool_format = worker.ready_info.tool_format if worker.ready_info else ""
    shapers = [ChoiceShaper(i, plan.shape, tool_format) for i in range(plan.n)]
    stream = completion.run_on(worker, plan.generations())
    if not data.stream:
        collected = relay.collect(completion, shapers, stream)
        return Response(await completion.guard(unless_disconnected(request, collected)))
    # The first message decides the status: a refused prompt is a 400, not a broken stream.
    first = await completion.guard(anext(stream))
    include_usage = bool(data.stream_options and data.stream_options.include_usage)
    return keepalive.sse(
        relay.sse(completion, shapers, first, stream, include_usage), services.settings.sse_ping_interval_s
    )


handlers = [chat_completions]
