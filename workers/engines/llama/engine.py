"""llama.cpp through its low-level API: one context, N sequence slots, one decode per step.

Each step puts every running sequence's next token, plus prompt chunks of newly
admitted requests, into one `llama_batch`, runs one `llama_decode`, and samples
each sequence with its own native sampler chain (so token selection never loops
over the vocabulary in Python). Requests join at the next step and leave without
stalling the others, which is what llama-server's slots do.

KV layout: `kv_unified=False`, one cache stream per sequence, each `nctx` long, so
every request gets the full context it asked for. A unified cache gives wrong
logits when several prompts share a decode (see LLAMA_NOTES.md), and splitting
`nctx` across slots would make a prompt that fits `nctx` fail only under load.
The cost is KV memory of `nctx * parallel` tokens; `--parallel` bounds it.

Speculative decoding (a request's `speculation`): before the batch is built, each
speculating slot gets a draft (from an n-gram drafter or a draft model, see
`workers/drafters.py` and `llama_draft.py`); the slot then puts its last token and
the whole draft into the batch with logits on every row, and `_verify` samples the
rows in order with the slot's own chain, emitting tokens while they match the
draft. The first mismatch is still emitted (it is what the target samples at that
point), and the KV of the refused draft positions is removed. Each emitted token
costs exactly one sampler call on the right context, so the output is the same as
without speculation, greedy or seeded. Slots without speculation never touch any of it.
"""

from __future__ import annotations

import ctypes
import os
import time
from collections import deque
from dataclasses import dataclass, field

import llama_cpp as L
import psutil
import structlog

from protocol.wire import (
    PROTOCOL_VERSION,
    Delta,
    Done,
    Failed,
    Generate,
    Logits,
    LogprobDelta,
    Ready,
    Speculation,
    TokenLogprob,
)
from workers.engines import Emit, EngineError, EngineOptions
from workers.engines.llama.chat_template import ChatTemplate, TemplateError
from workers.engines.llama.draft_model import DraftModel, SpecState
from workers.engines.llama.drafters import NGRAM_DRAFTERS, make_drafter
from workers.engines.llama.logits import LogitsJob
from workers.engines.llama.logprobs import token_logprobs
from workers.engines.llama.sampling import Sampler, build_sampler
from workers.engines.llama.text_stream import TextStream
from workers.engines.llama_runtime import init_backend, slot_context
from workers.engines.thread_governor import ThreadGovernor

log = structlog.get_logger("worker.llama")

N_BATCH = 512  # tokens per decode step, decode tokens first, then prompt chunks
DEFAULT_MAX_TOKENS = 2048  # the spec's default for max_completion_tokens
DRAFT_MODEL_TYPES = ("draft-simple",)


@dataclass
class Slot:
    seq: int
    req: Generate | None = None
    pending_prompt: list[int] = field(default_factory=list)
    n_past: int = 0
    n_prompt: int = 0
    n_gen: int = 0
    max_tokens: int = 0
    last_token: int = -1
    row: int = -1  # this step's output row in the batch, or -1
    sampler: Sampler | None = None
    text: TextStream | None = None
    started: float = 0.0
    n_cached: int = 0  # prompt tokens whose KV was reused from the previous turn
    # Tokens whose KV this slot holds, kept after a GenieX-KeepCache request so the
    # next turn of the same conversation only evaluates what is new.
    history: list[int] = field(default_factory=list)
    spec: SpecState | None = None  # set only for a request that speculates
    logprobs: list[TokenLogprob] | None = None  # tokens not yet sent, for a request that wants logprobs
    prefix: str = ""  # text to put before the next output (a `<think>` the prompt opened, held text)
    last_emit: float = 0.0


@dataclass
class Queued:
    """A request accepted but not yet in a slot, with what submit() prepared for it (the
    sampler is built there so that a bad grammar is refused before the request queues)."""

    req: Generate
    tokens: list[int]
    sampler: Sampler
    prefix: str = ""


