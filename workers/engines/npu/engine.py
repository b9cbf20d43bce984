"""Chat on the NPU: a GGUF converted to an ONNX decoder (convert.py), run by onnxruntime-qnn.

llama.cpp loads the GGUF `vocab_only`: the tokenizer, the detokenizer and the chat template are
the CPU engine's own, so a prompt is tokenized exactly as there, and token selection is llama.cpp's
sampler chain (grammar included) applied to the graph's logits. One sequence at a time: each step
is one prefill chunk or one decoded token, so a Cancel is seen between them. The last conversation's
KV stays in the buffer; a request of the same tenant that starts with it evaluates only the rest.

Compute units: `npu` creates the sessions with onnxruntime's CPU fallback disabled (all of the
graph on QNN, or the load fails); `hybrid` lets onnxruntime put nodes QNN cannot take on the CPU,
and the worker measures (node profile of one decode step) which provider ran what. When QNN is
unavailable (no NPU and no simulator, see protocol/qnn.py), the architecture has no converter, or
QNN refuses the graph, the worker runs the same GGUF on llama.cpp's CPU engine instead, says why
in its log, and reports the reason in Ready.fallback (shown by /v1/workers).
"""

from __future__ import annotations

import ctypes
import os
import shutil
import struct
import tempfile
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import llama_cpp as L
import msgspec
import numpy as np
import structlog

from protocol import npu_plan
from protocol.gguf_header import Header, npu_shape
from protocol.npu_bundle import imported_shared, serves_shared, shared_load_refused
from protocol.npu_cache import NPU_DIR, cache_key
from protocol.wire import (
    PROTOCOL_VERSION,
    CountTokens,
    Delta,
    Done,
    ErrorKind,
    Failed,
    Generate,
    Logits,
    Ready,
    Started,
    TokenCount,
)
from workers.engines import Emit, EngineError, EngineOptions
from workers.engines.llama.chat_template import ChatTemplate, TemplateError, opens_reasoning
from workers.engines.llama.prompt_cache import common_prefix
from workers.engines.llama.sampling import TOKEN_DATA, Sampler, build_sampler
from workers.engines.llama.text_stream import TextStream
from workers.engines.llama_runtime import VocabTokens, init_backend, meta, piece, tokenize
from workers.engines.npu.convert import ConversionError, DecoderConfig, cached_or_convert
from workers.engines.npu.decoder import (
    CPU,
    QNN,
    Decoder,
    SessionFactory,
    cpu_session_factory,
    qnn_session_factory,
)
from workers.engines.npu.gguf_checks import check_gguf

log = structlog.get_logger("worker.npu")

DEFAULT_MAX_TOKENS = 2048


class NpuUnavailable(Exception):
    """The NPU cannot run this model here; the worker runs it on the CPU instead."""


def check_fits(gguf_path: str, nctx: int | None, header: Header | None = None, *,
               shared_weights: bool = False) -> npu_plan.Plan:  # fmt: skip
    """Refuse a model the NPU cannot hold before converting or compiling anything (a compile that
    ran for minutes and then failed, or swapped the laptop, would be the alternative). `shared_weights`:
    its prefill and decode contexts share one copy of the weights (loaded or compiled so)."""
    try:
        shape = npu_shape(gguf_path, header)
    except (OSError, ValueError, KeyError, struct.error) as exc:
        raise NpuUnavailable(f"{gguf_path}: the GGUF header cannot be read ({exc})") from None
    plan, how = npu_plan.plan_here(shape, nctx, shared_weights=shared_weights)
    log.info("npu plan", soc=plan.soc, soc_from=how, parts=len(plan.parts), weights_mb=plan.weight_bytes >> 20,
             npu_memory_mb=plan.process_bytes >> 20, shared_weights=shared_weights, fits=plan.fits)  # fmt: skip
    if not plan.fits:
        raise NpuUnavailable(plan.why_not)
    return plan


