"""`/v1/logits`: raw logits of one prefill-only forward pass over pre-tokenized input."""

from __future__ import annotations

import msgspec

from protocol.chat import Compute
from protocol.limits import Count, Layers, TokenId

# The most values (rows x width) one answer may carry: 8 MiB as float32 on the wire, and at most
# about 48 MiB of JSON (24 bytes a value at worst, `-1.2345678901234567e-05,`). Past it, a client
# asks for `last_only`, a `top_n`, or fewer tokens.
MAX_LOGIT_VALUES = 2 * 1024 * 1024


def logit_values(rows: int, width: int) -> str | None:
    """Why an answer of `rows` x `width` logits is refused, or None when it may be sent."""
    if rows * width <= MAX_LOGIT_VALUES:
        return None
    return (f"the answer would hold {rows} x {width} logits, over the {MAX_LOGIT_VALUES} one answer may carry; "
            "use `last_only`, a smaller `top_n`, or fewer tokens")  # fmt: skip


class LogitsRequest(msgspec.Struct, kw_only=True):
    model: str
    input_ids: list[TokenId]
    last_only: bool = False
    top_n: Count = 20
    nctx: Count | None = None  # 0 or absent: the server's --nctx
    ngl: Layers | None = None
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
