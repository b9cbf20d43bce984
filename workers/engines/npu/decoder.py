"""Runs a converted decoder graph (convert.py) with static shapes: chunked prefill, then one token
per step, over a KV buffer the host owns.

Two onnxruntime sessions of the same graph, each with its symbolic dimensions pinned
(free-dimension overrides), because the HTP backend compiles static shapes only:
- prefill: `seq` = CHUNK tokens (a short last chunk is padded; its padding is masked and dropped);
- decode: `seq` = 1.
Both attend over `past` = the context length: the whole KV buffer is passed every step, and the
additive mask hides the positions not written yet. The graph returns only the new tokens' K/V,
which are written into the buffer here.

The graph takes the tokens' embeddings (`inputs_embeds`), not their ids: TokenEmbeddings reads the
rows from the GGUF's own table (memory-mapped), dequantizing only the rows a step needs.

A model converted in several parts (npu.json `parts`: each graph at most npu_plan.PART_LIMIT of
weights) runs them in sequence every step, each part's hidden state into the next, each writing
its own layers' K/V into the buffer; a session per (part, shape).

IO binding (the default): each session's inputs and outputs are bound once, as OrtValues over host
buffers that share their memory (the KV arrays, per-shape embedding / mask / rope buffers, the
outputs), so a step fills those buffers in place and calls run_with_iobinding: no per-step feed
dictionary, input arrays or output allocations, and the host's KV writes are seen by the next run
as they are. onnxruntime wraps a contiguous numpy input without copying in plain `run` too, so on
the CPU EP this saves per-step overhead, not a copy of the buffer; the QNN EP copies CPU-bound
inputs into its own tensors either way. Where binding fails, the decoder falls back to plain
`session.run` (logged once) with the same results.

On QNN each shape of each part is compiled once and kept as a context binary (an EPContext model)
under the converted folder, named after the part's graph, so a later load skips the 10+ s graph
finalisation. A model imported from a weight-shared bundle (shared.py) has instead one binary per part
holding both shapes' graphs and the weights once; its two sessions load it sharing one QNN context.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import structlog

from protocol import npu_plan
from workers.engines.npu.convert import MASKED, DecoderConfig
from workers.engines.onnx import allow_spinning

CHUNK = 32  # prompt tokens per prefill pass
# Context models (and their binaries) in the converted folder: one per graph and shape, and the
# weight-shared ones that came from a bundle (shared.py), one binary per graph.
CONTEXT_PREFIX = "qnn-ctx-"
SHARED_PREFIX = "qnn-shared-"
QNN = "QNNExecutionProvider"
CPU = "CPUExecutionProvider"

log = structlog.get_logger("worker.npu.decoder")

SessionFactory = Callable[[Path, dict[str, int], str], ort.InferenceSession]


class TokenEmbeddings:
    """The GGUF's token_embd.weight, memory-mapped: rows dequantized on demand as float32."""

    def __init__(self, cfg: DecoderConfig) -> None:
        from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

        self.qtype = GGMLQuantizationType(cfg.embd_type)
        block, size = GGML_QUANT_SIZES[self.qtype]
        self.n_embd = cfg.n_embd
        row_bytes = cfg.n_embd // block * size
        self.table = np.memmap(cfg.source, dtype=np.uint8, mode="r", offset=cfg.embd_offset,
                               shape=(cfg.n_vocab, row_bytes))  # fmt: skip

    def __call__(self, tokens: list[int]) -> np.ndarray:
        """[len(tokens), n_embd] float32."""
        from gguf import quants

        rows = np.asarray(self.table[np.asarray(tokens, dtype=np.int64)])
        return quants.dequantize(rows, self.qtype).astype(np.float32, copy=False).reshape(len(tokens), self.n_embd)