class LlamaEngine:
    name = "llama_cpp"

    def __init__(self, opts: EngineOptions) -> None:
        t0 = time.perf_counter()
        init_backend()
        mparams = L.llama_model_default_params()
        mparams.n_gpu_layers = (999 if opts.ngl < 0 else opts.ngl) if opts.compute == "gpu" else 0
        self.n_gpu_layers = mparams.n_gpu_layers
        model = L.llama_model_load_from_file(opts.model_path.encode(), mparams)
        if not model:
            raise EngineError(f"llama.cpp could not load {opts.model_path}", status=500)
        self.model = model
        self.vocab = L.llama_model_get_vocab(model)
        self.n_vocab = L.llama_vocab_n_tokens(self.vocab)
        self.nctx = opts.nctx
        self.parallel = max(1, opts.parallel or 1)
        self.compute = opts.compute

        threads = opts.threads or psutil.cpu_count(logical=False) or os.cpu_count() or 1
        self.threads = self.max_threads = threads
        self.governor = ThreadGovernor(threads)
        ctx = slot_context(model, nctx=self.nctx, parallel=self.parallel, n_batch=N_BATCH, threads=threads)
        self.ctx = ctx
        self.mem = L.llama_get_memory(ctx)
        self.batch = L.llama_batch_init(N_BATCH, 0, 1)

        self.template = ChatTemplate(
            _meta(model, "tokenizer.chat_template"),
            bos_token=self._piece_text(L.llama_vocab_bos(self.vocab)),
            eos_token=self._piece_text(L.llama_vocab_eos(self.vocab)),
        )
        self.add_bos = bool(L.llama_vocab_get_add_bos(self.vocab))
        self.slots = [Slot(seq=i) for i in range(self.parallel)]
        self.waiting: deque[Queued] = deque()
        self.logit_jobs: deque[LogitsJob] = deque()
        self.tokens_generated = 0
        self._piece_buf = ctypes.create_string_buffer(256)
        # Speculation: draft models loaded on first use (by canonical path), how many slots
        # speculate (0 keeps the step free of any draft work), and the most draft tokens a
        # slot may add so that every running slot's rows always fit one batch.
        self.draft_models: dict[str, DraftModel] = {}
        self.n_speculating = 0
        self.draft_cap = N_BATCH // self.parallel - 1
        # Text that comes sooner than this after the last Delta waits for the next one: at
        # high token rates every Delta costs the gateway and the client a wake-up, a write
        # and a parse, CPU taken from decoding on a small machine (bench/README.md). The
        # interval grows with the sequences decoding at once (`coalesce_s`), so the Deltas a
        # worker sends per second stay about the same under load (at 4 streams it halved the
        # client's and the gateway's CPU per token). The first token always goes at once.
        self.coalesce = max(0, getattr(opts, "stream_interval_ms", 0)) / 1000
        self.coalesce_s = self.coalesce
        self.load_seconds = time.perf_counter() - t0

    # ---- Engine interface --------------------------------------------------

    def ready(self) -> Ready:
        desc = ctypes.create_string_buffer(256)
        L.llama_model_desc(self.model, desc, 256)
        return Ready(
            protocol_version=PROTOCOL_VERSION,
            pid=os.getpid(),
            engine=self.name,
            compute=self.compute,
            n_ctx=self.nctx,
            n_ctx_train=L.llama_model_n_ctx_train(self.model),
            n_vocab=self.n_vocab,
            parallel=self.parallel,
            model_bytes=L.llama_model_size(self.model),
            load_seconds=round(self.load_seconds, 3),
            chat_template=self.template.is_native,
            description=desc.value.decode(errors="replace"),
        )

    def submit(self, req: Generate | Logits) -> None:
        if isinstance(req, Logits):
            self.logit_jobs.append(LogitsJob.checked(req, n_vocab=self.n_vocab, nctx=self.nctx))
            return
        if req.speculation is not None:
            self._check_speculation(req.speculation)
        tokens, prefix = self._prompt_tokens(req)
        if len(tokens) >= self.nctx:
            raise EngineError(
                f"the prompt is {len(tokens)} tokens, but the context is {self.nctx}; "
                "shorten it or ask for a larger `nctx`",
                code="context_length_exceeded",
            )
        self.waiting.append(Queued(req, tokens, build_sampler(req, self.vocab, self.n_vocab), prefix))

    def cancel(self, req_id: int, emit: Emit) -> None:
        for job in self.logit_jobs:
            if job.req.req_id == req_id:
                self.logit_jobs.remove(job)
                emit(Done(req_id, "cancelled"))
                return
        for i, q in enumerate(self.waiting):
            if q.req.req_id == req_id:
                del self.waiting[i]
                q.sampler.free()
                emit(Done(req_id, "cancelled"))
                return
        for slot in self.slots:
            if slot.req is not None and slot.req.req_id == req_id:
                log.info("cancelled", request_id=slot.req.log_id, generated=slot.n_gen)
                acc, rej = (slot.spec.accepted, slot.spec.rejected) if slot.spec else (0, 0)
                emit(Done(req_id, "cancelled", prompt_tokens=slot.n_prompt, completion_tokens=slot.n_gen,
                          accepted_tokens=acc, rejected_tokens=rej))  # fmt: skip
                self._release(slot)
                return

    def has_work(self) -> bool:
        return bool(self.waiting or self.logit_jobs) or any(s.req is not None for s in self.slots)

    def stats(self) -> tuple[int, int, int]:
        return sum(s.req is not None for s in self.slots), len(self.waiting), self.tokens_generated

    def set_threads(self, n: int) -> None:
        """The gateway's share of the cores; the governor uses fewer while others keep them busy."""
        cap = min(max(1, n), self.max_threads)
        if cap != self.governor.cap:
            log.info("thread share changed", cap=cap, old_cap=self.governor.cap)
        self.governor.set_cap(cap)
        self._use_threads(self.governor.threads)

    def idle(self) -> None:
        self.governor.idle()

    def _use_threads(self, n: int) -> None:
        if n != self.threads:
            L.llama_set_n_threads(self.ctx, n, n)
            for draft in self.draft_models.values():  # drafts run in the same loop, on the same cores
                L.llama_set_n_threads(draft.ctx, n, n)
            log.debug("threads changed", old=self.threads, new=n, cap=self.governor.cap,
                      others_busy=round(self.governor.others, 2))  # fmt: skip
            self.threads = n

    def close(self) -> None:
        for slot in self.slots:
            self._release(slot)
        for q in self.waiting:
            q.sampler.free()
        self.waiting.clear()
        for draft in self.draft_models.values():
            draft.close()
        self.draft_models.clear()
        L.llama_batch_free(self.batch)
        L.llama_free(self.ctx)
        L.llama_model_free(self.model)

    # ---- the decode step ---------------------------------------------------

    def step(self, emit: Emit) -> None:
        if self.logit_jobs:
            self._run_logits(emit)
        self._admit()
        self.coalesce_s = self.coalesce * max(1, sum(s.req is not None for s in self.slots))
        if self.n_speculating:
            self._make_drafts()
        batch = self.batch
        n = 0
        # Running sequences first: one token each (plus a draft to verify), so they never
        # wait behind a prompt.
        for slot in self.slots:
            slot.row = -1
            if slot.req is not None and not slot.pending_prompt:
                n = self._put(n, slot.last_token, slot.n_past, slot.seq, True)
                slot.row = n - 1
                slot.n_past += 1
                if slot.spec is not None and slot.spec.draft:
                    for tok in slot.spec.draft:
                        n = self._put(n, tok, slot.n_past, slot.seq, True)
                        slot.n_past += 1
        # Then prompt chunks, as much as the batch holds.
        for slot in self.slots:
            if slot.req is None or not slot.pending_prompt or n >= N_BATCH:
                continue
            take = min(len(slot.pending_prompt), N_BATCH - n)
            chunk, slot.pending_prompt = slot.pending_prompt[:take], slot.pending_prompt[take:]
            for j, tok in enumerate(chunk):
                last = not slot.pending_prompt and j == take - 1
                n = self._put(n, tok, slot.n_past + j, slot.seq, last)
            slot.n_past += take
            if not slot.pending_prompt:
                slot.row = n - 1
        if n == 0:
            return
        batch.n_tokens = n
        self._use_threads(self.governor.threads_for_step())
        t0 = time.perf_counter()
        rc = L.llama_decode(self.ctx, batch)
        self.governor.after_step(n, time.perf_counter() - t0)
        if rc != 0:
            for slot in self.slots:
                if slot.req is not None and slot.row >= 0:
                    emit(Failed(slot.req.req_id, 500, f"llama_decode failed with status {rc}"))
                    self._release(slot)
            return
        for slot in self.slots:
            if slot.req is not None and slot.row >= 0:
                if slot.spec is not None and slot.spec.draft:
                    self._verify(slot, emit)
                else:
                    self._sample(slot, emit)

    def _put(self, n: int, token: int, pos: int, seq: int, logits: bool) -> int:
        b = self.batch
        b.token[n] = token
        b.pos[n] = pos
        b.n_seq_id[n] = 1
        b.seq_id[n][0] = seq
        b.logits[n] = logits
        return n + 1

    def _sample(self, slot: Slot, emit: Emit) -> None:
        assert slot.sampler is not None
        self._take(slot, slot.sampler.sample(self.ctx, slot.row), emit, slot.row)

    def _take(self, slot: Slot, tok: int, emit: Emit, row: int) -> bool:
        """Emit one sampled token; False when it ended the generation (the slot is released)."""
        req = slot.req
        assert req is not None and slot.text is not None
        slot.n_gen += 1
        self.tokens_generated += 1
        if L.llama_vocab_is_eog(self.vocab, tok):
            slot.n_gen -= 1  # the end-of-generation token is not part of the answer
            self._finish(slot, "stop", emit)
            return False
        piece = self._piece(tok, req.special)
        if slot.logprobs is not None:
            slot.logprobs.append(token_logprobs(self.ctx, row, self.n_vocab, tok, piece, req.logprobs, self._piece))
        text = slot.text.feed(piece)
        if slot.text.stopped:
            if text:
                self._emit_text(slot, text, emit)
            self._finish(slot, "stop", emit, flush=False)
            return False
        if text:
            self._emit_text(slot, text, emit)
        if slot.n_gen >= slot.max_tokens:
            self._finish(slot, "length", emit)
            return False
        slot.last_token = tok
        slot.history.append(tok)
        return True

    def _emit_text(self, slot: Slot, text: str, emit: Emit, *, final: bool = False) -> None:
        assert slot.req is not None
        if self.coalesce and not final:
            now = time.perf_counter()
            if slot.n_gen > 1 and now - slot.last_emit < self.coalesce_s:
                slot.prefix += text  # goes out with the next Delta
                return
            slot.last_emit = now
        if slot.prefix:
            text, slot.prefix = slot.prefix + text, ""
        if slot.logprobs:  # the tokens this text came from (a held-back token waits for its text)
            emit(LogprobDelta(slot.req.req_id, text, slot.n_gen, slot.logprobs))
            slot.logprobs = []
        else:
            emit(Delta(slot.req.req_id, text, slot.n_gen))

    # ---- speculation -------------------------------------------------------

    def _check_speculation(self, spec: Speculation) -> None:
        """Refuse what the worker cannot do (the gateway checks first; this guards the wire)."""
        if spec.type in DRAFT_MODEL_TYPES:
            self._draft_model(spec.draft_path)
        elif spec.type not in NGRAM_DRAFTERS:
            raise EngineError(f"`spec_type`: {spec.type!r} is not supported by this worker")

    def _draft_model(self, path: str) -> DraftModel:
        """The draft model at `path`, loaded on first use and kept for later requests."""
        draft = self.draft_models.get(path)
        if draft is None:
            if not path or not os.path.isfile(path):
                raise EngineError(f"`spec_draft_model`: no model file at {path!r}")
            t0 = time.perf_counter()
            draft = DraftModel(path, n_gpu_layers=self.n_gpu_layers, nctx=self.nctx, parallel=self.parallel,
                               threads=self.threads, n_batch=N_BATCH)  # fmt: skip
            try:
                draft.check_vocab(self.vocab, self.n_vocab)
            except EngineError:
                draft.close()
                raise
            log.info("draft model loaded", path=path, seconds=round(time.perf_counter() - t0, 3))
            self.draft_models[path] = draft
        return draft

    def _make_drafts(self) -> None:
        """Give each speculating, generating slot this step's draft (possibly none)."""
        by_model: dict[DraftModel, list[tuple[int, list[int], int, SpecState]]] = {}
        for slot in self.slots:
            spec = slot.spec
            if spec is None or slot.req is None or slot.pending_prompt:
                continue
            spec.draft = []
            # Drafting past the token that ends by length would only be thrown away.
            budget = min(spec.cfg.n_max, self.draft_cap, slot.max_tokens - slot.n_gen - 1)
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

    def _verify(self, slot: Slot, emit: Emit) -> None:
        """Sample the rows of [last_token, d1..dk] in order; keep the draft while it matches."""
        spec = slot.spec
        assert spec is not None and slot.sampler is not None
        draft, spec.draft = spec.draft, []
        k = len(draft)
        base = slot.n_past - k - 1  # the position of last_token
        acc0, rej0 = spec.accepted, spec.rejected
        accepted = 0
        for i in range(k + 1):
            tok = slot.sampler.sample(self.ctx, slot.row + i)
            hit = i < k and tok == draft[i]
            accepted += hit
            # Before _take: it may finish the request, and Done carries these counts. The KV
            # is valid up to last_token + the i draft tokens confirmed before this row.
            spec.accepted, spec.rejected = acc0 + accepted, rej0 + k - accepted
            slot.n_past = base + 1 + i
            if not self._take(slot, tok, emit, slot.row + i):
                return
            if not hit:
                break
        slot.n_past = base + 1 + accepted
        if accepted < k:
            L.llama_memory_seq_rm(self.mem, slot.seq, slot.n_past, -1)
        if spec.model is not None:
            spec.model.commit(slot.seq, spec, accepted)

    def _finish(self, slot: Slot, reason: str, emit: Emit, *, flush: bool = True) -> None:
        req = slot.req
        assert req is not None and slot.text is not None
        rest = slot.text.flush() if flush else ""
        if rest or slot.prefix:
            self._emit_text(slot, rest, emit, final=True)
        elif slot.logprobs:  # tokens whose text never showed (e.g. a lone partial character)
            emit(LogprobDelta(req.req_id, "", slot.n_gen, slot.logprobs))
        acc, rej = (slot.spec.accepted, slot.spec.rejected) if slot.spec else (0, 0)
        emit(Done(req.req_id, reason, prompt_tokens=slot.n_prompt, completion_tokens=slot.n_gen,
                  cached_tokens=slot.n_cached, accepted_tokens=acc, rejected_tokens=rej))  # fmt: skip
        secs = time.perf_counter() - slot.started
        extra = {"spec": slot.spec.cfg.type, "accepted": acc, "rejected": rej} if slot.spec else {}
        log.info("generation done", request_id=req.log_id, finish=reason, prompt_tokens=slot.n_prompt,
                 completion_tokens=slot.n_gen, seconds=round(secs, 3), **extra)  # fmt: skip
        self._release(slot)

    # ---- /v1/logits --------------------------------------------------------

    def _run_logits(self, emit: Emit) -> None:
        """One forward-pass job per step, in a free slot's sequence, so running generations
        lose one step, not the whole job queue. No sampler, no decode loop."""
        free = [s for s in self.slots if s.req is None]
        if not free:
            return
        slot = next((s for s in free if not s.history), free[0])
        job = self.logit_jobs.popleft()
        L.llama_memory_seq_rm(self.mem, slot.seq, -1, -1)
        slot.history = []
        try:
            emit(job.run(self.ctx, self.batch, N_BATCH, slot.seq))
        except EngineError as exc:
            emit(Failed(job.req.req_id, exc.status, exc.message, exc.code))
        finally:
            L.llama_memory_seq_rm(self.mem, slot.seq, -1, -1)

    # ---- slots -------------------------------------------------------------

    def _admit(self) -> None:
        while self.waiting:
            free = [s for s in self.slots if s.req is None]
            if not free:
                return
            q = self.waiting.popleft()
            req, tokens = q.req, q.tokens
            slot, reuse = self._pick_slot(free, tokens, req.keep_cache)
            # Keep the KV of the shared prefix, drop the rest; at least one prompt
            # token must be evaluated so there are logits to sample from.
            reuse = min(reuse, len(tokens) - 1)
            L.llama_memory_seq_rm(self.mem, slot.seq, reuse, -1)
            slot.req = req
            slot.history = list(tokens)
            slot.pending_prompt = tokens[reuse:]
            slot.n_prompt = len(tokens)
            slot.n_cached = reuse
            slot.n_past = reuse
            slot.n_gen = 0
            room = self.nctx - len(tokens)
            wanted = req.max_tokens if req.max_tokens is not None else DEFAULT_MAX_TOKENS
            slot.max_tokens = max(1, min(wanted, room))
            slot.sampler = q.sampler
            slot.prefix = q.prefix
            slot.text = TextStream(req.stop)
            slot.logprobs = [] if req.logprobs >= 0 else None
            if req.speculation is not None:
                slot.spec = self._spec_state(req.speculation)
                self.n_speculating += 1
            slot.started = time.perf_counter()
            log.debug("admitted", request_id=req.log_id, slot=slot.seq, prompt_tokens=len(tokens), reused_tokens=reuse,
                      keep_cache=req.keep_cache, waiting=len(self.waiting))  # fmt: skip

    @staticmethod
    def _pick_slot(free: list[Slot], tokens: list[int], keep_cache: bool) -> tuple[Slot, int]:
        """A KeepCache request takes the free slot sharing the longest prefix; others take
        an empty slot if there is one, so that kept caches survive for their next turn."""
        if keep_cache:
            best, best_n = free[0], 0
            for slot in free:
                n = _common_prefix(slot.history, tokens)
                if n > best_n:
                    best, best_n = slot, n
            return best, best_n
        empty = [s for s in free if not s.history]
        return (empty or free)[0], 0

    def _spec_state(self, cfg: Speculation) -> SpecState:
        if cfg.type in NGRAM_DRAFTERS:
            return SpecState(cfg, drafter=make_drafter(cfg.type))
        # Loaded by submit(); a draft model, once loaded, stays for the worker's life.
        return SpecState(cfg, model=self._draft_model(cfg.draft_path))

    def _release(self, slot: Slot) -> None:
        if slot.sampler is not None:
            slot.sampler.free()
        if slot.spec is not None:
            if slot.spec.model is not None:
                slot.spec.model.forget(slot.seq)  # the next request of this slot starts a fresh draft KV
            slot.spec = None
            self.n_speculating -= 1
        keep = slot.req is not None and slot.req.keep_cache and not slot.pending_prompt
        if not keep:
            L.llama_memory_seq_rm(self.mem, slot.seq, -1, -1)
            slot.history = []
        else:
            # The last sampled token was never decoded, so its KV does not exist.
            slot.history = slot.history[: slot.n_past]
        slot.req = None
        slot.sampler = None
        slot.text = None
        slot.logprobs = None
        slot.prefix = ""
        slot.pending_prompt = []
        slot.row = -1

    # ---- tokens ------------------------------------------------------------

    def _prompt_tokens(self, req: Generate) -> tuple[list[int], str]:
        """The prompt's tokens, and the text the output must start with (see Generate.reasoning)."""
        prefix = ""
        if req.messages is not None:
            try:
                text = self.template.render(req.messages, req.template_vars, req.tools)
            except TemplateError as exc:
                raise EngineError(f"`messages`: {exc}") from exc
            if req.reasoning and _opens_think(text):
                prefix = "<think>"
        else:
            text = req.prompt or ""
            if req.suffix is not None:
                return self._fim_tokens(text, req.suffix), ""
        bos = self.template.bos_token
        add_special = self.add_bos and not (bos and text.startswith(bos))
        return self.tokenize(text, add_special=add_special), prefix

    def _fim_tokens(self, prefix: str, suffix: str) -> list[int]:
        """<fim_pre>prefix<fim_suf>suffix<fim_mid>: the model writes what goes between."""
        v = self.vocab
        pre, suf, mid = L.llama_vocab_fim_pre(v), L.llama_vocab_fim_suf(v), L.llama_vocab_fim_mid(v)
        if min(pre, suf, mid) < 0:
            raise EngineError("`suffix`: this model has no fill-in-the-middle tokens")
        head = [L.llama_vocab_bos(v)] if self.add_bos else []
        return [*head, pre, *self.tokenize(prefix, add_special=False), suf,
                *self.tokenize(suffix, add_special=False), mid]  # fmt: skip

    def tokenize(self, text: str, *, add_special: bool) -> list[int]:
        raw = text.encode()
        cap = len(raw) + 8
        buf = (L.llama_token * cap)()
        n = L.llama_tokenize(self.vocab, raw, len(raw), buf, cap, add_special, True)
        if n < 0:
            buf = (L.llama_token * -n)()
            n = L.llama_tokenize(self.vocab, raw, len(raw), buf, -n, add_special, True)
        return list(buf[:n])

    def _piece(self, token: int, special: bool = False) -> bytes:
        buf = self._piece_buf
        n = L.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, special)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = L.llama_token_to_piece(self.vocab, token, buf, -n, 0, special)
        return buf.raw[:n]

    def _piece_text(self, token: int) -> str:
        if token < 0:
            return ""
        buf = ctypes.create_string_buffer(256)
        n = L.llama_token_to_piece(self.vocab, token, buf, 256, 0, True)
        return buf.raw[: max(n, 0)].decode(errors="replace")


def _opens_think(prompt: str) -> bool:
    """The generation prompt ends inside a `<think>` block it opened (thinking forced on)."""
    tail = prompt.rstrip()
    return tail.endswith("<think>")


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def _meta(model: ctypes.c_void_p, key: str) -> str | None:
    buf = ctypes.create_string_buffer(1 << 16)
    n = L.llama_model_meta_val_str(model, key.encode(), buf, len(buf))
    if n < 0:
        return None
    if n >= len(buf):
        buf = ctypes.create_string_buffer(n + 1)
        L.llama_model_meta_val_str(model, key.encode(), buf, len(buf))
    return buf.value.decode(errors="replace")




def load(opts: EngineOptions) -> LlamaEngine:
    return LlamaEngine(opts)
