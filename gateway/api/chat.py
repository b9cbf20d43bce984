"""POST /v1/chat/completions: read like the spec, delegate everything else."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import msgspec
import structlog
from litestar import Request, Response, post
from litestar.response import ServerSentEvent

from gateway.api import relay
from gateway.api.disconnect import unless_disconnected
from gateway.api.request_id import current_request_id
from gateway.chat.convert import generate_fields, shape_of
from gateway.chat.shape import ChoiceShaper
from gateway.models.store import ModelStore
from gateway.supervisor.handle import WorkerHandle
from gateway.supervisor.pool import WorkerPool
from protocol.chat import ChatCompletion, ChatRequest
from protocol.wire import Sampling

KEEP_CACHE_HEADER = "geniex-keepcache"


def _header_true(request: Request, name: str) -> bool:
    return request.headers.get(name, "").strip().lower() in ("1", "true", "yes")


@post("/v1/chat/completions", status_code=200)
async def chat_completions(request: Request, data: ChatRequest) -> Response[ChatCompletion] | ServerSentEvent:
    store: ModelStore = request.app.state.store
    pool: WorkerPool = request.app.state.pool
    entry = store.resolve(data.model)
    # Everything about the request is checked before a model is loaded for it.
    fields = generate_fields(data, current_request_id() or "", store, request.app.state.settings.grammar_dirs)
    completion = relay.accounted(request, entry.id, data.user, data.n)  # a warm-up never settles it: not counted
    worker = await completion.guard(pool.get(pool.key_for(entry, data.nctx, data.compute, data.ngl), entry))
    structlog.contextvars.bind_contextvars(model=entry.id, worker_pid=worker.pid)
    if data.keep_alive is not None:
        worker.keepalive = data.keep_alive
    if not data.messages:  # warm-up: load the model, answer null
        await worker.warmup()
        return Response(content=b"null", media_type="application/json")
    completion.speculative = fields["speculation"] is not None
    shape = shape_of(data)
    shapers = [ChoiceShaper(i, shape) for i in range(data.n)]
    stream = _generations(worker, fields, data.n, _header_true(request, KEEP_CACHE_HEADER))
    if not data.stream:
        collected = relay.collect(completion, shapers, stream)
        return Response(await completion.guard(unless_disconnected(request, collected)))
    # The first message decides the status: a refused prompt is a 400, not a broken stream.
    first = await completion.guard(anext(stream))
    include_usage = bool(data.stream_options and data.stream_options.include_usage)
    return ServerSentEvent(relay.sse(completion, shapers, first, stream, include_usage))


def _generations(worker: WorkerHandle, fields: dict[str, Any], n: int, keep_cache: bool) -> AsyncIterator[relay.Tagged]:
    """n generations of the same request. Seeded choices get seeds seed, seed+1, ... so that
    they differ but stay reproducible; only the first keeps its cache for the next turn."""
    if n == 1:
        return relay.tagged(worker.generate(**fields, keep_cache=keep_cache))
    sampling: Sampling = fields.pop("sampling")
    streams = []
    for i in range(n):
        seeded = sampling if sampling.seed is None else msgspec.structs.replace(sampling, seed=sampling.seed + i)
        streams.append(worker.generate(**fields, sampling=seeded, keep_cache=keep_cache and i == 0))
    return relay.merged(streams)


handlers = [chat_completions]