def rope_tables(cfg: DecoderConfig, n_pos: int) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin [n_pos, head_dim] for rotate-half RoPE, as llama.cpp computes the angles."""
    half = cfg.head_dim // 2
    inv_freq = cfg.rope_base ** (-np.arange(half, dtype=np.float64) * 2 / cfg.head_dim)
    if cfg.rope_freq_factors:
        inv_freq = inv_freq / np.asarray(cfg.rope_freq_factors[:half], dtype=np.float64)
    pos = np.arange(n_pos, dtype=np.float64) / cfg.rope_linear_scale
    angles = np.outer(pos, inv_freq)
    angles = np.concatenate([angles, angles], axis=1)
    return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)


class _BoundChain:
    """The parts' sessions of one shape with every input and output bound once to a host buffer:
    embeds, mask, cos and sin are filled in place per step; part k's output buffer is part k+1's
    input; the past K/V inputs are OrtValues over the decoder's own KV arrays (shared memory)."""

    def __init__(self, dec: Decoder, sessions: list[ort.InferenceSession], seq: int,
                 kv: list[tuple[ort.OrtValue, ort.OrtValue]]) -> None:  # fmt: skip
        cfg, ctx = dec.cfg, dec.n_ctx
        self.embeds = np.zeros((1, seq, cfg.n_embd), np.float32)
        self.mask = np.full((1, 1, seq, ctx + seq), MASKED, np.float32)
        self.cos = np.zeros((1, 1, seq, cfg.head_dim), np.float32)
        self.sin = np.zeros_like(self.cos)
        shared = [ort.OrtValue.ortvalue_from_numpy(a) for a in (self.mask, self.cos, self.sin)]
        x = self.embeds
        self.steps: list[tuple[ort.InferenceSession, ort.IOBinding, list[np.ndarray]]] = []
        self.keep: list[Any] = [shared]  # the OrtValues the bindings refer to, alive as long as this
        for part, session in zip(dec.parts, sessions, strict=True):
            binding = session.io_binding()
            x_in = ort.OrtValue.ortvalue_from_numpy(x)
            binding.bind_ortvalue_input(part.input, x_in)
            if part.layers:
                for name, value in zip(("attn_mask", "rope_cos", "rope_sin"), shared, strict=True):
                    binding.bind_ortvalue_input(name, value)
            for i in part.layers:
                binding.bind_ortvalue_input(f"past_key_{i}", kv[i][0])
                binding.bind_ortvalue_input(f"past_value_{i}", kv[i][1])
            x = np.zeros((1, seq, cfg.n_vocab if part.head else cfg.n_embd), np.float32)
            kv_shape = (1, cfg.n_head_kv, seq, cfg.head_dim)
            outs = [x, *(np.zeros(kv_shape, np.float32) for _ in range(2 * len(part.layers)))]
            out_values = [ort.OrtValue.ortvalue_from_numpy(a) for a in outs]
            for name, value in zip(dec.outputs[len(self.steps)], out_values, strict=True):
                binding.bind_ortvalue_output(name, value)
            self.keep += [x_in, out_values]
            self.steps.append((session, binding, outs))
        self.logits = x


