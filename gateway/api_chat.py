"""POST /v1/chat/completions: read like the spec, delegate everything else."""

from __future__ import annotations

from litestar import Request, Response, post
from litestar.response import ServerSentEvent

from gateway import chat_relay
from gateway.chat_convert import generate_fields
from gateway.pool import WorkerPool
from gateway.request_id import current_request_id
from gateway.store import ModelStore
from protocol.chat import ChatCompletion, ChatRequest

NULL_JSON = Response(content=b"null", media_type="application/json")


@post("/v1/chat/completions", status_code=200)
async def chat_completions(request: Request, data: ChatRequest) -> Response[ChatCompletion] | ServerSentEvent:
    store: ModelStore = request.app.state.store
    pool: WorkerPool = request.app.state.pool
    entry = store.resolve(data.model)
    worker = await pool.get(pool.key_for(entry, data.nctx, data.compute, data.ngl), entry)
    if not data.messages:  # warm-up: load the model, answer null
        await worker.warmup()
        return Response(content=b"null", media_type="application/json")
    fields = generate_fields(data, current_request_id() or "")
    completion = chat_relay.Completion(entry.id)
    stream = worker.generate(**fields)
    # The first message decides the status: a refused prompt is a 400, not a broken stream.
    first = await anext(stream)
    if data.stream:
        include_usage = bool(data.stream_options and data.stream_options.include_usage)
        return ServerSentEvent(chat_relay.sse(completion, first, stream, include_usage))
    return Response(await chat_relay.collect(completion, first, stream))


handlers = [chat_completions]
