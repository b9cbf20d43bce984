"""`/v1/responses`: OpenAI's Responses API, read like its spec. Create, retrieve (or replay its
stream), delete, cancel, list its input items, count a request's input tokens.

The request is translated to a chat request and planned, run and accounted exactly as
`/v1/chat/completions` is (gateway/dialects/responses/translate.py); only the answer's shape differs
(gateway/dialects/responses/events.py). `mcp` tools are run by the server, between rounds of the
model (gateway/dialects/responses/run.py). With `store` (the default, as at OpenAI) the answer is kept
in the data dir (gateway/dialects/responses/store.py), per caller, for `previous_response_id`,
retrieval, its input items and deletion. `background: true` runs it without the client
(gateway/dialects/responses/background.py); `conversation` reads and extends a conversation
(gateway/dialects/responses/conversations.py has its own routes).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import time
from collections.abc import AsyncIterator
from typing import Any

import msgspec
from litestar import Request, Response, Router, delete, get, post
from litestar.di import NamedDependency, Provide
from litestar.params import FromPath, FromQuery, RawBody
from litestar.response import ServerSentEvent, ServerSentEventMessage

from gateway.chat.convert import plan_chat, prompt_chars
from gateway.dialects.responses import conversations
from gateway.dialects.responses.background import Event, Job
from gateway.dialects.responses.items import kept_items, output_items, page
from gateway.dialects.responses.mcp import McpUse, mcp_uses
from gateway.dialects.responses.run import Approved, ResponseRun, approvals
from gateway.dialects.responses.state import ResponsesState
from gateway.dialects.responses.store import Stored, settled
from gateway.dialects.responses.translate import (
    Translation,
    answer_messages,
    chat_messages,
    chat_request,
    image_fields,
    input_items,
    new_id,
    skeleton,
)
from gateway.errors import BadRequest, EngineFailure, FailedDependency, NotFound
from gateway.http import keepalive
from gateway.http.auth import caller_of, mcp_servers_of, tenant_of
from gateway.http.body import read_json
from gateway.http.disconnect import unless_disconnected
from gateway.http.headers import not_offered_headers
from gateway.http.request_id import current_request_id
from gateway.http.services import Services
from gateway.mcp.hub import Hub, McpTool, Unavailable
from gateway.supervisor.deadline import within
from protocol import chat
from protocol import responses as r
from protocol.conversations import InputTokens, InputTokensRequest, ItemList
from protocol.wire import CountTokens, TokenCount

EVICTED_HEADER = "GenieX-Evicted-Responses"  # the stored responses this request's write evicted
_KEPT = ("only with `store: true`, for as long as the key's bounds keep it (--responses-store-max, "
         "--responses-store-mb), and only for the key that made it")  # fmt: skip


def _not_found(field: str, response_id: str) -> NotFound:
    return NotFound(f"`{field}`: no stored response {response_id[:128]!r} (responses are kept {_KEPT})")


async def _stored(kept: ResponsesState, request: Request, response_id: str, field: str) -> Stored:
    found = await kept.store.get(tenant_of(request), response_id)
    if found is None:
        raise _not_found(field, response_id)
    return found


def _evicted(ids: list[str]) -> dict[str, str]:
    return {EVICTED_HEADER: ",".join(ids[:16])} if ids else {}


async def _listed(hub: Hub, uses: list[McpUse]) -> dict[str, tuple[McpUse, list[McpTool]]]:
    """Each `mcp` tool's server tools, listed at once; a server that cannot list them is a 424."""

    async def one(use: McpUse) -> tuple[str, tuple[McpUse, list[McpTool]]]:
        try:
            return use.where, (use, await hub.tools(use.label, use.headers))
        except Unavailable as exc:
            raise FailedDependency(f"`{use.where}`: {exc}") from None

    return dict(await within(asyncio.gather(*(one(u) for u in uses))))


def _conversation_id(data: r.ResponsesRequest) -> str | None:
    c = data.conversation
    conv = c.id if isinstance(c, r.ConversationRef) else c
    if conv is not None and data.previous_response_id is not None:
        raise BadRequest("`conversation`, `previous_response_id`: a response continues one or the other, not both")
    return conv


async def _history(kept: ResponsesState, request: Request, data: r.ResponsesRequest,
                   conv: str | None) -> list[chat.ChatMessage]:  # fmt: skip
    """What comes before the request's `input`: its previous response's conversation, or its conversation's items."""
    if data.previous_response_id is not None:
        return (await _stored(kept, request, data.previous_response_id, "previous_response_id")).conversation
    if conv is None:
        return []
    items = await kept.store.items(tenant_of(request), conv)
    if items is None:
        raise NotFound(f"`conversation`: no conversation {conv[:128]!r} ({conversations.KEPT})")
    return chat_messages(input_items(items))


async def _translate(kept: ResponsesState, request: Request, services: Services, data: r.ResponsesRequest,
                     conv: str | None) -> Translation:  # fmt: skip
    history = await _history(kept, request, data, conv)
    uses = mcp_uses(data.tools, services.mcp.configs, mcp_servers_of(request), caller_of(request))
    return chat_request(data, history, await _listed(services.mcp, uses) if uses else None)