@dataclass
class Job:
    req: Generate
    tokens: list[int]
    sampler: LogitsSampler
    reasoning_open: bool
    pending: list[int] = field(default_factory=list)  # prompt tokens not yet fed
    n_cached: int = 0
    n_gen: int = 0
    max_tokens: int = 0
    last: int = -1
    text: TextStream | None = None
    started: float = 0.0


class LogitsSampler:
    """The CPU engine's sampler chain (and grammar) over logits held in numpy, as llama-server
    samples with a grammar: the chain picks, the grammar checks only that token, and only when it
    refuses does the grammar filter every candidate before the chain picks again."""

    def __init__(self, sampler: Sampler) -> None:
        self.s = sampler
        n = sampler.n_vocab
        self._ids = np.arange(n, dtype="<i4")
        self._cand = np.empty(n, dtype=TOKEN_DATA)
        self._one = np.empty(1, dtype=TOKEN_DATA)

    def sample(self, logits: np.ndarray) -> int:
        tok = self._pick(logits, with_grammar=False)
        if self.s.grammar is not None:
            self._one[0] = (tok, 0.0, 0.0)
            self._apply(self.s.grammar, self._one, 1)
            if self._one[0]["logit"] == -np.inf:
                tok = self._pick(logits, with_grammar=True)
            L.llama_sampler_accept(self.s.grammar, tok)
        L.llama_sampler_accept(self.s.chain, tok)
        return tok

    def _pick(self, logits: np.ndarray, *, with_grammar: bool) -> int:
        cand = self._cand
        cand["id"] = self._ids
        cand["logit"] = logits
        cand["p"] = 0.0
        arr = self._array(cand, len(cand))
        if with_grammar:
            L.llama_sampler_apply(self.s.grammar, ctypes.byref(arr))
        L.llama_sampler_apply(self.s.chain, ctypes.byref(arr))
        if arr.selected < 0:
            raise EngineError("the sampler chose no token", kind=ErrorKind.ENGINE)
        return int(arr.data[arr.selected].id)

    @staticmethod
    def _array(buf: np.ndarray, size: int) -> L.llama_token_data_array:
        data = ctypes.cast(buf.ctypes.data, ctypes.POINTER(L.llama_token_data))
        return L.llama_token_data_array(data=data, size=size, selected=-1, sorted=False)

    def _apply(self, sampler: ctypes.c_void_p, buf: np.ndarray, size: int) -> None:
        arr = self._array(buf, size)
        L.llama_sampler_apply(sampler, ctypes.byref(arr))

    def free(self) -> None:
        self.s.free()


def _vocab_model(path: str) -> ctypes.c_void_p:
    mparams = L.llama_model_default_params()
    mparams.vocab_only = True
    model = L.llama_model_load_from_file(path.encode(), mparams)
    if not model:
        raise EngineError(f"llama.cpp could not read the vocabulary of {path}", kind=ErrorKind.ENGINE)
    return model


def cache_dir(opts: EngineOptions) -> Path:
    """Where converted graphs live: the gateway's data dir (`--cache-dir`), else the default one."""
    given = getattr(opts, "cache_dir", "") or ""
    if given:
        return Path(given)
    base = os.environ.get("GENIEX_DATADIR") or os.path.join(os.path.expanduser("~"), ".cache", "geniex")
    return Path(base) / NPU_DIR


def loads_shared(opts: EngineOptions) -> bool:
    """Whether the worker loads weight-shared context binaries (protocol/npu_bundle.serves_shared);
    a shared bundle this host cannot load is said in the log, and compiled unshared instead."""
    folder = cache_dir(opts)
    if opts.compute == "npu" and (why := shared_load_refused()) is not None:
        try:
            if imported_shared(folder / cache_key(opts.model_path)):
                log.warning("npu weight-shared context binaries not used", reason=why)
        except OSError:
            pass
        return False
    return serves_shared(folder, opts.model_path, opts.compute)


