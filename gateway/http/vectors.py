"""The embedding requests' shared steps, for every dialect that embeds: the input's checks, the
one-reply exchange with the worker, and the reply's rows as vectors."""

from __future__ import annotations

import base64
import sys
from array import array

from litestar import Request

from gateway.errors import BadRequest, Unsupported
from gateway.http.disconnect import unless_disconnected
from gateway.models.store import ModelEntry
from gateway.supervisor.handle import Answer, WorkerHandle
from protocol.embeddings import Embedding
from protocol.wire import Embed, Embeddings, Rerank

MAX_INPUTS = 2048  # items per request, as OpenAI allows


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
