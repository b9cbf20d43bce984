"""How much RAM a worker will take, estimated before it loads: weights plus KV cache."""

from __future__ import annotations

import functools
import os
import struct
from pathlib import Path

import structlog

from gateway.models.store import ModelEntry
from gateway.supervisor.compute import has_htp
from protocol import engines, kv_cache, npu_plan
from protocol.engines import EMBED_BATCH_TOKENS
from protocol.genie_bundle import BundleError, is_bundle, read_bundle
from protocol.gguf_header import ARCHITECTURE, TEMPLATE_THINKS, npu_shape, read_gguf_numbers
from protocol.wire import Device

log = structlog.get_logger("gateway.supervisor.memory")

# Compute buffers, the runtime, and the Python interpreter of the worker itself.
WORKER_OVERHEAD = 160 * 1024 * 1024
# A worker relaying a model served elsewhere (workers/engines/upstream.py): Python, httpx and its
# connection pool, no weights: 39 MiB resident, measured by bench/upstream.py. It never evicts a local model.
UPSTREAM_WORKER_BYTES = 96 << 20


# Encoder-only architectures: embedding models even when the file declares no pooling.
ENCODER_ARCHS = frozenset({
    "bert", "nomic-bert", "nomic-bert-moe", "jina-bert-v2", "jina-bert-v3", "neo-bert", "modern-bert", "eurobert",
})  # fmt: skip
POOLING_NONE = 0  # llama.cpp's LLAMA_POOLING_TYPE_NONE


@functools.lru_cache(maxsize=64)
def _header(path: str, mtime: float) -> dict[str, float | str]:
    """The file's header, read once per version of the file (the pool asks on every start)."""
    try:
        return read_gguf_numbers(path)
    except (OSError, ValueError, struct.error, KeyError) as exc:
        log.warning("could not read GGUF metadata", path=path, error=str(exc))
        return {}


def gguf_meta(path: str) -> dict[str, float | str]:
    """A GGUF's header metadata (protocol/gguf_header.py's read_gguf_numbers), cached; {} when it
    cannot be read or is not a GGUF."""
    try:
        return _header(path, os.path.getmtime(path)) if path.endswith(".gguf") else {}
    except OSError:
        return {}


def is_embedding_gguf(path: str) -> bool:
    """A GGUF that declares a pooling (sentence-transformers models, rerankers, decoder-based
    embedders, as llama.cpp's converter writes them) or is an encoder: served by the
    embedding engine, not the text generator. Read from the header, no model load."""
    try:
        meta = _header(path, os.path.getmtime(path))
    except OSError:
        return False
    arch = str(meta.get(ARCHITECTURE, ""))
    pooling = meta.get(f"{arch}.pooling_type")
    return arch in ENCODER_ARCHS or (pooling is not None and int(pooling) != POOLING_NONE)


def worker_engine(entry: ModelEntry, compute: str = "cpu") -> str:
    """The worker engine for a model (protocol/engines.py): a GGUF that is an embedding model gets
    its engine's `embedder` (llama_embed); a model on the NPU (`npu`/`hybrid`) its engine's `npu`
    engine (llama_npu converts a chat GGUF to an ONNX graph for QNN), unless llama.cpp's build has
    its own Hexagon NPU device (HTP), which then runs the GGUF itself."""
    row = engines.info(entry.engine)
    if row.embedder and entry.path.endswith(".gguf") and is_embedding_gguf(entry.path):
        return row.embedder
    if row.npu and compute in ("npu", "hybrid") and not (compute == "npu" and has_htp(entry.engine)):
        return row.npu
    return entry.engine


def template_thinks(path: str) -> bool | None:
    """Whether a GGUF model's chat template has a `<think>` block (it can reason); False for a GGUF
    without a chat template; None when the file is not a GGUF (only its worker would know)."""
    if not path.endswith(".gguf"):
        return None
    try:
        meta = _header(path, os.path.getmtime(path))
    except OSError:
        return None
    return bool(meta.get(TEMPLATE_THINKS, 0.0)) if meta else None


def trained_context(path: str) -> int | None:
    """The context length a GGUF model was trained for (`<arch>.context_length`); None when the
    file does not say (or is not a GGUF). A Genie bundle's is the context its binaries were
    compiled for (`dialog.context.size`)."""
    if os.path.isdir(path) and is_bundle(Path(path)):
        try:
            return read_bundle(Path(path)).context_size or None
        except BundleError:
            return None
    try:
        meta = _header(path, os.path.getmtime(path)) if path.endswith(".gguf") else {}
    except OSError:
        return None
    value = meta.get(f"{meta.get(ARCHITECTURE, '')}.context_length")
    return int(value) if isinstance(value, int | float) and value > 0 else None


