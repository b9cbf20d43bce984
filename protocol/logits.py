"""`/v1/logits`: raw logits of one prefill-only forward pass over pre-tokenized input."""

from __future__ import annotations

import msgspec

from protocol.chat import Compute
from protocol.limits import Count, Int32, PositiveInt, TokenId


class LogitsRequest(msgspec.Struct, kw_only=True):
    model: str
    input_ids: list[TokenId]
    last_only: bool = False
    top_n: Count = 20
    nctx: PositiveInt | None = None
    ngl: Int32 | None = None
    compute: Compute | None = None


class LogitRow(msgspec.Struct, omit_defaults=True):
    logits: list[float]
    token_ids: list[int] | None = None  # absent when top_n is 0: the column is the token id


class LogitsResponse(msgspec.Struct):
    model: str
    n_rows: int
    vocab_size: int
    top_n: int
    rows: list[LogitRow]
    object: str = "logits"
