"""POST /v1/messages and /v1/messages/count_tokens: Anthropic's Messages API, read like its spec.

The request is translated to a chat request and planned, run and accounted exactly as
`/v1/chat/completions` is (gateway/dialects/anthropic/translate.py); only the answer's shape differs. Errors
on these routes have Anthropic's shape (gateway/http/error_body.py). The `anthropic-version`
header is accepted and not read: there is one version of this API here. `x-api-key` is one of
the two ways to send a key (gateway/http/auth.py).
"""

from __future__ import annotations

from litestar import Request, Response, post
from litestar.di import NamedDependency
from litestar.params import RawBody
from litestar.response import ServerSentEvent

from gateway.chat.convert import plan_chat, prompt_chars
from gateway.chat.shape import ChoiceShaper
from gateway.dialects.anthropic.stream import ping, sse
from gateway.dialects.anthropic.translate import chat_request, image_fields, message_of, not_offered
from gateway.errors import EngineFailure
from gateway.http import keepalive, relay
from gateway.http.auth import caller_of, tenant_of
from gateway.http.body import read_json
from gateway.http.disconnect import unless_disconnected
from gateway.http.headers import KEEP_CACHE_HEADER, header_true, not_offered_headers
from gateway.http.request_id import current_request_id
from gateway.http.services import Services
from protocol import anthropic as a
from protocol.wire import CountTokens, TokenCount


@post("/v1/messages", status_code=200)
async def create_message(request: Request, body: RawBody,
                         services: NamedDependency[Services]) -> Response[a.Message] | ServerSentEvent:  # fmt: skip
    data = read_json(body, a.MessagesRequest)
    req = chat_request(data)
    headers = not_offered_headers(not_offered(data.tools))
    entry = services.model_for(data.model, "chat")
    req = services.with_defaults(req, entry)  # the models file's, where the request has none
    images = await services.images(req.messages, entry, fields=image_fields(data))
    plan = plan_chat(req, current_request_id() or "", services.store, services.settings.grammar_dirs,
                     keep_cache=header_true(request, KEEP_CACHE_HEADER), tenant=tenant_of(request),
                     images=images, truncation=services.settings.truncation,
                     priority=services.priority(request, entry))  # fmt: skip
    accounting = services.accounting(entry.id, caller_of(request), req.user)
    completion = relay.Completion(entry.id, accounting, id_prefix="msg")
    chars = prompt_chars(req.messages, plan.generate.truncation)
    worker = await completion.guard(services.worker(entry, prompt_chars=chars))
    shaper = ChoiceShaper(0, plan.shape, worker.ready_info.tool_format if worker.ready_info else "")
    stream = completion.run_on(worker, plan.generations())
    if not data.stream:
        answer = await completion.guard(unless_disconnected(request, relay.collect(completion, [shaper], stream)))
        return Response(message_of(answer, completion.dones[0].stop_sequence), headers=headers)
    # The first message decides the status: a refused prompt is a 400, not a broken stream.
    first = await completion.guard(anext(stream))
    return keepalive.sse(
        sse(completion, shaper, first, stream), services.settings.sse_ping_interval_s, ping=ping, headers=headers
    )


@post("/v1/messages/count_tokens", status_code=200)
async def count_tokens(body: RawBody, services: NamedDependency[Services]) -> Response[a.TokenCount]:
    """The prompt's tokens through the model's own template and tokenizer; nothing is generated,
    so nothing is billed (as at Anthropic)."""
    data = read_json(body, a.CountTokensRequest)
    req = chat_request(data)
    entry = services.model_for(data.model, "chat")
    req = services.with_defaults(req, entry)  # the models file's, where the request has none
    images = await services.images(req.messages, entry, fields=image_fields(data))
    g = plan_chat(req, current_request_id() or "", services.store, services.settings.grammar_dirs).generate
    worker = await services.worker(entry, prompt_chars=prompt_chars(req.messages))
    reply = await worker.call(CountTokens(0, g.log_id, g.messages or [], g.template_vars, g.tools, images))
    if not isinstance(reply, TokenCount):
        raise EngineFailure(f"the worker answered a token count with {type(reply).__name__}")
    return Response(a.TokenCount(input_tokens=reply.n_tokens))


handlers = [create_message, count_tokens]
