"""POST /v1/responses, GET and DELETE /v1/responses/{id}: OpenAI's Responses API, read like its spec.

The request is translated to a chat request and planned, run and accounted exactly as
`/v1/chat/completions` is (gateway/chat/responses.py); only the answer's shape differs
(gateway/chat/responses_events.py). With `store` (the default, as at OpenAI) the answer is kept
in a bounded in-memory store (gateway/chat/response_store.py), per caller, for
`previous_response_id`, retrieval and deletion.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from litestar import Request, Response, delete, get, post
from litestar.di import NamedDependency
from litestar.params import FromPath, RawBody
from litestar.response import ServerSentEvent

from gateway.api import relay
from gateway.api.auth import caller_of, tenant_of
from gateway.api.body import read_json
from gateway.api.chat import COMPUTE_FALLBACK_HEADER, KEEP_CACHE_HEADER, header_flag, header_true
from gateway.api.disconnect import unless_disconnected
from gateway.api.request_id import current_request_id
from gateway.api.responses_stream import sse
from gateway.api.services import Services
from gateway.chat import response_store
from gateway.chat.convert import plan_chat, prompt_chars
from gateway.chat.response_store import ResponseStore, Stored
from gateway.chat.responses import answer_message, chat_request, image_fields, skeleton, wants_summary
from gateway.chat.responses_events import OutputStream
from gateway.chat.responses_tools import not_offered_headers
from gateway.chat.shape import ChoiceShaper
from gateway.errors import NotFound
from protocol import chat
from protocol import responses as r
from protocol.wire import Delta, Done, Started

_KEPT = (f"responses are kept {response_store.MAX_AGE_S / 3600:g} hour, the latest {response_store.MAX_RESPONSES:,}, "
         "only with `store: true`, and a restart forgets them")  # fmt: skip


def _stored(responses: ResponseStore, request: Request, response_id: str, field: str) -> Stored:
    found = responses.get(tenant_of(request), response_id)
    if found is None:
        raise NotFound(f"`{field}`: no stored response {response_id[:128]!r} ({_KEPT})")
    return found


async def _collect(c: relay.Completion, shaper: ChoiceShaper, out: OutputStream,
                   stream: AsyncIterator[relay.Tagged]) -> r.Response:  # fmt: skip
    """The whole answer, built by the same OutputStream as a stream (its events dropped)."""
    reason = ""

    def on_delta(_i: int, msg: Delta) -> None:
        if shaper.plain:
            out.text(msg.text)
        elif (piece := shaper.feed(msg.text, msg.logprobs)) is not None:
            out.feed(piece[0], msg.n_tokens)

    def on_done(_i: int, msg: Done) -> None:
        nonlocal reason
        if (tail := shaper.finish()) is not None:
            out.feed(tail[0], msg.completion_tokens)
        reason = shaper.finish_reason(msg.finish_reason)

    def on_started(_i: int, msg: Started) -> None:
        shaper.start(msg.reasoning_open)

    await relay.collect_events(c, stream, on_delta, on_done, on_started)
    if c.truncated is not None:
        out.response.truncated = c.truncated
    out.finish(reason, c.usage())
    return out.response


@post("/v1/responses", status_code=200)
async def create_response(request: Request, body: RawBody,
                          services: NamedDependency[Services]) -> Response[r.Response] | ServerSentEvent:  # fmt: skip
    data = read_json(body, r.ResponsesRequest)
    history: list[chat.ChatMessage] = []
    if data.previous_response_id is not None:
        history = _stored(services.responses, request, data.previous_response_id, "previous_response_id").conversation
    translated = chat_request(data, history)
    req, conversation, tools = translated.request, translated.conversation, translated.tools
    headers = not_offered_headers(tools.not_offered)
    entry = services.model_for(data.model, "chat")
    req = services.with_defaults(req, entry)  # the models file's, where the request has none
    # Everything about the request is checked before a model is loaded for it.
    images = await services.images(req.messages, entry, fields=image_fields(data))
    plan = plan_chat(req, current_request_id() or "", services.store, services.settings.grammar_dirs,
                     keep_cache=header_true(request, KEEP_CACHE_HEADER), tenant=tenant_of(request),
                     images=images, truncation=services.settings.truncation)  # fmt: skip
    accounting = services.accounting(entry.id, caller_of(request), req.user)
    completion = relay.Completion(entry.id, accounting, id_prefix="resp")
    worker = await completion.guard(services.worker(entry, nctx=data.nctx, compute=data.compute,
                                                    keep_alive=data.keep_alive,
                                                    prompt_chars=prompt_chars(req.messages, plan.generate.truncation),
                                                    fallback=header_flag(request, COMPUTE_FALLBACK_HEADER)))  # fmt: skip
    shaper = ChoiceShaper(0, plan.shape, worker.ready_info.tool_format if worker.ready_info else "")
    sampling = plan.generate.sampling
    response_id = "resp_" + completion.id.rpartition("-")[2]
    response = skeleton(data, tools, response_id, completion.created, entry.id, sampling.temperature, sampling.top_p,
                        plan.generate.truncation)  # fmt: skip
    out = OutputStream(response, tools, summary=wants_summary(data))

    def keep(response: r.Response) -> None:
        if data.store:
            services.responses.put(tenant_of(request), response, [*conversation, answer_message(response.output)])

    stream = relay.fan_out(worker, plan.generations())
    if not data.stream:
        answer = await completion.guard(unless_disconnected(request, _collect(completion, shaper, out, stream)))
        keep(answer)
        return Response(answer, headers=headers)
    # The first message decides the status: a refused prompt is a 400, not a broken stream.
    first = await completion.guard(anext(stream))
    return ServerSentEvent(sse(completion, shaper, out, first, stream, keep), headers=headers)


@get("/v1/responses/{response_id:str}")
async def retrieve_response(request: Request, response_id: FromPath[str],
                            services: NamedDependency[Services]) -> Response[r.Response]:  # fmt: skip
    return Response(_stored(services.responses, request, response_id, "response_id").response)


@delete("/v1/responses/{response_id:str}", status_code=200)
async def delete_response(request: Request, response_id: FromPath[str],
                          services: NamedDependency[Services]) -> Response[r.Deleted]:  # fmt: skip
    if not services.responses.delete(tenant_of(request), response_id):
        raise NotFound(f"`response_id`: no stored response {response_id[:128]!r} ({_KEPT})")
    return Response(r.Deleted(id=response_id))


handlers = [create_response, retrieve_response, delete_response]