@post("/v1/responses", status_code=200)
async def create_response(request: Request, body: RawBody, services: NamedDependency[Services],
                          kept: NamedDependency[ResponsesState]) -> Response[r.Response] | ServerSentEvent:  # fmt: skip
    data = read_json(body, r.ResponsesRequest)
    if data.background and not data.store:
        raise BadRequest("`background`: a background response is kept to be polled, so it needs `store: true`")
    conv = _conversation_id(data)
    owner = tenant_of(request)
    entry = services.model_for(data.model, "chat")
    translated = await _translate(kept, request, services, data, conv)
    tools = translated.tools
    headers = not_offered_headers(tools.not_offered)
    req = services.with_defaults(translated.request, entry)  # the models file's, where the request has none
    # Everything about the request is checked before a model is loaded for it.
    images = await services.images(req.messages, entry, fields=image_fields(data))
    inputs = kept_items(data.input) if data.store or conv else []
    run = ResponseRun(request, services, data, entry, req, translated.conversation, tools, images)
    run.conversation_ref = r.ConversationRef(conv) if conv is not None else None
    conversation, approved = approvals(translated.approvals, translated.conversation, tools)
    run.continue_from(conversation)
    if data.background:
        return await _background(kept, run, approved, owner, conv, inputs, headers)
    ran = await run.run_approved(approved)
    first = await run.round()
    run.begin(first, ran)
    writes: list[concurrent.futures.Future[Any]] = []

    def keep(response: r.Response) -> None:
        # Asked for before the last event goes out: a client continuing at once finds it.
        if data.store:
            writes.append(kept.store.put_soon(owner, response, inputs, [*run.conversation,
                                                                        *answer_messages(response.output)]))  # fmt: skip
        if conv is not None and response.status in ("completed", "incomplete"):
            writes.append(kept.store.add_items_soon(owner, conv, [*inputs, *output_items(response.output)], "input"))

    run.keep = keep
    if not data.stream:
        answer = await first.c.guard(unless_disconnected(request, run.collect(first)))
        evicted = [i for w in writes for i in await settled(w) or []]
        return Response(answer, headers={**headers, **_evicted(evicted)})
    return keepalive.sse(run.sse(first), services.settings.sse_ping_interval_s, headers=headers)


async def _background(kept: ResponsesState, run: ResponseRun, approved: list[Approved], owner: str,
                      conv: str | None, inputs: list[dict[str, Any]],
                      headers: dict[str, str]) -> Response[r.Response] | ServerSentEvent:  # fmt: skip
    """Queued at once and kept (a restart finds it unfinished and marks it failed); run by a task of its own."""
    kept.jobs.admit(owner)
    data, store = run.data, kept.store
    run.response_id = new_id("resp")
    queued = skeleton(data, run.tools, run.response_id, int(time.time()), run.entry.id, data.temperature or 0.0,
                      data.top_p or 0.0)  # fmt: skip
    queued = msgspec.structs.replace(queued, status="queued", background=True, conversation=run.conversation_ref,
                                     temperature=data.temperature, top_p=data.top_p)  # fmt: skip
    evicted = await store.put(owner, queued, inputs, [], [])

    async def events(job: Job) -> AsyncIterator[Any]:
        ran = await run.run_approved(approved)
        first = await run.round()  # a refused prompt fails the response (its `error` says why)
        run.begin(first, ran)
        run.out.response.created_at = queued.created_at

        def made() -> list[r.OutputItem]:
            run.out.close("incomplete")  # what a cancelled response had begun to say
            return list(run.out.items)

        job.output = made
        async for ev in run.events(first, lambda ev: ev):
            yield ev

    async def conclude(job: Job) -> None:
        response = job.response
        await store.put(owner, response, inputs, [*run.conversation, *answer_messages(response.output)], job.events)
        if conv is not None and response.status in ("completed", "incomplete"):
            await store.add_items(owner, conv, [*inputs, *output_items(response.output)], "input")

    job = kept.jobs.start(owner, queued, events, conclude)
    if data.stream:
        return keepalive.sse(_sse(job.follow(-1)), run.services.settings.sse_ping_interval_s,
                             headers={**headers, **_evicted(evicted)})  # fmt: skip
    return Response(queued, headers={**headers, **_evicted(evicted)})


async def _sse(events: AsyncIterator[Event]) -> AsyncIterator[ServerSentEventMessage]:
    async for kind, _, data in events:
        yield ServerSentEventMessage(data=data, event=kind)


async def _replayed(events: list[Event], after: int) -> AsyncIterator[Event]:
    for ev in events:
        if ev[1] > after:
            yield ev


def _after(starting_after: int | None, last: int, finished: bool) -> int:
    """`starting_after`, checked against the events there are: beyond the last one is a 400 (the
    client never saw it); at the last one of a finished response, an empty replay."""
    after = -1 if starting_after is None else starting_after
    if after < -1:
        raise BadRequest(f"`starting_after`: {after} is not a sequence number (0 or more)")
    if after > last:
        what = "has no events yet" if last < 0 else f"has events 0 to {last} so far" if not finished \
            else f"has events 0 to {last}"  # fmt: skip
        raise BadRequest(f"`starting_after`: {after} is past this response's last event; it {what}")
    return after


