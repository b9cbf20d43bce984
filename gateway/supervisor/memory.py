"""How much RAM a worker will take, estimated before it loads: weights plus KV cache."""

from __future__ import annotations

import functools
import os
import struct
from pathlib import Path

import structlog

from gateway.models.store import ModelEntry
from protocol import engines
from protocol.engines import EMBED_BATCH_TOKENS
from protocol.npu_plan import Shape

log = structlog.get_logger("gateway.supervisor.memory")

# Compute buffers, the runtime, and the Python interpreter of the worker itself.
WORKER_OVERHEAD = 160 * 1024 * 1024
# A worker relaying a model served elsewhere (workers/engines/upstream.py): Python, httpx and its
# connection pool, no weights: 39 MiB resident, measured by bench/upstream.py. It never evicts a local model.
UPSTREAM_WORKER_BYTES = 96 << 20


_SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9
_WANTED = (".block_count", ".embedding_length", ".attention.head_count", ".attention.head_count_kv",
           ".attention.key_length", ".attention.value_length", ".pooling_type", ".context_length",
           ".feed_forward_length", ".vocab_size")  # fmt: skip
ARCHITECTURE = "general.architecture"
TOKENS = "tokenizer.ggml.tokens"
# The head's GGML type, or the token embedding's when the head is tied to it (no output.weight).
HEAD_TYPES = ("tensor.output.weight.type", "tensor.token_embd.weight.type")
# Encoder-only architectures: embedding models even when the file declares no pooling.
ENCODER_ARCHS = frozenset({
    "bert", "nomic-bert", "nomic-bert-moe", "jina-bert-v2", "jina-bert-v3", "neo-bert", "modern-bert", "eurobert",
})  # fmt: skip
POOLING_NONE = 0  # llama.cpp's LLAMA_POOLING_TYPE_NONE


def read_gguf_numbers(path: str) -> dict[str, float | str]:
    """The scalar metadata of a GGUF header whose key ends with one of `_WANTED`, and
    `general.architecture`.

    A few dozen lines instead of `gguf.GGUFReader`, which parses every tensor and
    the whole vocabulary with numpy and takes seconds on a large model.
    """
    out: dict[str, float | str] = {}
    file_size = os.path.getsize(path)
    with open(path, "rb") as f:
        if f.read(4) != b"GGUF":
            raise ValueError("not a GGUF file")
        (version,) = struct.unpack("<I", f.read(4))
        count_fmt = "<I" if version == 1 else "<Q"
        size = struct.calcsize(count_fmt)
        (n_tensors,) = struct.unpack(count_fmt, f.read(size))
        (n_kv,) = struct.unpack(count_fmt, f.read(size))

        def string() -> bytes:
            (n,) = struct.unpack(count_fmt, f.read(size))
            if n > file_size - f.tell():
                raise ValueError("corrupt GGUF header: a string runs past the end of the file")
            return f.read(n)

        def skip(vtype: int) -> None:
            if vtype == _STRING:
                string()
            elif vtype == _ARRAY:
                (etype,) = struct.unpack("<I", f.read(4))
                (n,) = struct.unpack(count_fmt, f.read(size))
                if n > file_size - f.tell():
                    raise ValueError("corrupt GGUF header: an array runs past the end of the file")
                if etype in _SCALAR:
                    f.seek(n * struct.calcsize(_SCALAR[etype]), 1)
                else:
                    for _ in range(n):
                        skip(etype)
            else:
                f.seek(struct.calcsize(_SCALAR[vtype]), 1)

        for _ in range(n_kv):
            key = string().decode(errors="replace")
            (vtype,) = struct.unpack("<I", f.read(4))
            if vtype in _SCALAR and key.endswith(_WANTED):
                (out[key],) = struct.unpack(_SCALAR[vtype], f.read(struct.calcsize(_SCALAR[vtype])))
            elif vtype == _STRING and key == ARCHITECTURE:
                out[key] = string().decode(errors="replace")
            elif vtype == _ARRAY and key == TOKENS:  # its length is the vocabulary size (the NPU estimate)
                here = f.tell()
                f.read(4)  # element type
                (out[TOKENS],) = struct.unpack(count_fmt, f.read(size))
                f.seek(here)
                skip(vtype)
            else:
                skip(vtype)
        for _ in range(n_tensors):  # the head's type (the NPU plan: HEAD_TYPES)
            name = string()
            (n_dims,) = struct.unpack("<I", f.read(4))
            f.seek(8 * n_dims, 1)
            (ggml_type,) = struct.unpack("<I", f.read(4))
            f.seek(8, 1)  # offset
            if name in (b"output.weight", b"token_embd.weight"):
                out[f"tensor.{name.decode()}.type"] = ggml_type
    return out


