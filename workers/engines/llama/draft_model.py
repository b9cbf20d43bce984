"""Speculative decoding state, and the draft model of `draft-simple`.

A draft model is a second, smaller GGUF with the target's vocabulary. It has its
own llama.cpp context laid out like the target's (one KV stream per slot,
`kv_unified=False`, see LLAMA_NOTES pitfall 6), so sequence `seq` of the draft
mirrors slot `seq` of the target. Every slot that drafts this step is advanced
together: one `llama_decode` per draft position for all of them, as the target
does for its slots.

Draft KV bookkeeping, per slot: the draft context holds `history[:d_past]`, a
prefix of the accepted tokens, plus the draft tokens it decoded last step. After
the target verifies a draft, `commit` keeps the confirmed ones and removes the
rest, so the next step only has to catch up on the tokens the draft never saw.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass, field

import llama_cpp as L
import numpy as np
import structlog

from protocol.wire import Speculation
from workers.engines import EngineError
from workers.engines.llama.drafters import Drafter
from workers.engines.llama_runtime import load_model, piece, put, slot_context

log = structlog.get_logger("worker.draft")

# Token ids compared between target and draft besides the special ones: enough to
# catch another tokenizer, cheap enough to run on every load.
_PROBE_IDS = (0, 1, 2, 3, 10, 100, 1000, 5000)


@dataclass
class SpecState:
    """One request's speculation: its settings, its drafter, this step's draft and the counts."""

    cfg: Speculation
    drafter: Drafter | None = None  # ngram-* types
    model: DraftModel | None = None  # draft-simple
    draft: list[int] = field(default_factory=list)  # proposed this step, verified after the decode
    accepted: int = 0
    rejected: int = 0
    d_past: int = 0  # tokens this slot's draft KV holds (draft-simple)
    d_base: int = 0  # len(history) when the draft was made: where drafted tokens start in the draft KV


class DraftModel:
    def __init__(self, path: str, *, n_gpu_layers: int, nctx: int, parallel: int, threads: int, n_batch: int,
                 kv_types: tuple[str, str] = ("f16", "f16")) -> None:  # fmt: skip
        model = load_model(path, n_gpu_layers, field="spec_draft_model")
        self.path = path
        self.model = model
        self.vocab = L.llama_model_get_vocab(model)
        self.n_vocab = L.llama_vocab_n_tokens(self.vocab)
        # Its cache is as long as the target's, so it is stored in the target's types (the gateway counts it so).
        ctx = slot_context(model, nctx=nctx, parallel=parallel, n_batch=n_batch, threads=threads, what="draft context",
                           offload=n_gpu_layers > 0, type_k=kv_types[0], type_v=kv_types[1])  # fmt: skip
        self.ctx = ctx
        self.mem = L.llama_get_memory(ctx)
        self.n_batch = n_batch
        self.batch = L.llama_batch_init(n_batch, 0, 1)

    def check_vocab(self, target_vocab: ctypes.c_void_p, target_n_vocab: int) -> None:
        """Raise EngineError (400) unless the draft tokenizes like the target; speculation compares ids."""
        name = self.path
        if self.n_vocab != target_n_vocab:
            raise EngineError(f"`spec_draft_model`: {name} has a vocabulary of {self.n_vocab} tokens, the target "
                              f"{target_n_vocab}; a draft model must share the target's tokenizer")  # fmt: skip
        probes = {*_PROBE_IDS, self.n_vocab // 2, self.n_vocab - 1,
                  L.llama_vocab_bos(target_vocab), L.llama_vocab_eos(target_vocab)}  # fmt: skip
        for tok in sorted(t for t in probes if 0 <= t < self.n_vocab):
            a, b = piece(target_vocab, tok), piece(self.vocab, tok)
            if a != b:
                raise EngineError(f"`spec_draft_model`: {name} has a different vocabulary from the target "
                                  f"(token {tok} is {b!r} there, {a!r} here); a draft model must share the "
                                  "target's tokenizer")  # fmt: skip

    # ---- drafting ----------------------------------------------------------

    def draft(self, jobs: list[tuple[int, list[int], int, SpecState]]) -> None:
        """Greedy drafts for several slots at once; sets each job's `spec.draft`.

        A job is (seq, history, budget, spec): `history` is the slot's accepted tokens,
        its last one sampled by the target but not yet decoded anywhere.
        """
        if not self._catch_up(jobs):
            return
        active = []
        for seq, history, budget, spec in jobs:
            spec.draft = []
            spec.d_base = len(history)
            active.append((seq, budget, spec, history[-1]))
        pos_of = {id(spec): len(history) - 1 for _, history, _, spec in jobs}
        while active:
            b = self.batch
            for row, (seq, _, spec, tok) in enumerate(active):
                put(b, row, tok, pos_of[id(spec)], seq)
            b.n_tokens = len(active)
            if L.llama_decode(self.ctx, b) != 0:
                self._give_up([j[2] for j in active], [j[0] for j in active])
                return
            nxt = []
            for row, (seq, budget, spec, _) in enumerate(active):
                spec.d_past += 1  # the token just decoded is now in the draft KV
                pos_of[id(spec)] += 1
                tok, p = self._top(row, spec.cfg.p_min > 0)
                if p < spec.cfg.p_min:
                    continue
                spec.draft.append(tok)
                if len(spec.draft) < budget and not L.llama_vocab_is_eog(self.vocab, tok):
                    nxt.append((seq, budget, spec, tok))
            active = nxt
        for seq, _, _, spec in jobs:
            if len(spec.draft) < spec.cfg.n_min:
                spec.draft = []
                self.commit(seq, spec, 0)  # nothing will be verified: drop the decoded draft tokens

    def _catch_up(self, jobs: list[tuple[int, list[int], int, SpecState]]) -> bool:
        """Decode, without logits, what each draft sequence lacks before its last token."""
        b, n = self.batch, 0
        pending = [(seq, history, spec) for seq, history, _, spec in jobs if spec.d_past < len(history) - 1]
        for seq, history, spec in pending:
            for pos in range(spec.d_past, len(history) - 1):
                if n == self.n_batch:
                    b.n_tokens = n
                    if L.llama_decode(self.ctx, b) != 0:
                        return self._give_up([j[3] for j in jobs], [j[0] for j in jobs])
                    n = 0
                put(b, n, history[pos], pos, seq, logits=False)
                n += 1
        if n:
            b.n_tokens = n
            if L.llama_decode(self.ctx, b) != 0:
                return self._give_up([j[3] for j in jobs], [j[0] for j in jobs])
        for _seq, history, spec in pending:
            spec.d_past = len(history) - 1
        return True

    def _give_up(self, specs: list[SpecState], seqs: list[int]) -> bool:
        # A failed draft decode must not fail the request: no draft this step, and the
        # draft KV of these slots is rebuilt from scratch on the next one.
        log.warning("draft decode failed; decoding without a draft this step", model=self.path)
        for spec, seq in zip(specs, seqs):
            spec.draft = []
            self.forget(seq, spec)
        return False

    def _top(self, row: int, with_p: bool) -> tuple[int, float]:
        """The draft's greedy token at `row`, and its softmax probability when asked (else 1)."""
        logits = np.ctypeslib.as_array(L.llama_get_logits_ith(self.ctx, row), shape=(self.n_vocab,))
        tok = int(logits.argmax())
        if not with_p:
            return tok, 1.0
        return tok, 1.0 / float(np.exp(logits - logits[tok]).sum())

    # ---- KV bookkeeping ----------------------------------------------------

    def commit(self, seq: int, spec: SpecState, accepted: int) -> None:
        """Keep the draft KV of the `accepted` draft tokens the target confirmed; drop the rest."""
        keep = spec.d_base + min(accepted, spec.d_past - spec.d_base)
        if keep < spec.d_past:
            L.llama_memory_seq_rm(self.mem, seq, keep, -1)
            spec.d_past = keep

    def forget(self, seq: int, spec: SpecState | None = None) -> None:
        L.llama_memory_seq_rm(self.mem, seq, -1, -1)
        if spec is not None:
            spec.d_past = 0

    def close(self) -> None:
        L.llama_batch_free(self.batch)
        L.llama_free(self.ctx)
        L.llama_model_free(self.model)