def _kv_bytes_per_token(path: str, mtime: float, type_k: str = kv_cache.DEFAULT, type_v: str = kv_cache.DEFAULT) -> int:
    """K and V for every layer, each in its type's bytes per element (protocol/kv_cache.py):
    n_layer * n_head_kv * (key_len * K's + value_len * V's), 2 bytes each in f16."""
    meta = {k: v for k, v in _header(path, mtime).items() if isinstance(v, float | int)}

    def value(suffix: str, default: float) -> int:
        return int(next((v for k, v in meta.items() if k.endswith(suffix)), default))

    n_embd = value(".embedding_length", 0)
    n_head = value(".attention.head_count", 1) or 1
    k_len = value(".attention.key_length", n_embd // n_head)
    v_len = value(".attention.value_length", k_len)
    n_head_kv = value(".attention.head_count_kv", n_head)
    return kv_cache.kv_bytes_per_token(value(".block_count", 0), n_head_kv, k_len, v_len, type_k, type_v)


def offloaded_share(path: str, ngl: int) -> float:
    """The share of a GGUF's weights and KV cache that llama.cpp puts on the GPU for `ngl` layers
    (-1, the spec's 999, or more than the model has: all), counted as llama.cpp counts them: the
    repeating layers and the output layer."""
    if ngl == 0:
        return 0.0
    try:
        meta = _header(path, os.path.getmtime(path))
    except OSError:
        return 0.0
    layers = int(next((v for k, v in meta.items() if k.endswith(".block_count") and isinstance(v, int | float)), 0))
    if ngl < 0 or layers <= 0 or ngl > layers:
        return 1.0
    return ngl / (layers + 1)


def offload_device(devices: list[Device], compute: str) -> Device | None:
    """The device whose own memory a worker's offloaded layers take: the first discrete GPU (or
    NPU device, for `npu` on llama.cpp's Hexagon backend) with a known size; None when the layers
    stay in the host's RAM (the CPU, or an integrated GPU sharing it, as on a Snapdragon)."""
    kinds = {"gpu": ("gpu",), "npu": ("accel",)}.get(compute, ())
    return next((d for d in devices if d.kind in kinds and d.memory_total > 0), None)


def embedding_kv_tokens(path: str) -> int:
    """The KV an embedding worker allocates (workers/engines/llama_embed.py): none for an encoder,
    one batch of tokens for a decoder-based embedder."""
    try:
        arch = str(_header(path, os.path.getmtime(path)).get(ARCHITECTURE, ""))
    except OSError:
        return EMBED_BATCH_TOKENS
    return 0 if arch in ENCODER_ARCHS else EMBED_BATCH_TOKENS


def file_bytes(path: str) -> int:
    """A file's size (0 when it is gone): e.g. a vision model's projector, loaded beside it."""
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def estimate_worker_bytes(path: str, total_ctx_tokens: int, type_k: str = kv_cache.DEFAULT,
                          type_v: str = kv_cache.DEFAULT) -> int:  # fmt: skip
    """Weights plus a KV cache of `total_ctx_tokens` in the types a worker stores it in (a GGUF),
    plus the worker's own overhead."""
    if path.endswith(".upstream.json"):  # the descriptor of a model served elsewhere
        return UPSTREAM_WORKER_BYTES
    try:
        if os.path.isdir(path):  # an ONNX or diffusers model folder: its files (in subfolders too), no KV cache
            return sum(f.stat().st_size for f in Path(path).rglob("*") if f.is_file()) + WORKER_OVERHEAD
        size = os.path.getsize(path)
        mtime = os.path.getmtime(path)
    except OSError:
        return WORKER_OVERHEAD
    per_token = _kv_bytes_per_token(path, mtime, type_k, type_v) if path.endswith(".gguf") else 0
    return size + per_token * total_ctx_tokens + WORKER_OVERHEAD


# The NPU chat worker on the x86_64 HTP simulator, SmolLM2-135M's 98 MB 4-bit graph (issue 28):
# 967 MiB resident with its two QNN sessions (prefill chunk and decode) and the QNN runtime. Counted
# as the runtime, plus each session's copy of the weights half again, plus the host's KV buffer; a
# device's runtime is smaller than the simulator's, so this errs on the side of room.
NPU_RUNTIME_BYTES = 600 << 20
NPU_SESSION_FACTOR = 1.5
NPU_SESSIONS = 2


def npu_chat_bytes(path: str, nctx: int, *, shared_weights: bool = False) -> int:
    """The NPU chat worker (workers/engines/npu): the 4-bit weights the NPU plan counts
    (protocol/npu_plan.py), in each of its QNN sessions (`shared_weights`: once, the sessions load
    one weight-shared context binary), the QNN runtime, and its fp32 KV buffer."""
    try:
        shape = npu_shape(path)
    except (OSError, ValueError, KeyError, struct.error):
        return WORKER_OVERHEAD + NPU_RUNTIME_BYTES
    weights = sum(p.weight_bytes for p in npu_plan.split(shape))
    kv = 2 * shape.kv_bytes(npu_plan.npu_nctx(nctx))  # fp32 on the host: twice the fp16 the plan counts
    sessions = 1 if shared_weights else NPU_SESSIONS
    return int(weights * NPU_SESSION_FACTOR * sessions) + NPU_RUNTIME_BYTES + kv + WORKER_OVERHEAD