@functools.lru_cache(maxsize=64)
def _header(path: str, mtime: float) -> dict[str, float | str]:
    """The file's header, read once per version of the file (the pool asks on every start)."""
    try:
        return read_gguf_numbers(path)
    except (OSError, ValueError, struct.error, KeyError) as exc:
        log.warning("could not read GGUF metadata", path=path, error=str(exc))
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
    engine (llama_npu converts a chat GGUF to an ONNX graph for QNN)."""
    row = engines.info(entry.engine)
    if row.embedder and entry.path.endswith(".gguf") and is_embedding_gguf(entry.path):
        return row.embedder
    if row.npu and compute in ("npu", "hybrid"):
        return row.npu
    return entry.engine


def trained_context(path: str) -> int | None:
    """The context length a GGUF model was trained for (`<arch>.context_length`); None when the
    file does not say (or is not a GGUF)."""
    try:
        meta = _header(path, os.path.getmtime(path)) if path.endswith(".gguf") else {}
    except OSError:
        return None
    value = meta.get(f"{meta.get(ARCHITECTURE, '')}.context_length")
    return int(value) if isinstance(value, int | float) and value > 0 else None


def _kv_bytes_per_token(path: str, mtime: float) -> int:
    """K and V in f16 for every layer: n_layer * n_head_kv * (key_len + value_len) * 2 bytes."""
    meta = {k: v for k, v in _header(path, mtime).items() if isinstance(v, float | int)}

    def value(suffix: str, default: float) -> int:
        return int(next((v for k, v in meta.items() if k.endswith(suffix)), default))

    n_embd = value(".embedding_length", 0)
    n_head = value(".attention.head_count", 1) or 1
    k_len = value(".attention.key_length", n_embd // n_head)
    v_len = value(".attention.value_length", k_len)
    return value(".block_count", 0) * value(".attention.head_count_kv", n_head) * (k_len + v_len) * 2


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


def estimate_worker_bytes(path: str, total_ctx_tokens: int) -> int:
    if path.endswith(".upstream.json"):  # the descriptor of a model served elsewhere
        return UPSTREAM_WORKER_BYTES
    try:
        if os.path.isdir(path):  # an ONNX or diffusers model folder: its files (in subfolders too), no KV cache
            return sum(f.stat().st_size for f in Path(path).rglob("*") if f.is_file()) + WORKER_OVERHEAD
        size = os.path.getsize(path)
        mtime = os.path.getmtime(path)
    except OSError:
        return WORKER_OVERHEAD
    per_token = _kv_bytes_per_token(path, mtime) if path.endswith(".gguf") else 0
    return size + per_token * total_ctx_tokens + WORKER_OVERHEAD


# Resident memory of one QNN session per byte of the fp32 graph it compiles: 1.5 GB measured for
# SmolLM2-135M's 650 MB graph on the x86_64 HTP simulator (issue 15). The NPU chat worker holds two
# (prefill chunk and decode).
NPU_SESSION_FACTOR = 2.3
NPU_SESSIONS = 2
NPU_MAX_CTX = 1024  # workers/engines/npu/engine.py caps its KV buffer at this


def npu_chat_bytes(path: str, nctx: int) -> int:
    """The NPU chat worker (workers/engines/npu): its fp32 ONNX graph (counted from the GGUF's
    shapes: it is dequantized), the QNN sessions compiled from it, and its fp32 KV buffer."""
    try:
        meta = {k: v for k, v in _header(path, os.path.getmtime(path)).items() if isinstance(v, float | int)}
    except OSError:
        return WORKER_OVERHEAD

    def value(suffix: str, default: float) -> int:
        return int(next((v for k, v in meta.items() if k.endswith(suffix)), default))

    n_embd, n_layer = value(".embedding_length", 0), value(".block_count", 0)
    n_head = value(".attention.head_count", 1) or 1
    kv_dim = value(".attention.head_count_kv", n_head) * (n_embd // n_head)
    n_ff = value(".feed_forward_length", 4 * n_embd)
    n_vocab = value(".vocab_size", 0) or value(TOKENS, 32000)  # `<arch>.vocab_size` is optional
    params = n_layer * (2 * n_embd * n_embd + 2 * n_embd * kv_dim + 3 * n_embd * n_ff) + 2 * n_vocab * n_embd
    graph = 4 * params
    kv = 4 * n_layer * 2 * kv_dim * min(nctx, NPU_MAX_CTX)
    return int(graph * NPU_SESSION_FACTOR * NPU_SESSIONS) + kv + WORKER_OVERHEAD


# GGML types the NPU converter keeps at 8 bits (Q8_0, Q8_1, Q6_K, Q8_K); every other matrix at 4.
EIGHT_BIT_TYPES = frozenset({8, 9, 14, 15})


def npu_shape(path: str) -> Shape:
    """A decoder GGUF's shape for the NPU plan (protocol/npu_plan.py), from its header alone;
    ValueError when the header lacks what the plan needs."""
    meta = read_gguf_numbers(path)

    def value(suffix: str, default: float | None = None) -> int:
        found = next((v for k, v in meta.items() if k.endswith(suffix) and isinstance(v, int | float)), default)
        if found is None:
            raise ValueError(f"{path}: the GGUF header has no {suffix.lstrip('.')}")
        return int(found)

    n_embd, n_head = value(".embedding_length"), value(".attention.head_count")
    head_type = next((meta[k] for k in HEAD_TYPES if k in meta), 0)
    return Shape(
        n_layer=value(".block_count"),
        n_embd=n_embd,
        n_head=n_head,
        n_head_kv=value(".attention.head_count_kv", n_head),
        head_dim=value(".attention.key_length", n_embd // max(1, n_head)),
        n_ff=value(".feed_forward_length"),
        n_vocab=value(".vocab_size", 0) or value(TOKENS),
        head_bits=8 if head_type in EIGHT_BIT_TYPES else 4,
    )
