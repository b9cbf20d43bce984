"""Per-token log-probabilities from a decoded row's logits (numpy, only for requests that ask)."""

from __future__ import annotations

import ctypes
from collections.abc import Callable

import llama_cpp as L
import numpy as np

from protocol.wire import TokenLogprob


def token_logprobs(ctx: ctypes.c_void_p, row: int, n_vocab: int, token: int, piece: bytes, top_n: int,
                   piece_of: Callable[[int], bytes]) -> TokenLogprob:  # fmt: skip
    """The log-softmax of the model's raw logits at `row`: the chosen token's value and the
    `top_n` most likely tokens (the model's distribution, before sampling settings)."""
    logits = np.ctypeslib.as_array(L.llama_get_logits_ith(ctx, row), shape=(n_vocab,))
    peak = float(logits.max())
    log_z = peak + float(np.log(np.exp(logits - peak).sum()))
    top: list[tuple[bytes, float]] = []
    if top_n > 0:
        idx = np.argpartition(logits, -top_n)[-top_n:]
        idx = idx[np.argsort(-logits[idx], kind="stable")]
        top = [(piece_of(int(i)), float(logits[i]) - log_z) for i in idx]
    return TokenLogprob(piece, float(logits[token]) - log_z, top)
