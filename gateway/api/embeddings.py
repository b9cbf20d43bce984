"""POST /v1/embeddings and POST /v1/reranking: one request, one reply from the model's worker.

The worker does the model work (tokenize, batch, pool, normalise, truncate to `dimensions`,
score); these handlers check the input, pick the worker, and shape the reply.
"""

from __future__ import annotations

import base64
import math
import sys
from array import array

from litestar import Request, Response, post
from litestar.di import NamedDependency
from litestar.params import RawBody

from gateway.api.auth import caller_of
from gateway.api.body import read_json
from gateway.api.disconnect import unless_disconnected
from gateway.api.request_id import current_request_id
from gateway.api.services import Services
from gateway.errors import BadRequest, Unsupported
from gateway.models.store import ModelEntry
from gateway.supervisor.handle import Answer, WorkerHandle
from protocol.embeddings import (
    Embedding,
    EmbeddingRequest,
    EmbeddingResponse,
    EmbeddingUsage,
    RerankingRequest,
    RerankingResponse,
)
from protocol.wire import Embed, Embeddings, Rerank, Scores

MAX_INPUTS = 2048  # items per request, as OpenAI allows
RERANK_MODE_HEADER = "GenieX-Rerank-Mode"


def split_input(value: str | list[str | int | list[int]]) -> tuple[list[str] | None, list[list[int]] | None]:
    """(texts, token-id sequences): exactly one is set; raises BadRequest for anything else."""
    if isinstance(value, str):
        value = [value]
    if not value:
        raise BadRequest("`input` must not be empty")
    if len(value) > MAX_INPUTS:
        raise BadRequest(f"`input` has {len(value)} items; at most {MAX_INPUTS} per request")
    if all(isinstance(v, str) for v in value):
        texts: list[str] = value  # type: ignore[assignment]
        empty = next((i for i, t in enumerate(texts) if not t), None)
        if empty is not None:
            raise BadRequest(f"`input`[{empty}] is an empty string")
        return texts, None
    if all(isinstance(v, int) for v in value):
        return None, [value]  # type: ignore[list-item]
    if all(isinstance(v, list) for v in value):
        rows: list[list[int]] = value  # type: ignore[assignment]
        empty = next((i for i, r in enumerate(rows) if not r), None)
        if empty is not None:
            raise BadRequest(f"`input`[{empty}] is an empty token list")
        return None, rows
    raise BadRequest("`input` must be a string, a list of strings, a list of token ids, or a list of token-id lists")


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


def vectors(reply: Embeddings, encoding: str) -> list[Embedding]:
    """The reply's rows as the spec's objects: float lists, or base64 of the little-endian bytes."""
    width = reply.dim * 4
    if encoding == "base64":
        return [Embedding(base64.b64encode(reply.data[i * width : (i + 1) * width]).decode("ascii"), i)
                for i in range(reply.n)]  # fmt: skip
    values = array("f", reply.data)
    if sys.byteorder != "little":
        values.byteswap()
    return [Embedding(values[i * reply.dim : (i + 1) * reply.dim].tolist(), i) for i in range(reply.n)]


async def ask(request: Request, worker: WorkerHandle, entry: ModelEntry, message: Embed | Rerank) -> Answer:
    """Send one request to the worker and await its one reply; name the model in a refusal."""
    try:
        return await unless_disconnected(request, worker.call(message))
    except Unsupported as exc:
        raise Unsupported(f"`model`: {entry.id} ({entry.engine}): {exc.message}") from None


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
