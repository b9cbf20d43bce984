"""`/v1/logits`: raw logits of one prefill-only forward pass over pre-tokenized input."""

from __future__ import annotations

from typing import Annotated

import msgspec
from msgspec import Meta

from protocol.chat import Compute


class LogitsRequest(msgspec.Struct, kw_only=True):
    model: str
    input_ids: list[int]
    last_only: bool = False
    top_n: Annotated[int, Meta(ge=0)] = 20
    nctx: Annotated[int, Meta(ge=1)] | None = None
    ngl: int | None = None
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
