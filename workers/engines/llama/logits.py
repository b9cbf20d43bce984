"""`/v1/logits`: raw LM-head logits from one prefill-only forward pass over given token ids."""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

import llama_cpp as L
import numpy as np

from protocol.logits import logit_values
from protocol.wire import ErrorKind, LogitRows, Logits
from workers.engines import EngineError
from workers.engines.llama_runtime import put

# Rows per llama_decode when every row is wanted: llama.cpp keeps an output buffer of
# rows x vocab floats (49k for SmolLM2), so 512 rows would pin ~100 MB per context.
ROWS_PER_DECODE = 128


@dataclass
class LogitsJob:
    req: Logits

    @classmethod
    def checked(cls, req: Logits, *, n_vocab: int, nctx: int) -> LogitsJob:
        ids = req.input_ids
        if not ids:
            raise EngineError("`input_ids`: at least one token id is required")
        if len(ids) > nctx:
            raise EngineError(f"`input_ids`: {len(ids)} tokens, but the context is {nctx}; ask for a larger `nctx`",
                              code="context_length_exceeded")  # fmt: skip
        bad = next((t for t in ids if not 0 <= t < n_vocab), None)
        if bad is not None:
            raise EngineError(f"`input_ids`: token id {bad} is not in the vocabulary (0..{n_vocab - 1})")
        if req.top_n < 0:
            raise EngineError("`top_n`: must be 0 (the whole vocabulary) or more")
        rows = 1 if req.last_only else len(ids)
        width = min(req.top_n, n_vocab) or n_vocab
        if (too_many := logit_values(rows, width)) is not None:
            raise EngineError(too_many)
        return cls(req)

    def run(self, ctx: ctypes.c_void_p, batch: L.llama_batch, n_batch: int, seq: int) -> LogitRows:
        ids = self.req.input_ids
        last_only = self.req.last_only
        n_vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(L.llama_get_model(ctx)))
        step = n_batch if last_only else min(n_batch, ROWS_PER_DECODE)
        rows: list[np.ndarray] = []
        for start in range(0, len(ids), step):
            chunk = ids[start : start + step]
            for j, tok in enumerate(chunk):
                put(batch, j, tok, start + j, seq, not last_only or start + j == len(ids) - 1)
            batch.n_tokens = len(chunk)
            rc = L.llama_decode(ctx, batch)
            if rc != 0:
                raise EngineError(f"llama_decode failed with status {rc}", kind=ErrorKind.ENGINE)
            n_out = 1 if last_only else len(chunk)
            if last_only and start + step < len(ids):
                continue
            out = np.ctypeslib.as_array(L.llama_get_logits(ctx), shape=(n_out, n_vocab))
            rows.append(out.copy())  # the next decode overwrites the buffer
        logits = np.concatenate(rows) if len(rows) > 1 else rows[0]
        top_n = min(self.req.top_n, n_vocab)
        if top_n == 0:
            return LogitRows(self.req.req_id, len(logits), n_vocab, 0, logits.astype("<f4").tobytes())
        part = np.argpartition(logits, -top_n, axis=1)[:, -top_n:]
        vals = np.take_along_axis(logits, part, axis=1)
        order = np.argsort(-vals, axis=1, kind="stable")
        token_ids = np.take_along_axis(part, order, axis=1)
        top = np.take_along_axis(vals, order, axis=1)
        return LogitRows(self.req.req_id, len(logits), n_vocab, top_n,
                         top.astype("<f4").tobytes(), token_ids.astype("<i4").tobytes())  # fmt: skip
