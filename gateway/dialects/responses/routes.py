"""POST /v1/responses, GET and DELETE /v1/responses/{id}: OpenAI's Responses API, read like its spec.

The request is translated to a chat request and planned, run and accounted exactly as
`/v1/chat/completions` is (gateway/dialects/responses/translate.py); only the answer's shape differs
(gateway/dialects/responses/events.py). `mcp` tools are run by the server, between rounds of the
model (gateway/dialects/responses/run.py). With `store` (the default, as at OpenAI) the answer is kept
in a bounded in-memory store (gateway/dialects/responses/store.py), per caller, for
`previous_response_id`, retrieval and deletion.
"""

from __future__ import annotations

import asyncio

from litestar import Request, Response, Router, delete, get, post
from litestar.di import NamedDependency, Provide
from litestar.params import FromPath, RawBody
from litestar.response import ServerSentEvent

from gateway.dialects.responses import store as response_store
from gateway.dialects.responses.mcp import McpUse, mcp_uses
from gateway.dialects.responses.run import ResponseRun, approvals
from gateway.dialects.responses.store import ResponseStore, Stored
from gateway.dialects.responses.translate import answer_messages, chat_request, image_fields
from gateway.errors import FailedDependency, NotFound
from gateway.http.auth import caller_of, mcp_servers_of, tenant_of
from gateway.http.body import read_json
from gateway.http.disconnect import unless_disconnected
from gateway.http.headers import not_offered_headers
from gateway.http.services import Services
from gateway.mcp.hub import Hub, McpTool, Unavailable
from gateway.supervisor.deadline import within
from protocol import chat
from protocol import responses as r

_KEPT = (f"responses are kept {response_store.MAX_AGE_S / 3600:g} hour, the latest {response_store.MAX_RESPONSES:,}, "
         "only with `store: true`, and a restart forgets them")  # fmt: skip


def _stored(responses: ResponseStore, request: Request, response_id: str, field: str) -> Stored:
    found = responses.get(tenant_of(request), response_id)
    if found is None:
        raise NotFound(f"`{field}`: no stored response {response_id[:128]!r} ({_KEPT})")
    return found


async def _listed(hub: Hub, uses: list[McpUse]) -> dict[str, tuple[McpUse, list[McpTool]]]:
    """Each `mcp` tool's server tools, listed at once; a server that cannot list them is a 424."""

    async def one(use: McpUse) -> tuple[str, tuple[McpUse, list[McpTool]]]:
        try:
            return use.where, (use, await hub.tools(use.label, use.headers))
        except Unavailable as exc:
            raise FailedDependency(f"`{use.where}`: {exc}") from None

    return dict(await within(asyncio.gather(*(one(u) for u in uses))))


@post("/v1/responses", status_code=200)
async def create_response(request: Request, body: RawBody,
                          services: NamedDependency[Services],
                          responses: NamedDependency[ResponseStore]) -> Response[r.Response] | ServerSentEvent:  # fmt: skip
    data = read_json(body, r.ResponsesRequest)
    history: list[chat.ChatMessage] = []
    if data.previous_response_id is not None:
        history = _stored(responses, request, data.previous_response_id, "previous_response_id").conversation
    entry = services.model_for(data.model, "chat")
    uses = mcp_uses(data.tools, services.mcp.configs, mcp_servers_of(request), caller_of(request))
    translated = chat_request(data, history, await _listed(services.mcp, uses) if uses else None)
    tools = translated.tools
    headers = not_offered_headers(tools.not_offered)
    req = services.with_defaults(translated.request, entry)  # the models file's, where the request has none
    # Everything about the request is checked before a model is loaded for it.
    images = await services.images(req.messages, entry, fields=image_fields(data))
    run = ResponseRun(request, services, data, entry, req, translated.conversation, tools, images)
    conversation, approved = approvals(translated.approvals, translated.conversation, tools)
    run.continue_from(conversation)
    ran = await run.run_approved(approved)
    first = await run.round()
    run.begin(first, ran)

    def keep(response: r.Response) -> None:
        if data.store:
            responses.put(tenant_of(request), response, [*run.conversation, *answer_messages(response.output)])

    run.keep = keep
    if not data.stream:
        answer = await first.c.guard(unless_disconnected(request, run.collect(first)))
        return Response(answer, headers=headers)
    return ServerSentEvent(run.sse(first), headers=headers)


@get("/v1/responses/{response_id:str}")
async def retrieve_response(request: Request, response_id: FromPath[str],
                            responses: NamedDependency[ResponseStore]) -> Response[r.Response]:  # fmt: skip
    return Response(_stored(responses, request, response_id, "response_id").response)


@delete("/v1/responses/{response_id:str}", status_code=200)
async def delete_response(request: Request, response_id: FromPath[str],
                          responses: NamedDependency[ResponseStore]) -> Response[r.Deleted]:  # fmt: skip
    if not responses.delete(tenant_of(request), response_id):
        raise NotFound(f"`response_id`: no stored response {response_id[:128]!r} ({_KEPT})")
    return Response(r.Deleted(id=response_id))


def router(store: ResponseStore) -> Router:
    """The routes, with the store they keep answers in: the dialect's own dependency, `responses`."""
    return Router(path="/", route_handlers=[create_response, retrieve_response, delete_response],
                  dependencies={"responses": Provide(lambda: store, sync_to_thread=False)})  # fmt: skip
