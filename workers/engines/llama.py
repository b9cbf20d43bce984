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

from protocol.wire import PROTOCOL_VERSION, Delta, Done, Failed, Generate, Ready, Sampling
from workers.chat_template import ChatTemplate, TemplateError
from workers.engines import Emit, EngineError, EngineOptions
from workers.text_stream import TextStream

log = structlog.get_logger("worker.llama")

N_BATCH = 512  # tokens per decode step, decode tokens first, then prompt chunks
DEFAULT_MAX_TOKENS = 2048  # the spec's default for max_completion_tokens


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
    sampler: ctypes.c_void_p | None = None
    text: TextStream | None = None
    started: float = 0.0


class LlamaEngine:
    name = "llama_cpp"

    def __init__(self, opts: EngineOptions) -> None:
        t0 = time.perf_counter()
        L.llama_backend_init()
        L.llama_log_set(_silent_log, ctypes.c_void_p(0))
        mparams = L.llama_model_default_params()
        mparams.n_gpu_layers = (999 if opts.ngl < 0 else opts.ngl) if opts.compute == "gpu" else 0
        model = L.llama_model_load_from_file(opts.model_path.encode(), mparams)
        if not model:
            raise EngineError(f"llama.cpp could not load {opts.model_path}", status=500)
        self.model = model
        self.vocab = L.llama_model_get_vocab(model)
        self.n_vocab = L.llama_vocab_n_tokens(self.vocab)
        self.nctx = opts.nctx
        self.parallel = max(1, opts.parallel or 1)
        self.compute = opts.compute

        cparams = L.llama_context_default_params()
        cparams.n_ctx = self.nctx * self.parallel
        cparams.n_batch = N_BATCH
        cparams.n_ubatch = N_BATCH
        cparams.n_seq_max = self.parallel
        cparams.kv_unified = False
        threads = opts.threads or psutil.cpu_count(logical=False) or os.cpu_count() or 1
        cparams.n_threads = threads
        cparams.n_threads_batch = threads
        cparams.no_perf = True
        ctx = L.llama_init_from_model(model, cparams)
        if not ctx:
            L.llama_model_free(model)
            raise EngineError(f"llama.cpp could not create a context of {cparams.n_ctx} tokens", status=500)
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
        self.waiting: deque[tuple[Generate, list[int]]] = deque()
        self.tokens_generated = 0
        self._piece_buf = ctypes.create_string_buffer(256)
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

    def submit(self, req: Generate) -> None:
        tokens = self._prompt_tokens(req)
        if len(tokens) >= self.nctx:
            raise EngineError(
                f"the prompt is {len(tokens)} tokens, but the context is {self.nctx}; "
                "shorten it or ask for a larger `nctx`",
                code="context_length_exceeded",
            )
        self.waiting.append((req, tokens))

    def cancel(self, req_id: int) -> None:
        for i, (req, _) in enumerate(self.waiting):
            if req.req_id == req_id:
                del self.waiting[i]
                return
        for slot in self.slots:
            if slot.req is not None and slot.req.req_id == req_id:
                log.info("cancelled", request_id=slot.req.log_id, generated=slot.n_gen)
                self._release(slot)
                return

    def has_work(self) -> bool:
        return bool(self.waiting) or any(s.req is not None for s in self.slots)

    def stats(self) -> tuple[int, int, int]:
        return sum(s.req is not None for s in self.slots), len(self.waiting), self.tokens_generated

    def close(self) -> None:
        for slot in self.slots:
            self._release(slot)
        L.llama_batch_free(self.batch)
        L.llama_free(self.ctx)
        L.llama_model_free(self.model)

    # ---- the decode step ---------------------------------------------------

    def step(self, emit: Emit) -> None:
        self._admit()
        batch = self.batch
        n = 0
        # Running sequences first: one token each, so they never wait behind a prompt.
        for slot in self.slots:
            slot.row = -1
            if slot.req is not None and not slot.pending_prompt:
                n = self._put(n, slot.last_token, slot.n_past, slot.seq, True)
                slot.row = n - 1
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
        rc = L.llama_decode(self.ctx, batch)
        if rc != 0:
            for slot in self.slots:
                if slot.req is not None and slot.row >= 0:
                    emit(Failed(slot.req.req_id, 500, f"llama_decode failed with status {rc}"))
                    self._release(slot)
            return
        for slot in self.slots:
            if slot.req is not None and slot.row >= 0:
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
        req = slot.req
        assert req is not None and slot.text is not None
        tok = L.llama_sampler_sample(slot.sampler, self.ctx, slot.row)
        slot.n_gen += 1
        self.tokens_generated += 1
        if L.llama_vocab_is_eog(self.vocab, tok):
            slot.n_gen -= 1  # the end-of-generation token is not part of the answer
            return self._finish(slot, "stop", emit)
        text = slot.text.feed(self._piece(tok))
        if slot.text.stopped:
            if text:
                emit(Delta(req.req_id, text, slot.n_gen))
            return self._finish(slot, "stop", emit, flush=False)
        if text:
            emit(Delta(req.req_id, text, slot.n_gen))
        if slot.n_gen >= slot.max_tokens:
            return self._finish(slot, "length", emit)
        slot.last_token = tok

    def _finish(self, slot: Slot, reason: str, emit: Emit, *, flush: bool = True) -> None:
        req = slot.req
        assert req is not None and slot.text is not None
        if flush and (rest := slot.text.flush()):
            emit(Delta(req.req_id, rest, slot.n_gen))
        emit(Done(req.req_id, reason, prompt_tokens=slot.n_prompt, completion_tokens=slot.n_gen))
        secs = time.perf_counter() - slot.started
        log.info("generation done", request_id=req.log_id, finish=reason, prompt_tokens=slot.n_prompt,
                 completion_tokens=slot.n_gen, seconds=round(secs, 3))  # fmt: skip
        self._release(slot)

    # ---- slots -------------------------------------------------------------

    def _admit(self) -> None:
        for slot in self.slots:
            if not self.waiting:
                return
            if slot.req is not None:
                continue
            req, tokens = self.waiting.popleft()
            L.llama_memory_seq_rm(self.mem, slot.seq, -1, -1)
            slot.req = req
            slot.pending_prompt = tokens
            slot.n_prompt = len(tokens)
            slot.n_past = 0
            slot.n_gen = 0
            room = self.nctx - len(tokens)
            wanted = req.max_tokens if req.max_tokens is not None else DEFAULT_MAX_TOKENS
            slot.max_tokens = max(1, min(wanted, room))
            slot.sampler = self._sampler(req.sampling)
            slot.text = TextStream(req.stop)
            slot.started = time.perf_counter()

    def _release(self, slot: Slot) -> None:
        if slot.sampler:
            L.llama_sampler_free(slot.sampler)
        if slot.req is not None:
            L.llama_memory_seq_rm(self.mem, slot.seq, -1, -1)
        slot.req = None
        slot.sampler = None
        slot.text = None
        slot.pending_prompt = []
        slot.row = -1

    def _sampler(self, s: Sampling) -> ctypes.c_void_p:
        params = L.llama_sampler_chain_default_params()
        params.no_perf = True
        chain = L.llama_sampler_chain_init(params)
        add = L.llama_sampler_chain_add
        if s.repeat_penalty != 1.0 or s.frequency_penalty or s.presence_penalty:
            add(chain, L.llama_sampler_init_penalties(
                self.n_vocab, s.penalty_last_n, s.repeat_penalty, s.frequency_penalty, s.presence_penalty))  # fmt: skip
        if s.temperature <= 0:
            add(chain, L.llama_sampler_init_greedy())
            return chain
        if s.top_k > 0:
            add(chain, L.llama_sampler_init_top_k(s.top_k))
        if s.top_p < 1.0:
            add(chain, L.llama_sampler_init_top_p(s.top_p, 1))
        if s.min_p > 0.0:
            add(chain, L.llama_sampler_init_min_p(s.min_p, 1))
        add(chain, L.llama_sampler_init_temp(s.temperature))
        seed = s.seed if s.seed is not None else L.LLAMA_DEFAULT_SEED
        add(chain, L.llama_sampler_init_dist(seed & 0xFFFFFFFF))
        return chain

    # ---- tokens ------------------------------------------------------------

    def _prompt_tokens(self, req: Generate) -> list[int]:
        if req.messages is not None:
            try:
                text = self.template.render(req.messages, req.template_vars)
            except TemplateError as exc:
                raise EngineError(f"`messages`: {exc}") from exc
        else:
            text = req.prompt or ""
        bos = self.template.bos_token
        add_special = self.add_bos and not (bos and text.startswith(bos))
        return self.tokenize(text, add_special=add_special)

    def tokenize(self, text: str, *, add_special: bool) -> list[int]:
        raw = text.encode()
        cap = len(raw) + 8
        buf = (L.llama_token * cap)()
        n = L.llama_tokenize(self.vocab, raw, len(raw), buf, cap, add_special, True)
        if n < 0:
            buf = (L.llama_token * -n)()
            n = L.llama_tokenize(self.vocab, raw, len(raw), buf, -n, add_special, True)
        return list(buf[:n])

    def _piece(self, token: int) -> bytes:
        buf = self._piece_buf
        n = L.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, False)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = L.llama_token_to_piece(self.vocab, token, buf, -n, 0, False)
        return buf.raw[:n]

    def _piece_text(self, token: int) -> str:
        if token < 0:
            return ""
        buf = ctypes.create_string_buffer(256)
        n = L.llama_token_to_piece(self.vocab, token, buf, 256, 0, True)
        return buf.raw[: max(n, 0)].decode(errors="replace")


def _meta(model: ctypes.c_void_p, key: str) -> str | None:
    buf = ctypes.create_string_buffer(1 << 16)
    n = L.llama_model_meta_val_str(model, key.encode(), buf, len(buf))
    if n < 0:
        return None
    if n >= len(buf):
        buf = ctypes.create_string_buffer(n + 1)
        L.llama_model_meta_val_str(model, key.encode(), buf, len(buf))
    return buf.value.decode(errors="replace")


@L.llama_log_callback
def _silent_log(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
    # llama.cpp's own chatter is noise in a service journal; errors surface as return codes.
    if level == 4 and os.environ.get("GENIEX_LLAMA_LOG"):  # GGML_LOG_LEVEL_ERROR
        print(text.decode(errors="replace"), end="", flush=True)


def load(opts: EngineOptions) -> LlamaEngine:
    return LlamaEngine(opts)
