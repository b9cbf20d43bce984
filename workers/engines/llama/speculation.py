"""Speculative decoding for the chat engine: drafts before a step, verification after it.

Before the batch is built, each speculating slot gets a draft (from an n-gram drafter or a
draft model, see `drafters.py` and `draft_model.py`); the slot then puts its last token and the
whole draft into the batch with logits on every row, and `verify` samples the rows in order
with the slot's own chain, emitting tokens while they match the draft. The first mismatch is
still emitted (it is what the target samples at that point), and the KV of the refused draft
positions is removed. Each emitted token costs exactly one sampler call on the right context,
so the output is the same as without speculation, greedy or seeded. Slots without speculation
never touch any of it.
"""

from __future__ import annotations

import ctypes
import os
import time
from collections.abc import Callable, Iterable

import llama_cpp as L
import structlog

from protocol.limits import MAX_DRAFT_MODELS
from protocol.wire import DRAFT_MODEL_SPEC_TYPES, Speculation
from workers.engines import EngineError
from workers.engines.llama.draft_model import DraftModel, SpecState
from workers.engines.llama.drafters import make_drafter
from workers.engines.llama.slots import Slot, SlotState

log = structlog.get_logger("worker.llama")

Take = Callable[[Slot, int, int], bool]  # (slot, token, row) -> still generating


class Speculator:
    def __init__(self, vocab: ctypes.c_void_p, n_vocab: int, *, n_gpu_layers: int, nctx: int, parallel: int,
                 n_batch: int, kv_types: tuple[str, str] = ("f16", "f16")) -> None:  # fmt: skip
        self.vocab = vocab
        self.kv_types = kv_types  # the target's KV cache types, for the draft models' caches too
        self.n_vocab = n_vocab
        self.n_gpu_layers = n_gpu_layers
        self.nctx = nctx
        self.parallel = parallel
        self.n_batch = n_batch
        # Draft models loaded on first use (by canonical path), how many slots speculate (0
        # keeps the step free of any draft work), and the most draft tokens a slot may add so
        # that every running slot's rows always fit one batch.
        self.models: dict[str, DraftModel] = {}
        self.active = 0
        self.cap = n_batch // parallel - 1

    def check(self, cfg: Speculation, threads: int) -> None:
        """Load the draft model a request names (the wire admits only the types implemented here)."""
        if cfg.type in DRAFT_MODEL_SPEC_TYPES:
            self._model(cfg.draft_path, threads)

    def start(self, cfg: Speculation) -> SpecState:
        self.active += 1
        if cfg.type in DRAFT_MODEL_SPEC_TYPES:
            return SpecState(cfg, model=self.models[cfg.draft_path])  # loaded by check(), kept for the worker's life
        return SpecState(cfg, drafter=make_drafter(cfg.type))

    def release(self, slot: Slot) -> None:
        spec = slot.run.spec if slot.state is not SlotState.FREE else None
        if spec is None:
            return
        if spec.model is not None:
            spec.model.forget(slot.seq)  # the next request of this slot starts a fresh draft KV
        self.active -= 1

    def contexts(self) -> Iterable[ctypes.c_void_p]:
        """The draft models' contexts: they run in the same loop, on the same cores as the target."""
        return [m.ctx for m in self.models.values()]

    def _model(self, path: str, threads: int) -> DraftModel:
        draft = self.models.get(path)
        if draft is None:
            if len(self.models) >= MAX_DRAFT_MODELS:
                # Each stays loaded for the worker's life: without a bound, requests naming one
                # model after another would load the whole store into this process.
                raise EngineError(f"`spec_draft_model`: this worker already holds {len(self.models)} draft models "
                                  f"(at most {MAX_DRAFT_MODELS}); use one of those or none")  # fmt: skip
            if not path or not os.path.isfile(path):
                raise EngineError(f"`spec_draft_model`: no model file at {path!r}")
            t0 = time.perf_counter()
            draft = DraftModel(path, n_gpu_layers=self.n_gpu_layers, nctx=self.nctx, parallel=self.parallel,
                               threads=threads, n_batch=self.n_batch, kv_types=self.kv_types)  # fmt: skip
            try:
                draft.check_vocab(self.vocab, self.n_vocab)
            except EngineError:
                draft.close()
                raise
            log.info("draft model loaded", path=path, seconds=round(time.perf_counter() - t0, 3))
            self.models[path] = draft
        return draft

    def make_drafts(self, slots: Iterable[Slot]) -> None:
        """Give each speculating, generating slot this step's draft (possibly none)."""
        by_model: dict[DraftModel, list[tuple[int, list[int], int, SpecState]]] = {}
        for slot in slots:
            if slot.state is not SlotState.DECODE:
                continue
            run = slot.run
            spec = run.spec
            if spec is None:
                continue
            spec.draft = []
            if run.inject:  # the next step puts a thinking section's close there, not a guess
                continue
            # Drafting past the token that ends by length would only be thrown away.
            budget = min(spec.cfg.n_max, self.cap, run.max_tokens - run.n_gen - 1)
            if budget < max(1, spec.cfg.n_min):
                continue
            if spec.drafter is not None:
                draft = spec.drafter.draft(slot.history, budget)
                if len(draft) >= spec.cfg.n_min:
                    spec.draft = draft
            elif spec.model is not None:
                by_model.setdefault(spec.model, []).append((slot.seq, slot.history, budget, spec))
        for model, jobs in by_model.items():
            model.draft(jobs)

    def verify(self, slot: Slot, ctx: ctypes.c_void_p, mem: ctypes.c_void_p, take: Take) -> None:
        """Sample the rows of [last_token, d1..dk] in order; keep the draft while it matches."""
        run = slot.run
        spec = run.spec
        assert spec is not None
        draft, spec.draft = spec.draft, []
        k = len(draft)
        base = run.n_past - k - 1  # the position of last_token
        acc0, rej0 = spec.accepted, spec.rejected
        accepted = 0
        for i in range(k + 1):
            tok = run.sampler.sample(ctx, run.row + i)
            hit = i < k and tok == draft[i]
            accepted += hit
            # Before take(): it may finish the request, and Done carries these counts. The KV
            # is valid up to last_token + the i draft tokens confirmed before this row.
            spec.accepted, spec.rejected = acc0 + accepted, rej0 + k - accepted
            run.n_past = base + 1 + i
            if not take(slot, tok, run.row + i):
                return
            if run.inject:  # take() closed a thinking section: the rest of the draft guessed more thinking
                accepted = i  # `tok` is decoded again, at its place, before the closing tokens
                break
            if not hit:
                break
        run.n_past = base + 1 + accepted
        if accepted < k:
            L.llama_memory_seq_rm(mem, slot.seq, run.n_past, -1)
        if spec.model is not None:
            spec.model.commit(slot.seq, spec, accepted)

    def close(self) -> None:
        for draft in self.models.values():
            draft.close()
        self.models.clear()
