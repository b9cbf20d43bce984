"""`/v1/embeddings` and `/v1/reranking`: the request and response bodies.

`input` is a string, a list of strings, a list of token ids (one sequence) or a list of
token-id lists. msgspec allows one array type per union, so the list's items are typed as
any of the three and the gateway checks that they are all of one kind.
`compute` picks the unit per request, as chat's does (a GenieX extension).
"""

from __future__ import annotations

from typing import Literal

import msgspec

from protocol.chat import Compute
from protocol.limits import Int32, PositiveInt, TokenId


class EmbeddingRequest(msgspec.Struct, kw_only=True):
    model: str
    input: str | list[str | TokenId | list[TokenId]]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: Int32 | None = None  # below 1: refused by the handler, with the model's range
    user: str | None = None
    task_type: str = "default"  # accepted for the spec's sake; models here have no task prompts
    compute: Compute | None = None


class Embedding(msgspec.Struct):
    embedding: list[float] | str  # str: base64 of little-endian float32s
    index: int
    object: str = "embedding"


class EmbeddingUsage(msgspec.Struct):
    prompt_tokens: int
    total_tokens: int


class EmbeddingResponse(msgspec.Struct):
    data: list[Embedding]
    model: str
    usage: EmbeddingUsage
    object: str = "list"


class RerankingRequest(msgspec.Struct, kw_only=True):
    model: str
    query: str | None = None
    documents: list[str] | None = None
    batch_size: PositiveInt = 4
    normalize: bool = False
    normalize_method: Literal["softmax", "linear"] = "softmax"
    user: str | None = None
    compute: Compute | None = None


class RerankingResponse(msgspec.Struct):
    result: list[float]