@get("/v1/responses/{response_id:str}")
async def retrieve_response(request: Request, response_id: FromPath[str], services: NamedDependency[Services],
                            kept: NamedDependency[ResponsesState], stream: FromQuery[bool] = False,
                            starting_after: FromQuery[int | None] = None) -> Response[r.Response] | ServerSentEvent:  # fmt: skip
    owner = tenant_of(request)
    job = kept.jobs.get(owner, response_id)
    ping = services.settings.sse_ping_interval_s
    if job is not None:
        if not stream:
            return Response(job.response)
        after = _after(starting_after, job.seqs[-1] if job.seqs else -1, job.finished)
        return keepalive.sse(_sse(job.follow(after)), ping)
    found = await _stored(kept, request, response_id, "response_id")
    if not stream:
        return Response(found.response)
    events = await kept.store.events(owner, response_id) if found.replayable else None
    if events is None:
        raise BadRequest("`stream`: only a background response keeps its events to be streamed again; "
                         f"{response_id[:128]!r} was not one")  # fmt: skip
    after = _after(starting_after, events[-1][1] if events else -1, True)
    return keepalive.sse(_sse(_replayed(events, after)), ping)


@delete("/v1/responses/{response_id:str}", status_code=200)
async def delete_response(request: Request, response_id: FromPath[str],
                          kept: NamedDependency[ResponsesState]) -> Response[r.Deleted]:  # fmt: skip
    owner = tenant_of(request)
    if (job := kept.jobs.get(owner, response_id)) is not None:
        await kept.jobs.cancel(job)  # a running one stops first, or its end would store it again
    if not await kept.store.delete(owner, response_id):
        raise _not_found("response_id", response_id)
    return Response(r.Deleted(id=response_id))


@post("/v1/responses/{response_id:str}/cancel", status_code=200)
async def cancel_response(request: Request, response_id: FromPath[str],
                          kept: NamedDependency[ResponsesState]) -> Response[r.Response]:  # fmt: skip
    """A queued or running background response stops (its worker's generation with it) and ends
    `cancelled`; a finished one is answered unchanged, as at OpenAI (cancelling is idempotent)."""
    owner = tenant_of(request)
    if (job := kept.jobs.get(owner, response_id)) is not None:
        await kept.jobs.cancel(job)
        return Response(job.response)
    found = await _stored(kept, request, response_id, "response_id")
    if not found.response.background:
        raise BadRequest(f"`response_id`: only a background response can be cancelled; {response_id[:128]!r} "
                         "was made without `background: true`")  # fmt: skip
    return Response(found.response)


@get("/v1/responses/{response_id:str}/input_items")
async def list_input_items(request: Request, response_id: FromPath[str], kept: NamedDependency[ResponsesState],
                           after: FromQuery[str | None] = None, limit: FromQuery[int | None] = None,
                           order: FromQuery[str | None] = None) -> Response[ItemList]:  # fmt: skip
    """The request's own `input` items (each with an id), newest first unless `order=asc`."""
    found = await _stored(kept, request, response_id, "response_id")
    return Response(page(found.input_items, after, limit, order))


@post("/v1/responses/input_tokens", status_code=200)
async def count_input_tokens(request: Request, body: RawBody, services: NamedDependency[Services],
                             kept: NamedDependency[ResponsesState]) -> Response[InputTokens]:  # fmt: skip
    """The prompt's tokens as a create with this body would send them: the same translation, the
    model's own template and tokenizer (as `/v1/messages/count_tokens`); nothing is generated or billed."""
    data = read_json(body, InputTokensRequest)
    if not data.model:
        raise BadRequest("`model`: a required field is missing (its tokenizer and template count the tokens)")
    entry = services.model_for(data.model, "chat")
    translated = await _translate(kept, request, services, data, _conversation_id(data))
    req = services.with_defaults(translated.request, entry)
    images = await services.images(req.messages, entry, fields=image_fields(data))
    g = plan_chat(req, current_request_id() or "", services.store, services.settings.grammar_dirs).generate
    worker = await services.worker(entry, nctx=data.nctx, compute=data.compute, keep_alive=data.keep_alive,
                                   prompt_chars=prompt_chars(req.messages))  # fmt: skip
    reply = await worker.call(CountTokens(0, g.log_id, g.messages or [], g.template_vars, g.tools, images))
    if not isinstance(reply, TokenCount):
        raise EngineFailure(f"the worker answered a token count with {type(reply).__name__}")
    return Response(InputTokens(input_tokens=reply.n_tokens))


def router(kept: ResponsesState) -> Router:
    """The routes, with the room's state (its store, its background responses): the dependency `kept`."""
    return Router(path="/", route_handlers=[create_response, count_input_tokens, retrieve_response, delete_response,
                                            cancel_response, list_input_items, *conversations.handlers],
                  dependencies={"kept": Provide(lambda: kept, sync_to_thread=False)})  # fmt: skip