class Decoder:
    """One sequence's decoder state: the KV buffer and how many positions of it are filled."""

    def __init__(self, folder: Path, cfg: DecoderConfig, n_ctx: int, make_session: SessionFactory,
                 chunk: int = CHUNK, io_binding: bool = True) -> None:  # fmt: skip
        self.cfg = cfg
        self.n_ctx = n_ctx
        self.chunk = min(chunk, n_ctx)
        kv_shape = (1, cfg.n_head_kv, n_ctx, cfg.head_dim)
        self.keys = [np.zeros(kv_shape, np.float32) for _ in range(cfg.n_layer)]
        self.values = [np.zeros(kv_shape, np.float32) for _ in range(cfg.n_layer)]
        self.cos, self.sin = rope_tables(cfg, n_ctx)
        self.n_past = 0
        self.embed = TokenEmbeddings(cfg)
        self.parts = cfg.graph_parts()

        def label(kind: str, k: int) -> str:
            return kind if len(self.parts) == 1 else f"{kind} part{k}"

        # A session per (part, shape): the parts' prefill sessions, then their decode sessions.
        self.prefill_sessions = [make_session(folder / part.graph, self._dims(self.chunk),
                                              label(f"prefill{self.chunk}", k)) for k, part in enumerate(self.parts)]  # fmt: skip
        self.decode_sessions = [make_session(folder / part.graph, self._dims(1), label("decode", k))
                                for k, part in enumerate(self.parts)]  # fmt: skip
        self.outputs = [[part.output] + [f"present_{kind}_{i}" for i in part.layers for kind in ("key", "value")]
                        for part in self.parts]  # fmt: skip
        # IO binding: built on the first step of each shape; None after a failure (plain run from then on).
        self._chains: dict[int, _BoundChain] | None = {} if io_binding else None
        self._kv_values: list[tuple[ort.OrtValue, ort.OrtValue]] = []

    @property
    def prefill_session(self) -> ort.InferenceSession:
        """The first part's (the only one's, for a model in one part)."""
        return self.prefill_sessions[0]

    @property
    def decode_session(self) -> ort.InferenceSession:
        return self.decode_sessions[0]

    def _dims(self, seq: int) -> dict[str, int]:
        return shape_dims(seq, self.n_ctx)

    def reset(self, keep: int = 0) -> None:
        """Forget every position from `keep` on (the buffer is overwritten, not cleared: the mask
        hides what was not written by this sequence)."""
        self.n_past = min(keep, self.n_past)

    def prefill(self, tokens: list[int], should_stop: Callable[[], bool] | None = None) -> np.ndarray | None:
        """Feed prompt tokens in chunks; the last token's logits (None when stopped early)."""
        if self.n_past + len(tokens) > self.n_ctx:
            raise ValueError(f"{self.n_past + len(tokens)} tokens do not fit the context of {self.n_ctx}")
        logits = None
        for start in range(0, len(tokens), self.chunk):
            if should_stop is not None and should_stop():
                return None
            part = tokens[start : start + self.chunk]
            if len(part) == 1:
                logits = self._run(self.decode_sessions, part, 1)  # a lone token: the cheaper shape
            else:
                logits = self._run(self.prefill_sessions, part, self.chunk)
        return logits

    def decode(self, token: int) -> np.ndarray:
        """One token in, the next token's logits out."""
        if self.n_past >= self.n_ctx:
            raise ValueError(f"the context of {self.n_ctx} tokens is full")
        return self._run(self.decode_sessions, [token], 1)

    def _run(self, sessions: list[ort.InferenceSession], tokens: list[int], seq: int) -> np.ndarray:
        rows = self.embed(tokens)
        if self._chains is not None:
            try:
                return self._run_bound(sessions, rows, seq)
            except Exception as e:  # noqa: BLE001 - an EP that refuses the bound buffers: plain runs from now on
                log.warning("npu io binding failed; running without it", error=f"{type(e).__name__}: {e}")
                self._chains = None
        return self._run_plain(sessions, rows, seq)

    @property
    def bound(self) -> bool:
        """Whether the steps run with IO binding (not asked for, or it failed: plain `run`)."""
        return self._chains is not None

    def _run_bound(self, sessions: list[ort.InferenceSession], rows: np.ndarray, seq: int) -> np.ndarray:
        """_run_plain's step over buffers bound once. A failure part-way leaves n_past as it was, and
        the K/V written for pos..pos+n are written again, the same, by the plain path's retry."""
        assert self._chains is not None
        chain = self._chains.get(id(sessions[0]))  # a chain per shape (its sessions)
        if chain is None:
            if not self._kv_values:
                self._kv_values = [(ort.OrtValue.ortvalue_from_numpy(k), ort.OrtValue.ortvalue_from_numpy(v))
                                   for k, v in zip(self.keys, self.values, strict=True)]  # fmt: skip
            chain = self._chains[id(sessions[0])] = _BoundChain(self, sessions, seq, self._kv_values)
        n, pos, ctx = len(rows), self.n_past, self.n_ctx
        chain.embeds[0, :n] = rows
        chain.embeds[0, n:] = 0.0
        chain.mask.fill(MASKED)
        chain.mask[0, 0, :, :pos] = 0.0
        chain.mask[0, 0, :, ctx:] = np.triu(np.full((seq, seq), MASKED, np.float32), k=1)
        chain.cos.fill(0.0)
        chain.sin.fill(0.0)
        chain.cos[0, 0, :n], chain.sin[0, 0, :n] = self.cos[pos : pos + n], self.sin[pos : pos + n]
        for part, (session, binding, outs) in zip(self.parts, chain.steps, strict=True):
            session.run_with_iobinding(binding)
            for j, i in enumerate(part.layers):
                self.keys[i][:, :, pos : pos + n] = outs[1 + 2 * j][:, :, :n]
                self.values[i][:, :, pos : pos + n] = outs[2 + 2 * j][:, :, :n]
        self.n_past = pos + n
        return chain.logits[0, n - 1].copy()  # the buffer is the next step's

    def _run_plain(self, sessions: list[ort.InferenceSession], rows: np.ndarray, seq: int) -> np.ndarray:
        """`rows`: the new tokens' embeddings [n, n_embd]."""
        n, pos, ctx = len(rows), self.n_past, self.n_ctx
        embeds = np.zeros((1, seq, self.cfg.n_embd), np.float32)  # padding rows: zeros, masked and dropped
        embeds[0, :n] = rows
        mask = np.full((1, 1, seq, ctx + seq), MASKED, np.float32)
        mask[0, 0, :, :pos] = 0.0  # every row sees the filled past
        mask[0, 0, :, ctx:] = np.triu(np.full((seq, seq), MASKED, np.float32), k=1)  # causal among the new
        cos = np.zeros((1, 1, seq, self.cfg.head_dim), np.float32)
        sin = np.zeros_like(cos)
        cos[0, 0, :n], sin[0, 0, :n] = self.cos[pos : pos + n], self.sin[pos : pos + n]
        x = embeds  # then each part's hidden state, into the next part
        for part, session, names in zip(self.parts, sessions, self.outputs, strict=True):
            feed: dict[str, np.ndarray] = {part.input: x}
            if part.layers:  # a part of the head alone takes only the hidden state
                feed.update(attn_mask=mask, rope_cos=cos, rope_sin=sin)
            for i in part.layers:
                feed[f"past_key_{i}"] = self.keys[i]
                feed[f"past_value_{i}"] = self.values[i]
            out = session.run(names, feed)
            for j, i in enumerate(part.layers):
                self.keys[i][:, :, pos : pos + n] = out[1 + 2 * j][:, :, :n]
                self.values[i][:, :, pos : pos + n] = out[2 + 2 * j][:, :, :n]
            x = out[0]
        self.n_past = pos + n
        return np.asarray(x[0, n - 1], dtype=np.float32)


