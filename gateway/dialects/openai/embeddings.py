"""POST /v1/embeddings and POST /v1/reranking: one request, one reply from the model's worker.

The worker does the model work (tokenize, batch, pool, normalise, truncate to `dimensions`,
score); these handlers check the input, pick the worker, and shape the reply.
"""

from __future__ import annotations

import math

from litestar import Request, Response, post
from litestar.di import NamedDependency
from litestar.params import RawBody

from gateway.errors import BadRequest
from gateway.http.auth import caller_of
from gateway.http.body import read_json
from gateway.http.request_id import current_request_id
from gateway.http.services import Services
from gateway.http.vectors import MAX_INPUTS, ask, split_input, vectors
from protocol.embeddings import (
    EmbeddingRequest,
    EmbeddingResponse,
    EmbeddingUsage,
    RerankingRequest,
    RerankingResponse,
)
from protocol.wire import Embed, Embeddings, Rerank, Scores

RERANK_MODE_HEADER = "GenieX-Rerank-Mode"


def normalize_scores(scores: list[float], method: str) -> list[float]:
    """softmax: exp-normalised to sum 1; linear: min-max scaled to [0, 1] (all 1.0 when equal)."""
    if not scores:
        return []
    if method == "linear":
        lo, hi = min(scores), max(scores)
        return [1.0] * len(scores) if hi == lo else [(s - lo) / (hi - lo) for s in scores]
    top = max(scores)
    exps = [math.exp(s - top) for s in scores]
    total = sum(exps)
    return [e / total for e in exps]


@post("/v1/embeddings", status_code=200)
async def embeddings(request: Request, body: RawBody, services: NamedDependency[Services]) -> EmbeddingResponse:
    data = read_json(body, EmbeddingRequest)
    entry = services.model_for(data.model, "embeddings")
    texts, token_ids = split_input(data.input)
    if data.dimensions is not None and data.dimensions < 1:
        raise BadRequest(f"`dimensions` must be at least 1, got {data.dimensions}")
    accounting = services.accounting(entry.id, caller_of(request), data.user)
    worker = await accounting.guard(services.worker(entry, compute=data.compute))
    message = Embed(0, current_request_id() or "", texts=texts, token_ids=token_ids, dimensions=data.dimensions or 0)
    reply = await accounting.guard(ask(request, worker, entry, message))
    assert isinstance(reply, Embeddings)
    accounting.settle("ok", reply.prompt_tokens, 0)
    return EmbeddingResponse(
        data=vectors(reply, data.encoding_format),
        model=entry.id,
        usage=EmbeddingUsage(prompt_tokens=reply.prompt_tokens, total_tokens=reply.prompt_tokens),
    )


@post("/v1/reranking", status_code=200)
async def reranking(
    request: Request, body: RawBody, services: NamedDependency[Services]
) -> Response[RerankingResponse]:
    data = read_json(body, RerankingRequest)
    entry = services.model_for(data.model, "rerank")
    if data.query is None or not data.query.strip():
        raise BadRequest("`query` is required: the text to rank the documents against")
    if not data.documents:
        raise BadRequest("`documents` must be a non-empty list of strings")
    if len(data.documents) > MAX_INPUTS:
        raise BadRequest(f"`documents` has {len(data.documents)} items; at most {MAX_INPUTS} per request")
    accounting = services.accounting(entry.id, caller_of(request), data.user)
    worker = await accounting.guard(services.worker(entry, compute=data.compute))
    message = Rerank(0, current_request_id() or "", data.query, data.documents, data.batch_size)
    reply = await accounting.guard(ask(request, worker, entry, message))
    assert isinstance(reply, Scores)
    accounting.settle("ok", reply.prompt_tokens, 0)
    scores = normalize_scores(reply.scores, data.normalize_method) if data.normalize else reply.scores
    return Response(RerankingResponse(result=scores), headers={RERANK_MODE_HEADER: reply.mode})


handlers = [embeddings, reranking]