@dataclass(frozen=True)
class Converted:
    folder: Path
    cfg: DecoderConfig
    n_ctx: int  # the context the compiled shapes attend over


def prepare(opts: EngineOptions, *, plan: bool, shared_weights: bool = False) -> Converted:
    """The GGUF checked, planned (`plan`: for QNN, refused before any work when it cannot fit) and
    converted, or NpuUnavailable with the reason: what the engine and a weight-shared compile start from."""
    try:
        header = check_gguf(opts.model_path)  # a truncated or inconsistent file: the reason, not a numpy error
    except ConversionError as exc:
        raise NpuUnavailable(str(exc)) from None
    if plan:
        check_fits(opts.model_path, opts.nctx, header, shared_weights=shared_weights)
    try:
        folder = cached_or_convert(opts.model_path, cache_dir(opts), progress=lambda m: log.info(m))
    except ConversionError as exc:
        raise NpuUnavailable(str(exc)) from None
    except Exception as exc:  # e.g. a quantization gguf-py cannot dequantize: run on the CPU
        log.exception("converting the GGUF for the NPU failed")
        raise NpuUnavailable(f"the GGUF could not be converted: {type(exc).__name__}: {exc}") from None
    cfg = DecoderConfig.load(folder)
    return Converted(folder, cfg, max(2, min(npu_plan.npu_nctx(opts.nctx), cfg.n_ctx_train)))