# ---- sessions ----------------------------------------------------------------------------------


def session_options(dims: dict[str, int], threads: int, spinning: bool = False) -> ort.SessionOptions:
    """`spinning`: whether the session's thread pools busy-wait for work (`--npu-spinning`, QNN only)."""
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.log_severity_level = 3
    allow_spinning(so, spinning)
    for name, value in dims.items():
        so.add_free_dimension_override_by_name(name, value)
    return so


def cpu_session_factory(threads: int, spinning: bool = False) -> SessionFactory:
    """Sessions on the CPU EP (the engine's tests). The engine's never spin; bench/npu_spinning.py's do."""

    def make(graph: Path, dims: dict[str, int], _label: str) -> ort.InferenceSession:
        so = session_options(dims, threads, spinning)
        return ort.InferenceSession(str(graph), sess_options=so, providers=[CPU])

    return make


def shape_dims(seq: int, n_ctx: int) -> dict[str, int]:
    """The free dimensions one compiled shape pins: `seq` new tokens over a KV buffer of `n_ctx`."""
    return {"seq": seq, "past": n_ctx, "total": n_ctx + seq}


def context_file(graph: Path, dims: dict[str, int], soc: str, cpu_fallback: bool) -> Path:
    """Where the compiled context binary of this graph (a model's parts are graphs of their own) and
    shape lives, per SoC and fallback rule: not per run-time option (the performance mode), nor per
    machine, so that binaries compiled elsewhere for this SoC (`geniex npu compile`) are found."""
    tag = hashlib.sha256(repr((sorted(dims.items()), soc, cpu_fallback)).encode()).hexdigest()[:12]
    # Beside the graph: a context model that keeps some nodes on the CPU names the same weights file.
    return graph.parent / f"{CONTEXT_PREFIX}{graph.stem}-s{dims['seq']}-p{dims['past']}-{tag}.onnx"


