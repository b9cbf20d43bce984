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

This module is the facade: the slots and their admission are `slots.py`'s, drafting and
verifying `speculation.py`'s; here are the Engine interface, the step, and turning sampled
tokens into the gateway's messages.
"""

from __future__ import annotations

import ctypes
import time
from collections import deque
from pathlib import Path
from typing import Any

import llama_cpp as L
import structlog

from protocol.overflow import budget
from protocol.wire import (
    CountTokens,
    Delta,
    Done,
    ErrorKind,
    Failed,
    Generate,
    ImageInput,
    Logits,
    LogprobDelta,
    Ready,
    TokenCount,
    TokenLogprob,
)
from workers.engines import Emit, EngineError, EngineOptions
from workers.engines.llama.chat_template import (
    ChatTemplate,
    TemplateError,
    opens_reasoning,
)
from workers.engines.llama.disk_cache import DiskCache, fingerprint
from workers.engines.llama.logits import LogitsJob
from workers.engines.llama.logprobs import token_logprobs
from workers.engines.llama.media import Media, MediaPrompt, flatten, text_run
from workers.engines.llama.sampling import build_sampler
from workers.engines.llama.schedule import by_rank, chunk_limit, paused
from workers.engines.llama.slots import Queued, Run, Slot, Slots, SlotState
from workers.engines.llama.speculation import Speculator
from workers.engines.llama.think_budget import UNLIMITED, ThinkBudget
from workers.engines.llama.truncation import Prompt, Reports, truncate
from workers.engines.llama_runtime import (
    Threads,
    VocabTokens,
    default_threads,
    gpu_layers,
    htp_devices,
    init_backend,
    kv_bytes_per_token,
    load_model,
    meta,
    piece,
    put,
    ready,
    runs_on,
    slot_context,
    tokenize,
)

log = structlog.get_logger("worker.llama")

N_BATCH = 512  # tokens per decode step, decode tokens first, then prompt chunks
# Prompt tokens in a step whose thread count rests on a stale reading (see Threads.tentative): a
# short step, so that a fresh reading soon puts the right number of threads on the rest.
TENTATIVE_BATCH = 64


def disk_cache(opts: EngineOptions, nctx: int) -> DiskCache | None:
    """The disk tier of the prompt cache, keyed to what a saved state depends on; None when off."""
    if not opts.cache_disk_mb or not opts.prompt_cache_dir:
        return None
    build = f"{L.__version__} {L.llama_print_system_info().decode(errors='replace')}"
    kv_types = f"{getattr(opts, 'cache_type_k', 'f16')}/{getattr(opts, 'cache_type_v', 'f16')}"
    return DiskCache(Path(opts.prompt_cache_dir), opts.cache_disk_mb << 20,
                     fingerprint(opts.model_path, build, nctx, kv_types))  # fmt: skip


class LlamaEngine(VocabTokens):
    name = "llama_cpp"
    serves = (Generate, CountTokens, Logits)

    def __init__(self, opts: EngineOptions) -> None:
        t0 = time.perf_counter()
        init_backend()
        self.compute, self.fallback = runs_on(opts.compute)
        self.n_gpu_layers = gpu_layers(self.compute, opts.ngl)
        self.model = model = load_model(
            opts.model_path, self.n_gpu_layers, only=htp_devices() if self.compute == "npu" else None
        )
        self.vocab = L.llama_model_get_vocab(model)
        self.n_vocab = L.llama_vocab_n_tokens(self.vocab)
        self.nctx = opts.nctx
        self.parallel = max(1, opts.parallel or 1)
        threads = default_threads(opts.threads)
        self.kv_types = (opts.cache_type_k, opts.cache_type_v)
        self.ctx = slot_context(model, nctx=self.nctx, parallel=self.parallel, n_batch=N_BATCH, threads=threads,
                                offload=self.n_gpu_layers > 0, type_k=self.kv_types[0], type_v=self.kv_types[1])  # fmt: skip
        self.mem = L.llama_get_memory(self.ctx)
        self.batch = L.llama_batch_init(N_BATCH, 0, 1)
        self._piece_buf = ctypes.create_string_buffer(256)
        self.template = ChatTemplate(
            meta(model, "tokenizer.chat_template"),
            bos_token=piece(self.vocab, L.llama_vocab_bos(self.vocab)).decode(errors="replace"),
            eos_token=piece(self.vocab, L.llama_vocab_eos(self.vocab)).decode(errors="replace"),
        )
        self.add_bos = bool(L.llama_vocab_get_add_bos(self.vocab))
        self.slots = Slots(
            self.ctx, self.mem, self.parallel, self.nctx, opts.cache_ram_mb << 20, disk_cache(opts, self.nctx)
        )
        mmproj = getattr(opts, "mmproj", "")
        self.media = Media(mmproj, model, threads, gpu=self.n_gpu_layers > 0) if mmproj else None
        self.speculator = Speculator(self.vocab, self.n_vocab, n_gpu_layers=self.n_gpu_layers, nctx=self.nctx,
                                     parallel=self.parallel, n_batch=N_BATCH, kv_types=self.kv_types)  # fmt: skip
        self.threads = Threads(threads, lambda: [self.ctx, *self.speculator.contexts()])
        self.logit_jobs: deque[LogitsJob] = deque()
        self.counts: deque[TokenCount] = deque()  # answered at the next step: nothing to decode
        self.truncated = Reports()  # `truncation: auto`: what each queued request's prompt dropped
        self.tokens_generated = 0
        self._closings: dict[str, list[int]] = {}  # a thinking section's closing text -> its tokens
        # Text that comes sooner than this after the last Delta waits for the next one: at
        # high token rates every Delta costs the gateway and the client a wake-up, a write
        # and a parse, CPU taken from decoding on a small machine (bench/README.md). The
        # interval grows with the sequences decoding at once (`coalesce_s`), so the Deltas a
        # worker sends per second stay about the same under load (at 4 streams it halved the
        # client's and the gateway's CPU per token). The first token always goes at once.
        self.coalesce = max(0, opts.stream_interval_ms) / 1000
        self.coalesce_s = self.coalesce
        self.load_seconds = time.perf_counter() - t0

    # ---- Engine interface --------------------------------------------------

    def ready(self) -> Ready:
        return ready(self.model, engine=self.name, compute=self.compute, n_ctx=self.nctx, parallel=self.parallel,
                     load_seconds=self.load_seconds, n_gpu_layers=self.n_gpu_layers, chat_template=self.template.is_native,
                     tool_format=self.template.tool_format, fallback=self.fallback,
                     kv_bytes_per_token=kv_bytes_per_token(self.model, *self.kv_types), cache_type_k=self.kv_types[0],
                     cache_type_v=self.kv_types[1])  # fmt: skip

    def submit(self, req: Generate | CountTokens | Logits) -> None:
        if isinstance(req, CountTokens):
            if req.images:
                counted, _ = self._media_prompt(req.messages, req.template_vars, req.tools, req.images)
                self.counts.append(TokenCount(req.req_id, counted.n_tokens))
                counted.free()
            else:
                tokens, _ = self._chat_tokens(req.messages, req.template_vars, req.tools)
                self.counts.append(TokenCount(req.req_id, len(tokens)))
            return
        if isinstance(req, Logits):
            self.logit_jobs.append(LogitsJob.checked(req, n_vocab=self.n_vocab, nctx=self.nctx))
            return
        if req.speculation is not None:
            if req.images:
                raise EngineError("`speculative`: speculative decoding is not supported with images")
            self.speculator.check(req.speculation, self.threads.n)
        media: MediaPrompt | None = None
        if req.images:
            if req.messages is None:
                raise EngineError("`images` need chat `messages`")
            media, reasoning_open = self._media_prompt(req.messages, req.template_vars, req.tools, req.images)
            tokens = media.keys
        else:
            tokens, reasoning_open = self._prompt_tokens(req)
        dropped = None
        if req.truncation == "auto" and req.messages and len(tokens) > budget(self.nctx, req.max_tokens):
            try:
                (tokens, reasoning_open, media), dropped = truncate(
                    req, (tokens, reasoning_open, media), self.nctx, lambda m, i: self._candidate(req, m, i)
                )
            except BaseException:
                if media is not None:
                    media.free()
                raise
        think = self._think(req, reasoning_open)
        if think is not None and think.spent:
            # Budget 0 and the prompt opened the section: it is closed in the prompt, before any token.
            tokens = [*tokens, *self._closing_tokens(think.closing())]
            reasoning_open = False
            if media is not None:
                media.n_tokens += len(tokens) - len(media.keys)
                media.keys = tokens
        if len(tokens) >= self.nctx:
            n = media.n_tokens if media is not None else len(tokens)
            if media is not None:
                media.free()
            left = f" with its {dropped.messages} oldest messages dropped" if dropped else ""
            raise EngineError(
                f"the prompt is {n} tokens{left}, but the context is {self.nctx}; shorten it or ask for a larger "
                "`nctx`",
                code="context_length_exceeded",
            )
        try:
            sampler = build_sampler(req, self.vocab, self.n_vocab)
        except BaseException:
            if media is not None:
                media.free()
            raise
        self.slots.waiting.append(Queued(req, tokens, sampler, reasoning_open, media, think))
        if dropped is not None:
            self.truncated.pending[req.req_id] = dropped

    def cancel(self, req_id: int, emit: Emit) -> None:
        for job in self.logit_jobs:
            if job.req.req_id == req_id:
                self.logit_jobs.remove(job)
                emit(Done(req_id, "cancelled"))
                return
        if (q := self.slots.unqueue(req_id)) is not None:
            self.truncated.pending.pop(req_id, None)
            q.sampler.free()
            if q.media is not None:
                q.media.free()
            emit(Done(req_id, "cancelled"))
            return
        if (slot := self.slots.find(req_id)) is not None:
            run = slot.run
            log.info("cancelled", request_id=run.req.log_id, generated=run.n_gen)
            acc, rej = (run.spec.accepted, run.spec.rejected) if run.spec else (0, 0)
            emit(Done(req_id, "cancelled", prompt_tokens=run.n_prompt, completion_tokens=run.n_gen,
                      accepted_tokens=acc, rejected_tokens=rej,
                      reasoning_tokens=run.think.tokens if run.think else 0))  # fmt: skip
            self._release(slot, completed=False)

    def has_work(self) -> bool:
        return bool(self.slots.waiting or self.logit_jobs or self.counts) or self.slots.running() > 0

    def set_threads(self, n: int) -> None:
        """The gateway's share of the cores; the governor uses fewer while others keep them busy."""
        self.threads.set_share(n)

    def idle(self) -> None:
        self.threads.idle()

    def close(self) -> None:
        for slot in self.slots:
            self.speculator.release(slot)
        self.slots.close()
        self.speculator.close()
        if self.media is not None:
            self.media.close()
        L.llama_batch_free(self.batch)
        L.llama_free(self.ctx)
        L.llama_model_free(self.model)

    # ---- the decode step ---------------------------------------------------

    def step(self, emit: Emit) -> None:
        while self.counts:
            emit(self.counts.popleft())
        if not (self.slots.waiting or self.logit_jobs or self.slots.running()):
            return
        self.threads.before_step()
        if self.logit_jobs:
            self._run_logits(emit)
        self.slots.admit(self.truncated.emit(emit), self.speculator.start)
        self.coalesce_s = self.coalesce * max(1, self.slots.running())
        # Background sequences sit this step out while interactive work runs (llama/schedule.py).
        busy = [slot for slot in self.slots if slot.state is not SlotState.FREE]
        held = paused((slot.run for slot in busy), time.monotonic())
        stepping = [slot for i, slot in enumerate(busy) if i not in held]
        if self.speculator.active:
            self.speculator.make_drafts(stepping)
        if self.media is not None:
            self._prefill_image(emit, stepping)
        for i in held:
            busy[i].run.row = -1
        batch = self.batch
        n = 0
        # Running sequences first: one token each (plus a draft to verify), so they never
        # wait behind a prompt.
        for slot in stepping:
            if slot.state is SlotState.FREE:  # its image failed just now
                continue
            run = slot.run
            run.row = -1
            if slot.state is SlotState.DECODE:
                if run.inject and n + 1 + len(run.inject) > N_BATCH:
                    continue  # a full batch (many slots): its close goes in at the next step
                n = put(batch, n, run.last_token, run.n_past, slot.seq, not run.inject)
                run.row = n - 1
                run.n_past += 1
                if run.inject:  # a thinking section's close, as if sampled: the next token follows it
                    for tok in run.inject:
                        n = put(batch, n, tok, run.n_past, slot.seq, False)
                        run.n_past += 1
                    batch.logits[n - 1] = True
                    run.row = n - 1
                    run.inject = []
                elif run.spec is not None and run.spec.draft:
                    for tok in run.spec.draft:
                        n = put(batch, n, tok, run.n_past, slot.seq)
                        run.n_past += 1
        # Then prompt chunks, as much as the batch holds, interactive ones first.
        limit = TENTATIVE_BATCH if self.threads.tentative else N_BATCH
        prefilling = [slot for slot in stepping if slot.state is SlotState.PREFILL]
        for slot in sorted(prefilling, key=lambda s: by_rank(s.run.priority)):
            if n >= limit:
                continue
            run = slot.run
            take = min(text_run(run.pending_prompt), chunk_limit(run.priority, limit - n))  # up to the next image
            if take == 0:
                continue
            chunk = slot.feed(take)
            ends = slot.state is SlotState.DECODE  # the prompt's last token: its logits give the first token
            for j, tok in enumerate(chunk):
                n = put(batch, n, tok, run.n_past + j, slot.seq, ends and j == take - 1)
            run.n_past += take
            if ends:
                run.row = n - 1
        if n == 0:
            return
        batch.n_tokens = n
        t0 = time.perf_counter()
        rc = L.llama_decode(self.ctx, batch)
        self.threads.after_step(n, time.perf_counter() - t0)
        if rc != 0:
            for slot in self.slots:
                if slot.state is SlotState.DECODE and slot.run.row >= 0:
                    emit(Failed(slot.run.req.req_id, ErrorKind.ENGINE, f"llama_decode failed with status {rc}"))
                    self._release(slot, completed=False)
            return
        for slot in self.slots:
            if slot.state is SlotState.DECODE and slot.run.row >= 0:
                run = slot.run
                try:
                    if run.spec is not None and run.spec.draft:
                        self.speculator.verify(slot, self.ctx, self.mem,
                                               lambda s, tok, row: self._take(s, tok, emit, row))  # fmt: skip
                    else:
                        self._take(slot, run.sampler.sample(self.ctx, run.row), emit, run.row)
                except Exception as exc:  # noqa: BLE001 - one request's failure is not its neighbours'
                    self._fail(slot, exc, emit)

    def _prefill_image(self, emit: Emit, slots: list[Slot]) -> None:
        """One image of one prefilling slot, encoded and decoded into its sequence, before this
        step's batch (its KV must precede the text after it). A decode of embeddings cannot carry
        tokens, so it runs on its own, and only one per step: the other slots decode between images."""
        assert self.media is not None
        for slot in slots:
            if slot.state is not SlotState.PREFILL:
                continue
            run = slot.run
            if run.media is None or run.pending_prompt[0] >= 0:
                continue
            chunk = run.media.at.get(run.n_past)
            try:
                if chunk is None:
                    raise EngineError("an image's place in the prompt was lost", kind=ErrorKind.ENGINE)
                t0 = time.perf_counter()
                new_past = self.media.evaluate(chunk, self.ctx, run.n_past, slot.seq, N_BATCH)
                self.threads.after_step(new_past - run.n_past, time.perf_counter() - t0)
            except Exception as exc:  # noqa: BLE001 - one request's failure is not its neighbours'
                self._fail(slot, exc, emit)
                return
            slot.feed(new_past - run.n_past)
            run.n_past = new_past
            return

    def _take(self, slot: Slot, tok: int, emit: Emit, row: int) -> bool:
        """Emit one sampled token; False when it ended the generation (the slot is released)."""
        run = slot.run
        req = run.req
        run.n_gen += 1
        self.tokens_generated += 1
        if L.llama_vocab_is_eog(self.vocab, tok):
            run.n_gen -= 1  # the end-of-generation token is not part of the answer
            self._finish(slot, "stop", emit)
            return False
        text_bytes = piece(self.vocab, tok, req.special, self._piece_buf)
        spent = run.think.feed(text_bytes.decode(errors="replace")) if run.think is not None else False
        if run.logprobs is not None:
            run.logprobs.append(token_logprobs(self.ctx, row, self.n_vocab, tok, text_bytes, req.logprobs,
                                               lambda t: piece(self.vocab, t, False, self._piece_buf)))  # fmt: skip
        text = run.text.feed(text_bytes)
        if run.text.stopped:
            if text:
                self._emit_text(run, text, emit)
            self._finish(slot, "stop", emit, flush=False)
            return False
        if text:
            self._emit_text(run, text, emit)
        if run.n_gen >= run.max_tokens:
            self._finish(slot, "length", emit)
            return False
        run.last_token = tok
        slot.history.append(tok)
        if spent:
            return self._close_thinking(slot, emit)
        return True

    def _close_thinking(self, slot: Slot, emit: Emit) -> bool:
        """The thinking budget is spent: the closing text goes out and into the sequence as if the
        model had written it (the next step decodes it after the last token), counted as completion
        tokens, bounded by max_tokens as they are; False when it ended the generation."""
        run = slot.run
        assert run.think is not None
        tokens = self._closing_tokens(run.think.closing())[: run.max_tokens - run.n_gen]
        pieces = [piece(self.vocab, t, run.req.special, self._piece_buf) for t in tokens]
        for t in tokens:
            run.sampler.accept(t)
        run.n_gen += len(tokens)
        self.tokens_generated += len(tokens)
        if run.logprobs is not None:  # forced, not sampled: certain, with no alternatives
            run.logprobs.extend(TokenLogprob(p, 0.0) for p in pieces)
        text = run.text.feed(b"".join(pieces))
        if text:
            self._emit_text(run, text, emit)
        if run.text.stopped:
            self._finish(slot, "stop", emit, flush=False)
            return False
        if run.n_gen >= run.max_tokens:
            self._finish(slot, "length", emit)
            return False
        run.inject = tokens
        slot.history.extend(tokens)
        return True

    def _think(self, req: Generate, opened: bool) -> ThinkBudget | None:
        """A chat request's thinking section. Under a grammar (a JSON schema, a forced tool call) the
        budget is not applied: the grammar shapes the whole output, and it might refuse the closing
        text; its section is still counted."""
        if req.messages is None:
            return None
        budget = UNLIMITED if req.constraint is not None else req.reasoning_budget
        return ThinkBudget(budget, opened=opened)

    def _closing_tokens(self, text: str) -> list[int]:
        tokens = self._closings.get(text)
        if tokens is None:
            tokens = self._closings[text] = tokenize(self.vocab, text, add_special=False)
        return tokens

    def _emit_text(self, run: Run, text: str, emit: Emit, *, final: bool = False) -> None:
        if self.coalesce and not final:
            now = time.perf_counter()
            if run.n_gen > 1 and now - run.last_emit < self.coalesce_s:
                run.held += text  # goes out with the next Delta
                return
            run.last_emit = now
        if run.held:
            text, run.held = run.held + text, ""
        if run.logprobs:  # the tokens this text came from (a held-back token waits for its text)
            emit(LogprobDelta(run.req.req_id, text, run.n_gen, run.logprobs))
            run.logprobs = []
        else:
            emit(Delta(run.req.req_id, text, run.n_gen))

    def _finish(self, slot: Slot, reason: str, emit: Emit, *, flush: bool = True) -> None:
        run = slot.run
        req = run.req
        rest = run.text.flush() if flush else ""
        if rest or run.held:
            self._emit_text(run, rest, emit, final=True)
        elif run.logprobs:  # tokens whose text never showed (e.g. a lone partial character)
            emit(LogprobDelta(req.req_id, "", run.n_gen, run.logprobs))
        acc, rej = (run.spec.accepted, run.spec.rejected) if run.spec else (0, 0)
        emit(Done(req.req_id, reason, prompt_tokens=run.n_prompt, completion_tokens=run.n_gen,
                  cached_tokens=run.n_cached, accepted_tokens=acc, rejected_tokens=rej,
                  stop_sequence=run.text.matched, reasoning_tokens=run.think.tokens if run.think else 0))  # fmt: skip
        secs = time.perf_counter() - run.started
        extra = {"spec": run.spec.cfg.type, "accepted": acc, "rejected": rej} if run.spec else {}
        log.info("generation done", request_id=req.log_id, finish=reason, prompt_tokens=run.n_prompt,
                 completion_tokens=run.n_gen, seconds=round(secs, 3), **extra)  # fmt: skip
        self._release(slot, completed=True)

    def _fail(self, slot: Slot, exc: Exception, emit: Emit) -> None:
        req = slot.run.req
        log.exception("request failed in the worker", request_id=req.log_id, error=repr(exc))
        emit(Failed(req.req_id, ErrorKind.ENGINE, f"the worker failed this request ({type(exc).__name__})"))
        self._release(slot, completed=False)

    def _release(self, slot: Slot, *, completed: bool) -> None:
        self.speculator.release(slot)
        self.slots.release(slot, completed)

    # ---- /v1/logits --------------------------------------------------------

    def _run_logits(self, emit: Emit) -> None:
        """One forward-pass job per step, in a free slot's sequence, so running generations
        lose one step, not the whole job queue. No sampler, no decode loop."""
        slot = self.slots.scratch()
        if slot is None:
            return
        job = self.logit_jobs.popleft()
        try:
            emit(job.run(self.ctx, self.batch, N_BATCH, slot.seq))
        except EngineError as exc:
            emit(exc.failed(job.req.req_id))
        except Exception as exc:
            log.exception("logits job failed", request_id=job.req.log_id, error=repr(exc))
            emit(Failed(job.req.req_id, ErrorKind.ENGINE, f"the worker failed this request ({type(exc).__name__})"))
        finally:
            L.llama_memory_seq_rm(self.mem, slot.seq, -1, -1)

    # ---- tokens ------------------------------------------------------------

    def _prompt_tokens(self, req: Generate) -> tuple[list[int], bool]:
        """The prompt's tokens, and whether the rendered chat prompt ends inside a `<think>` block
        it opened (thinking forced on by the template: the output starts as reasoning)."""
        if req.messages is not None:
            return self._chat_tokens(req.messages, req.template_vars, req.tools)
        text = req.prompt or ""
        if req.suffix is not None:
            return self._fim_tokens(text, req.suffix), False
        return self._tokens(text), False

    def _chat_tokens(self, messages: list[dict[str, Any]], variables: dict[str, Any],
                     tools: list[dict[str, Any]] | None) -> tuple[list[int], bool]:  # fmt: skip
        """A chat prompt rendered by the model's template, its tokens, and whether it opened `<think>`."""
        text, _ = self._render(messages, variables, tools, "")
        return self._tokens(text), opens_reasoning(text)

    def _candidate(self, req: Generate, messages: list[dict[str, Any]], images: list[ImageInput]) -> Prompt:
        """A prompt of `req` with other messages (`truncation: auto` measures several)."""
        if req.images:
            media, opened = self._media_prompt(messages, req.template_vars, req.tools, images)
            return media.keys, opened, media
        tokens, opened = self._chat_tokens(messages, req.template_vars, req.tools)
        return tokens, opened, None

    def _render(self, messages: list[dict[str, Any]], variables: dict[str, Any],
                tools: list[dict[str, Any]] | None, marker: str) -> tuple[str, int]:  # fmt: skip
        """The chat prompt, image parts as `marker` (none without images: counting text only), and
        how many image parts there were."""
        messages, n_images = flatten(messages, marker)
        try:
            return self.template.render(messages, variables, tools), n_images
        except TemplateError as exc:
            raise EngineError(f"`messages`: {exc}") from exc

    def _media_prompt(self, messages: list[dict[str, Any]], variables: dict[str, Any],
                      tools: list[dict[str, Any]] | None, images: list[ImageInput]) -> tuple[MediaPrompt, bool]:  # fmt: skip
        """A chat prompt with images, tokenized by mtmd into keys (llama/media.py)."""
        if self.media is None:
            raise EngineError("`messages`: this model has no multimodal projector; it cannot read images",
                              kind=ErrorKind.UNSUPPORTED)  # fmt: skip
        text, n_images = self._render(messages, variables, tools, self.media.marker)
        if n_images != len(images):
            raise EngineError(f"`messages` has {n_images} image parts but {len(images)} images came with it")
        return self.media.tokenize(text, images, add_special=self._add_special(text)), opens_reasoning(text)

    def _tokens(self, text: str) -> list[int]:
        return tokenize(self.vocab, text, add_special=self._add_special(text))

    def _add_special(self, text: str) -> bool:
        """BOS is added unless the template already wrote it."""
        bos = self.template.bos_token
        return self.add_bos and not (bos and text.startswith(bos))

    def _fim_tokens(self, prefix: str, suffix: str) -> list[int]:
        """<fim_pre>prefix<fim_suf>suffix<fim_mid>: the model writes what goes between."""
        v = self.vocab
        pre, suf, mid = L.llama_vocab_fim_pre(v), L.llama_vocab_fim_suf(v), L.llama_vocab_fim_mid(v)
        if min(pre, suf, mid) < 0:
            raise EngineError("`suffix`: this model has no fill-in-the-middle tokens")
        head = [L.llama_vocab_bos(v)] if self.add_bos else []
        return [*head, pre, *tokenize(v, prefix, add_special=False), suf, *tokenize(v, suffix, add_special=False), mid]


def load(opts: EngineOptions) -> LlamaEngine:
    return LlamaEngine(opts)