class NpuChatEngine(VocabTokens):
    name = "llama_npu"
    serves = (Generate, CountTokens, Logits)  # Logits only to refuse them by name

    def __init__(self, opts: EngineOptions, cpu_threads: int = 0) -> None:
        """On QNN; or, with `cpu_threads` > 0, the same graph on onnxruntime's CPU EP (the tests of
        this engine's request handling, which need no simulator)."""
        t0 = time.perf_counter()
        from workers.engines.onnx import npu_devices, qnn_options, spinning_at_start  # the QNN plugin, registered once

        devices: list[Any] = []
        if not cpu_threads:
            devices, why = npu_devices()
            if why is not None:
                raise NpuUnavailable(why)
        self.shared_weights = bool(devices) and loads_shared(opts)
        converted = prepare(opts, plan=bool(devices), shared_weights=self.shared_weights)
        folder = self.folder = converted.folder
        self.cfg, self.n_ctx = converted.cfg, converted.n_ctx
        self.compute = opts.compute
        self.builds: list[tuple[str, float, bool]] = []
        profile_dir = tempfile.mkdtemp(prefix="geniex-npu-") if opts.compute == "hybrid" and devices else None
        self.provider = QNN if devices else CPU
        factory: SessionFactory = qnn_session_factory(
            devices, qnn_options(opts.npu_performance), opts.threads or 2, cpu_fallback=opts.compute == "hybrid",
            on_build=lambda label, secs, warm: self.builds.append((label, secs, warm)), profile_dir=profile_dir,
            spinning=spinning_at_start(opts.npu_spinning), shared=self.shared_weights,
        ) if devices else cpu_session_factory(cpu_threads)  # fmt: skip
        try:
            self.decoder = Decoder(folder, self.cfg, self.n_ctx, factory)
            self.provider_nodes = self._probe_providers(profile_dir)
        except NpuUnavailable:
            raise
        except Exception as exc:  # noqa: BLE001 - QNN refused the graph: the CPU engine takes the model
            raise NpuUnavailable(f"QNN could not take the graph: {type(exc).__name__}: {exc}") from None
        finally:
            if profile_dir is not None:
                shutil.rmtree(profile_dir, ignore_errors=True)
        for label, secs, warm in self.builds:
            log.info("npu session ready", shape=label, seconds=round(secs, 2), context_cache="warm" if warm else "cold")
        init_backend()
        self.model = _vocab_model(opts.model_path)
        self.vocab = L.llama_model_get_vocab(self.model)
        self.n_vocab = L.llama_vocab_n_tokens(self.vocab)
        if self.n_vocab != self.cfg.n_vocab:
            L.llama_model_free(self.model)
            raise NpuUnavailable(f"the vocabulary has {self.n_vocab} tokens but the graph {self.cfg.n_vocab} rows")
        self.template = ChatTemplate(
            meta(self.model, "tokenizer.chat_template"),
            bos_token=piece(self.vocab, L.llama_vocab_bos(self.vocab)).decode(errors="replace"),
            eos_token=piece(self.vocab, L.llama_vocab_eos(self.vocab)).decode(errors="replace"),
        )
        self.add_bos = bool(L.llama_vocab_get_add_bos(self.vocab))
        self.waiting: deque[Job] = deque()
        self.job: Job | None = None
        self.counts: deque[TokenCount] = deque()
        self.history: list[int] = []  # tokens whose KV the buffer holds, and whose they are
        self.tenant = ""
        self._piece_buf = ctypes.create_string_buffer(256)
        self.load_seconds = time.perf_counter() - t0
        log.info("npu chat model loaded", folder=str(folder), compute=self.compute, n_ctx=self.n_ctx,
                 nodes=self.provider_nodes, weights=self.cfg.quantization, shared_weights=self.shared_weights,
                 seconds=round(self.load_seconds, 2))  # fmt: skip

    def _probe_providers(self, profile_dir: str | None) -> dict[str, int]:
        """Nodes per provider. With CPU fallback disabled onnxruntime has already refused anything
        QNN does not take whole; under `hybrid` one profiled decode step says where each node ran."""
        from workers.engines.onnx import nodes_by_provider

        parts = self.cfg.graph_parts()
        if profile_dir is None:
            import onnx

            graphs = [onnx.load(str(self.folder / p.graph), load_external_data=False).graph for p in parts]
            return {self.provider: sum(len(g.node) for g in graphs)}
        self.decoder.decode(0)
        self.decoder.reset()
        nodes: dict[str, int] = {}
        for session in self.decoder.decode_sessions:  # every part's
            for provider, n in nodes_by_provider(session.end_profiling()).items():
                nodes[provider] = nodes.get(provider, 0) + n
        if nodes.get(QNN, 0) == 0:
            raise NpuUnavailable(f"QNN took no node of the graph ({nodes})")
        return nodes

    # ---- Engine interface --------------------------------------------------

    def ready(self) -> Ready:
        nodes = ", ".join(f"{p}: {n}" for p, n in sorted(self.provider_nodes.items()))
        return Ready(
            protocol_version=PROTOCOL_VERSION,
            pid=os.getpid(),
            engine=self.name,
            compute=self.compute,
            n_ctx=self.n_ctx,
            n_ctx_train=self.cfg.n_ctx_train,
            n_vocab=self.n_vocab,
            parallel=1,
            model_bytes=sum((self.folder / p.weights).stat().st_size for p in self.cfg.graph_parts()),
            load_seconds=round(self.load_seconds, 3),
            chat_template=self.template.is_native,
            description=f"{self.cfg.arch} ONNX decoder, {self.cfg.n_layer} layers; graph nodes per provider: {nodes}; "
            f"weights: {self.cfg.quantization}",
            provider=self.provider,
            tool_format=self.template.tool_format,
        )

    def submit(self, req: Generate | CountTokens | Logits) -> None:
        if isinstance(req, Logits):
            raise EngineError("/v1/logits is not available on the NPU engine (compute npu/hybrid); ask for compute cpu")
        if isinstance(req, CountTokens):
            if req.images:
                raise EngineError(
                    "images are not available on the NPU engine (compute npu/hybrid); ask for compute cpu"
                )
            tokens, _ = self._chat_tokens(req.messages, req.template_vars, req.tools)
            self.counts.append(TokenCount(req.req_id, len(tokens)))
            return
        if req.speculation is not None:
            raise EngineError("speculative decoding is not available on the NPU engine (compute npu/hybrid)")
        if req.logprobs >= 0:
            raise EngineError("`logprobs` are not available on the NPU engine (compute npu/hybrid)")
        if req.suffix is not None:
            raise EngineError("`suffix` (fill in the middle) is not available on the NPU engine (compute npu/hybrid)")
        if req.images:
            raise EngineError("images are not available on the NPU engine (compute npu/hybrid); ask for compute cpu")
        if req.messages is not None:
            tokens, reasoning_open = self._chat_tokens(req.messages, req.template_vars, req.tools)
        else:
            tokens, reasoning_open = self._tokens(req.prompt or ""), False
        if req.reasoning_budget >= 0:  # said, not refused: the server's --reasoning-budget reaches every model
            log.info("reasoning budget not applied on the NPU engine", request_id=req.log_id,
                     reasoning_budget=req.reasoning_budget)  # fmt: skip
        if not tokens:
            raise EngineError("the prompt is empty")
        if len(tokens) >= self.n_ctx:
            raise EngineError(
                f"the prompt is {len(tokens)} tokens, but the NPU context is {self.n_ctx}; shorten it",
                code="context_length_exceeded",
            )
        sampler = LogitsSampler(build_sampler(req, self.vocab, self.n_vocab))
        self.waiting.append(Job(req, tokens, sampler, reasoning_open))

    def cancel(self, req_id: int, emit: Emit) -> None:
        for job in self.waiting:
            if job.req.req_id == req_id:
                self.waiting.remove(job)
                job.sampler.free()
                emit(Done(req_id, "cancelled"))
                return
        run = self.job
        if run is not None and run.req.req_id == req_id:
            log.info("cancelled", request_id=run.req.log_id, generated=run.n_gen)
            emit(Done(req_id, "cancelled", prompt_tokens=len(run.tokens), completion_tokens=run.n_gen,
                      cached_tokens=run.n_cached))  # fmt: skip
            self._release(completed=False)

    def has_work(self) -> bool:
        return bool(self.waiting or self.counts or self.job)

    def set_threads(self, n: int) -> None:
        pass  # the graph runs on the NPU; the host's share of work is copying the KV buffer

    def idle(self) -> None:
        pass

    def close(self) -> None:
        if self.job is not None:
            self._release(completed=False)
        for job in self.waiting:
            job.sampler.free()
        self.waiting.clear()
        L.llama_model_free(self.model)

    # ---- the step ------------------------------------------------------------

    def step(self, emit: Emit) -> None:
        while self.counts:
            emit(self.counts.popleft())
        if self.job is None:
            if not self.waiting:
                return
            self._admit(self.waiting.popleft(), emit)
        job = self.job
        assert job is not None
        try:
            if job.pending:
                chunk, job.pending = job.pending[: self.decoder.chunk], job.pending[self.decoder.chunk :]
                logits = self.decoder.prefill(chunk)
                if job.pending:
                    return
            else:
                logits = self.decoder.decode(job.last)
            assert logits is not None
            self._take(job, job.sampler.sample(logits), emit)
        except EngineError as exc:
            emit(exc.failed(job.req.req_id))
            self._release(completed=False)
        except Exception as exc:  # this request fails; the worker serves the next one
            log.exception("request failed in the npu worker", request_id=job.req.log_id, error=repr(exc))
            emit(Failed(job.req.req_id, ErrorKind.ENGINE, f"the worker failed this request ({type(exc).__name__})"))
            self._release(completed=False)

    def _admit(self, job: Job, emit: Emit) -> None:
        req = job.req
        reuse = 0
        if req.cache and req.cache_key == self.tenant:
            reuse = min(common_prefix(self.history, job.tokens), len(job.tokens) - 1)
        self.decoder.reset(reuse)
        self.history = list(job.tokens)
        self.tenant = req.cache_key
        job.n_cached = reuse
        job.pending = job.tokens[reuse:]
        wanted = req.max_tokens if req.max_tokens is not None else DEFAULT_MAX_TOKENS
        job.max_tokens = max(1, min(wanted, self.n_ctx - len(job.tokens)))
        job.text = TextStream(req.stop)
        job.started = time.perf_counter()
        self.job = job
        emit(Started(req.req_id, len(job.tokens), reuse, job.reasoning_open))

    def _take(self, job: Job, tok: int, emit: Emit) -> None:
        req = job.req
        assert job.text is not None
        job.n_gen += 1
        if L.llama_vocab_is_eog(self.vocab, tok):
            job.n_gen -= 1
            self._finish(job, "stop", emit)
            return
        text = job.text.feed(piece(self.vocab, tok, req.special, self._piece_buf))
        if text:
            emit(Delta(req.req_id, text, job.n_gen))
        if job.text.stopped:
            self._finish(job, "stop", emit, flush=False)
        elif job.n_gen >= job.max_tokens:
            self._finish(job, "length", emit)
        else:
            job.last = tok
            self.history.append(tok)

    def _finish(self, job: Job, reason: str, emit: Emit, *, flush: bool = True) -> None:
        assert job.text is not None
        rest = job.text.flush() if flush else ""
        if rest:
            emit(Delta(job.req.req_id, rest, job.n_gen))
        emit(Done(job.req.req_id, reason, prompt_tokens=len(job.tokens), completion_tokens=job.n_gen,
                  cached_tokens=job.n_cached, stop_sequence=job.text.matched))  # fmt: skip
        log.info("generation done", request_id=job.req.log_id, finish=reason, prompt_tokens=len(job.tokens),
                 completion_tokens=job.n_gen, seconds=round(time.perf_counter() - job.started, 3))  # fmt: skip
        self._release(completed=True)

    def _release(self, *, completed: bool) -> None:
        job = self.job
        self.job = None
        if job is None:
            return
        job.sampler.free()
        if completed and job.req.cache:
            self.history = self.history[: self.decoder.n_past]  # the last sampled token has no KV yet
        else:
            self.history, self.tenant = [], ""
            self.decoder.reset()

    # ---- tokens ------------------------------------------------------------

    def _chat_tokens(self, messages: list[dict[str, Any]], variables: dict[str, Any],
                     tools: list[dict[str, Any]] | None) -> tuple[list[int], bool]:  # fmt: skip
        try:
            text = self.template.render(messages, variables, tools)
        except TemplateError as exc:
            raise EngineError(f"`messages`: {exc}") from exc
        return self._tokens(text), opens_reasoning(text)

    def _tokens(self, text: str) -> list[int]:
        bos = self.template.bos_token
        return tokenize(self.vocab, text, add_special=self.add_bos and not (bos and text.startswith(bos)))


class CpuFallback:
    """llama.cpp's CPU chat engine standing in for the NPU, with the reason in its Ready."""

    serves = (Generate, CountTokens, Logits)  # the CPU engine's

    def __init__(self, opts: EngineOptions, reason: str) -> None:
        from workers.engines.llama.engine import LlamaEngine

        try:
            self.engine = LlamaEngine(msgspec.structs.replace(opts, compute="cpu"))
        except EngineError as exc:  # a broken file: both reasons, the NPU's being the more precise
            raise EngineError(f"{exc.message}; the NPU refused it too: {reason}", kind=exc.kind) from None
        self.reason = reason

    def ready(self) -> Ready:
        r = self.engine.ready()
        r.fallback = self.reason
        r.description = f"{r.description}; on the CPU because {self.reason}"
        return r

    def __getattr__(self, name: str) -> Any:
        return getattr(self.engine, name)


def load(opts: EngineOptions) -> NpuChatEngine | CpuFallback:
    try:
        return NpuChatEngine(opts)
    except NpuUnavailable as exc:
        log.warning("npu chat unavailable; running on cpu", requested=opts.compute, reason=str(exc))
        return CpuFallback(opts, str(exc))