def shared_context_file(ctx: Path) -> Path:
    """The weight-shared counterpart of `context_file`'s `ctx` (compute npu): an EPContext model whose
    binary holds its part's other shape too (shared.py), named apart so that neither is taken for the other."""
    return ctx.with_name(ctx.name.replace(CONTEXT_PREFIX, SHARED_PREFIX, 1))


def qnn_session_factory(devices: list[Any], options: dict[str, str], threads: int, *, cpu_fallback: bool,
                        on_build: Callable[[str, float, bool], None] | None = None,
                        profile_dir: str | None = None, spinning: bool = False,
                        shared: bool = False) -> SessionFactory:  # fmt: skip
    """Sessions on QNN. `cpu_fallback` False (compute npu): onnxruntime refuses a graph that QNN
    cannot take whole. The first build of a shape writes its context binary; later builds load it.
    `spinning`: `--npu-spinning` as the worker resolved it (a run-time option: not in the binary's name).
    `shared`: load the weight-shared binaries imported with the model (shared_context_file) where they
    are, both shapes of a part from one; one that does not load turns them off for the rest."""

    soc = npu_plan.detect_soc()[0].name  # the simulator's too: GENIEX_QNN_SOC_MODEL, else the X Elite

    def make(graph: Path, dims: dict[str, int], label: str) -> ort.InferenceSession:
        nonlocal shared
        t0 = time.perf_counter()
        so = session_options(dims, threads, spinning)
        if not cpu_fallback:
            so.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
        if profile_dir is not None and label.split()[0] == "decode":
            so.enable_profiling = True
            so.profile_file_prefix = os.path.join(profile_dir, label.replace(" ", "-"))  # a file per part
        ctx = context_file(graph, dims, soc, cpu_fallback)
        one = shared_context_file(ctx)
        if shared and one.is_file():
            # The session made second of the part's two finds its graph in the context the first loaded
            # (onnxruntime's EP-context sharing), so the part's weights sit in NPU memory once.
            so.add_session_config_entry("ep.share_ep_contexts", "1")
            source, warm = one, True
        else:
            warm = ctx.is_file()
            source = ctx if warm else graph
        if not warm:
            so.add_session_config_entry("ep.context_enable", "1")
            so.add_session_config_entry("ep.context_file_path", str(ctx))
            so.add_session_config_entry("ep.context_embed_mode", "0")  # the binary beside, not in, the protobuf
        so.add_provider_for_devices(devices[:1], options)
        try:
            session = ort.InferenceSession(str(source), sess_options=so)
        except Exception as exc:
            if not warm:
                raise
            if source == one:  # kept, not deleted: they came with the model, and another QNN may load them
                log.warning("npu weight-shared context binary did not load; compiling unshared ones",
                            shape=label, error=f"{type(exc).__name__}: {exc}")  # fmt: skip
                shared = False
            else:  # A context binary that no longer loads (a crash while writing it, another QNN SDK): rebuild it.
                ctx.unlink(missing_ok=True)
            return make(graph, dims, label)
        if on_build is not None:
            on_build(label, time.perf_counter() - t0, warm)
        return session

    return make
