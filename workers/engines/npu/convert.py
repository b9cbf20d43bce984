"""A llama, qwen2, qwen3 or phi3 GGUF as an ONNX decoder graph for onnxruntime (QNN HTP, or the CPU).

Only `gguf` (to read and dequantize the tensors) and `onnx.helper` (to write the graph); no torch.
The graph is built for a static-shape NPU:

- inputs: `inputs_embeds` [1, seq, n_embd] (the host looks the tokens' rows up in the GGUF itself,
  dequantizing only those rows: the vocab x width table never enters the graph), an additive
  `attn_mask` [1, 1, seq, total] (total = past + seq), the RoPE tables `rope_cos`/`rope_sin`
  [1, 1, seq, head_dim], and per layer `past_key_i` / `past_value_i` [1, n_head_kv, past, head_dim].
  The host owns the KV buffer, fills the mask and the tables (so positions, context length and RoPE
  scaling are the host's business, not the graph's), and pins `seq`, `past` and `total` per
  session (free-dimension overrides);
- outputs: `logits` [1, seq, n_vocab], and only the new tokens' `present_key_i` / `present_value_i`
  [1, n_head_kv, seq, head_dim], which the host writes into its buffer.

Weights: every matrix is onnxruntime's `com.microsoft.MatMulNBits` with blocks of 32 along K.
Q4_0 and Q8_0 tensors are repacked bit for bit (bits=4 / bits=8, a fp32 scale per block and the
default zero point, 8 / 128), so the graph computes with exactly the GGUF's weights; any other type
is dequantized and quantized as ggml's Q4_0 does (Q8_0 for the 6- and 8-bit types), and npu.json
says which (`quantization`). A tied output head is the token embedding stored once, as the head.
Only norms and biases stay float. Initializers are appended to the weights file one tensor at a
time, so converting holds about one tensor in memory.

Parts: a QNN context binary holds at most 2 GB, so the layers go in chained graphs of at most
npu_plan.PART_LIMIT (1.5 GB) of weights each, where npu_plan.split (the plan the gateway shows,
from the same Shape) puts them. One part is `model.onnx` (+ `model.onnx.data`) as above; several
are `part0.onnx`, `part1.onnx`, ... (each + `.data`): part 0 takes `inputs_embeds`, part k the
previous part's `hidden_out` as `hidden` [1, seq, n_embd]; each takes the mask, the RoPE tables and
its own layers' past K/V and gives its layers' present K/V; the last part (or a part of its own
after it) holds the final norm and the head and gives `logits`. npu.json's `parts` lists them.

Exactness details: GGUF stores each head's Q/K rows in the interleaved order llama.cpp's RoPE
wants; they are put back in the half-split order here, so a plain rotate-half RoPE is exact. The
attention scale 1/sqrt(head_dim) is folded into Wq (qwen3: into its per-head Q RMSNorm's weight,
which follows Wq). Architectures beyond llama's tensors: qwen2's Q/K/V biases; qwen3's per-head
RMSNorm on Q and K before RoPE, and heads wider than n_embd / n_head; phi3's fused `attn_qkv` and
gate+up `ffn_up` matrices, split by rows (block rows, so Q4_0/Q8_0 stay exact). phi3's sliding
window is off in llama.cpp too (full attention); its LongRoPE factors (rope_factors_long/short) are
refused. RMSNorm is onnxruntime's
SimplifiedLayerNormalization (QNN maps it to its RmsNorm). Every tensor stays at most 4-D: grouped
query attention reshapes the queries [1, n_head, seq, d] to [1, n_head_kv, group*seq, d] so that
they meet their shared K/V head without repeating K/V.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from protocol.npu_cache import CONFIG_FILE, CONVERTER_VERSION, cache_key, remove_stale
from protocol.npu_plan import PART_LIMIT, Shape, split

# 2: MatMulNBits weights, host-side embedding lookup (inputs_embeds)
# 3: the layers in chained parts of at most npu_plan.PART_LIMIT of weights (npu.json `parts`)
GRAPH_FILE = "model.onnx"  # a model in one part; in several: part0.onnx, part1.onnx, ...
WEIGHTS_FILE = "model.onnx.data"  # each graph's weights: its file name + ".data"
# Architectures whose GGUF tensors this converter maps; others stay on llama.cpp.
SUPPORTED_ARCHS = ("llama", "qwen2", "qwen3", "phi3")
# llama.cpp's converter interleaves these architectures' Q/K rows for its "normal" RoPE; the others
# (qwen2, qwen3, phi3: NEOX RoPE) keep the half-split order rotate-half wants.
INTERLEAVED_ROPE_ARCHS = ("llama",)
MASKED = -10000.0  # additive mask for hidden positions: exp() of it is 0 in fp32 and in fp16 (HTP)
BLOCK = 32  # MatMulNBits block_size: the Q4_0 / Q8_0 block
INLINE_BYTES = 1024  # initializers smaller than this stay inside the protobuf


class ConversionError(Exception):
    """The GGUF cannot become an NPU graph (unsupported architecture or tensor layout)."""


@dataclass(frozen=True)
class GraphPart:
    """One graph of the chain: layers [first_layer, end_layer), then the final norm and the head
    when `head`. It takes `input` (the first part: `inputs_embeds`, the others: `hidden`, the
    previous part's `output`) and gives `output` (`hidden_out`, or `logits` for the head's part)."""

    graph: str  # file names in the converted folder
    weights: str
    first_layer: int
    end_layer: int  # exclusive
    head: bool
    input: str = "inputs_embeds"
    output: str = "logits"
    weight_bytes: int = 0  # its weights file, as written
    planned_bytes: int = 0  # npu_plan.split's figure for it

    @property
    def layers(self) -> range:
        return range(self.first_layer, self.end_layer)


def part_files(index: int, count: int) -> tuple[str, str]:
    """(graph, weights) file names of part `index` of `count`: model.onnx alone, else partK.onnx."""
    graph = GRAPH_FILE if count == 1 else f"part{index}.onnx"
    return graph, graph + ".data"


@dataclass(frozen=True)
class DecoderConfig:
    """What the host needs to drive the graph, written beside it as npu.json."""

    arch: str
    n_layer: int
    n_embd: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_vocab: int
    n_ctx_train: int
    rms_eps: float
    rope_base: float
    rope_linear_scale: float  # positions are divided by this (llama.rope.scaling.type == linear)
    rope_freq_factors: list[float] | None  # llama 3.x: per-frequency divisors (rope_freqs.weight)
    source: str
    converter_version: int = CONVERTER_VERSION
    # The token embedding, read from the GGUF by the host: its ggml type and byte offset in the file.
    embd_type: int = 0
    embd_offset: int = 0
    # How the weights reached the graph, e.g. "q4_0 exact (210 tensors), requantized q4_1→4-bit (1)".
    quantization: str = ""
    requantized: list[str] | None = None  # the tensors quantized again (not repacked as they were)
    n_ff: int = 0
    head_bits: int = 4  # 8 where the head is written as 8-bit blocks
    layer_eight_bit: float = 0.0  # the share of the layers' matrix weights written as 8-bit blocks
    # The chained graphs, in order (npu_plan.split of shape()); empty: model.onnx alone.
    parts: list[GraphPart] = field(default_factory=list)

    @classmethod
    def load(cls, folder: Path) -> DecoderConfig:
        data = json.loads((folder / CONFIG_FILE).read_text())
        data["parts"] = [GraphPart(**p) for p in data.get("parts") or []]
        return cls(**data)

    def shape(self) -> Shape:
        """The model as the NPU plan (protocol/npu_plan.py) sees it: the converter splits by it."""
        return Shape(n_layer=self.n_layer, n_embd=self.n_embd, n_head=self.n_head, n_head_kv=self.n_head_kv,
                     head_dim=self.head_dim, n_ff=self.n_ff, n_vocab=self.n_vocab, head_bits=self.head_bits,
                     layer_eight_bit=self.layer_eight_bit)  # fmt: skip

    def graph_parts(self) -> list[GraphPart]:
        return self.parts or [GraphPart(GRAPH_FILE, WEIGHTS_FILE, 0, self.n_layer, True)]


def cached_or_convert(gguf_path: str, cache_dir: Path, progress: Callable[[str], None] | None = None) -> Path:
    """The converted folder for this GGUF, converting it on the first call. Atomic: a folder is
    converted under a temporary name and renamed when complete, so a crash leaves no half graph."""
    target = cache_dir / cache_key(gguf_path)
    if (target / CONFIG_FILE).is_file():
        _sweep(cache_dir, target, progress)
        return target
    cache_dir.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".converting-", dir=cache_dir))
    try:
        convert(gguf_path, tmp, progress)
        try:
            tmp.rename(target)
        except OSError:  # another worker converted the same model meanwhile: keep theirs
            if not (target / CONFIG_FILE).is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    _sweep(cache_dir, target, progress)
    return target


def _sweep(cache_dir: Path, current: Path, progress: Callable[[str], None] | None) -> None:
    """Older versions of this GGUF's graph, and graphs of GGUFs since deleted, are dead weight."""
    for old in remove_stale(cache_dir, current):
        if progress is not None:
            progress(f"removed {old.name}, a converted graph no model needs any more")


# ---- reading the GGUF --------------------------------------------------------------------------


def _field(reader: Any, key: str, default: Any = None) -> Any:
    f = reader.fields.get(key)
    if f is None:
        return default
    value = f.contents()
    return value if value is not None else default


def read_config(reader: Any, source: str) -> DecoderConfig:
    arch = str(_field(reader, "general.architecture", ""))
    if arch not in SUPPORTED_ARCHS:
        raise ConversionError(
            f"architecture {arch or 'unknown'!r} has no NPU graph yet (supported: {', '.join(SUPPORTED_ARCHS)})"
        )
    n_embd = int(_field(reader, f"{arch}.embedding_length"))
    n_head = int(_field(reader, f"{arch}.attention.head_count"))
    n_head_kv = int(_field(reader, f"{arch}.attention.head_count_kv", n_head))
    head_dim = int(_field(reader, f"{arch}.attention.key_length", n_embd // n_head))
    rope_dim = int(_field(reader, f"{arch}.rope.dimension_count", head_dim))
    if rope_dim != head_dim or head_dim % 2:
        raise ConversionError(f"partial RoPE ({rope_dim} of {head_dim} dimensions) is not supported")
    if n_head % n_head_kv:
        raise ConversionError(f"{n_head} query heads do not group over {n_head_kv} KV heads")
    scaling = str(_field(reader, f"{arch}.rope.scaling.type", "none"))
    if scaling not in ("none", "linear"):
        raise ConversionError(f"RoPE scaling {scaling!r} is not supported")
    scale = float(_field(reader, f"{arch}.rope.scaling.factor", 1.0)) if scaling == "linear" else 1.0
    embd = next(t for t in reader.tensors if t.name == "token_embd.weight")
    factors = next((t for t in reader.tensors if t.name == "rope_freqs.weight"), None)
    head = next((t for t in reader.tensors if t.name == "output.weight"), embd)
    gate = next((t for t in reader.tensors if t.name == "blk.0.ffn_gate.weight"), None)
    up = next((t for t in reader.tensors if t.name == "blk.0.ffn_up.weight"), None)
    if gate is not None:
        n_ff = int(gate.shape[1])
    elif up is not None:  # phi3: the gate's and the up projection's rows in one matrix
        n_ff = int(up.shape[1]) // 2
    else:
        n_ff = int(_field(reader, f"{arch}.feed_forward_length", 0))
    long_rope = [t.name for t in reader.tensors if t.name.startswith("rope_factors_")]
    if long_rope:  # phi3's LongRoPE: llama.cpp picks the short or long factors by context length
        raise ConversionError(f"LongRoPE ({', '.join(sorted(long_rope))}) is not supported")
    matrices = [t for t in reader.tensors if t.name.startswith("blk.") and len(t.shape) == 2]
    n_matrix = sum(int(t.n_elements) for t in matrices)
    n_eight = sum(int(t.n_elements) for t in matrices if head_bits(t.tensor_type) == 8)
    return DecoderConfig(
        arch=arch,
        n_layer=int(_field(reader, f"{arch}.block_count")),
        n_embd=n_embd,
        n_head=n_head,
        n_head_kv=n_head_kv,
        head_dim=head_dim,
        n_vocab=int(embd.shape[1]),
        n_ctx_train=int(_field(reader, f"{arch}.context_length", 2048)),
        rms_eps=float(_field(reader, f"{arch}.attention.layer_norm_rms_epsilon", 1e-5)),
        rope_base=float(_field(reader, f"{arch}.rope.freq_base", 10000.0)),
        rope_linear_scale=scale or 1.0,
        rope_freq_factors=[float(x) for x in _dequant(factors).ravel()] if factors is not None else None,
        source=str(Path(source).resolve()),
        embd_type=int(embd.tensor_type),
        embd_offset=int(embd.data_offset),
        n_ff=n_ff,
        head_bits=head_bits(head.tensor_type),
        layer_eight_bit=n_eight / n_matrix if n_matrix else 0.0,
    )


def head_bits(tensor_type: int) -> int:
    """The bits weight_blocks() writes a matrix of this GGML type at (float widths aside)."""
    from gguf import GGMLQuantizationType

    qtype = GGMLQuantizationType(tensor_type)
    return 8 if qtype == GGMLQuantizationType.Q8_0 or qtype.name in EIGHT_BIT_TYPES else 4


def _dequant(tensor: Any) -> np.ndarray:
    """A GGUF tensor as float32, in numpy's (rows, columns) order: (out_features, in_features)."""
    from gguf import GGMLQuantizationType, quants

    if tensor.tensor_type == GGMLQuantizationType.F32:
        data = np.asarray(tensor.data, dtype=np.float32)
    else:
        data = quants.dequantize(tensor.data, tensor.tensor_type).astype(np.float32, copy=False)
    rows = [int(d) for d in reversed(tensor.shape)]  # ggml's ne is innermost first
    return data.reshape(rows)


def unpermute_rope_rows(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Undo llama.cpp's converter permutation of Q/K rows: per head it stores the rotation pairs
    interleaved (x0, x_{d/2}, x1, x_{d/2+1}, ...); rotate-half wants the halves split."""
    rows, cols = w.shape
    d = rows // n_heads
    return w.reshape(n_heads, d // 2, 2, cols).transpose(0, 2, 1, 3).reshape(rows, cols)


# ---- weights as MatMulNBits ---------------------------------------------------------------------


def _rows(tensor: Any) -> np.ndarray:
    """A GGUF tensor's stored rows, undecoded: [out_features, bytes per row] for the block types."""
    rows = int(tensor.shape[-1]) if len(tensor.shape) > 1 else 1
    return np.asarray(tensor.data).reshape(rows, -1)


def pack_q4_0(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_0 blocks [N, K/32 * 18] as MatMulNBits bits=4: B [N, K/32, 16] uint8 and the fp32 scales
    [N * K/32]. ggml keeps element j in the low nibble and j+16 in the high nibble of byte j;
    MatMulNBits wants elements 2i and 2i+1 in the low and high nibble of byte i. Same codes, same
    zero point (8): exact."""
    n = rows.shape[0]
    blocks = rows.reshape(n, -1, 18)
    scales = blocks[:, :, :2].copy().view(np.float16).astype(np.float32).reshape(-1)
    qs = blocks[:, :, 2:]
    codes = np.concatenate([qs & 0x0F, qs >> 4], axis=2)  # [N, nb, 32] in element order
    packed = (codes[:, :, 0::2] | (codes[:, :, 1::2] << 4)).astype(np.uint8)
    return packed, scales


def pack_q8_0(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q8_0 blocks [N, K/32 * 34] as MatMulNBits bits=8: q + 128 as uint8 (the default zero point
    of 8-bit MatMulNBits is 128) and the fp32 scales. Exact."""
    n = rows.shape[0]
    blocks = rows.reshape(n, -1, 34)
    scales = blocks[:, :, :2].copy().view(np.float16).astype(np.float32).reshape(-1)
    packed = blocks[:, :, 2:] ^ np.uint8(0x80)  # int8 q -> uint8 q + 128
    return np.ascontiguousarray(packed), scales


def _quantize(w: np.ndarray, bits: int) -> tuple[np.ndarray, np.ndarray]:
    """Float rows [N, K] quantized as ggml's quantize_row_q4_0 / q8_0 do, then packed."""
    from gguf import GGMLQuantizationType, quants

    qtype = GGMLQuantizationType.Q4_0 if bits == 4 else GGMLQuantizationType.Q8_0
    blocks = quants.quantize(np.ascontiguousarray(w, dtype=np.float32), qtype)
    return pack_q4_0(blocks) if bits == 4 else pack_q8_0(blocks)


def _dequant_rows(rows: np.ndarray, qtype: Any) -> np.ndarray:
    from gguf import GGMLQuantizationType, quants

    if qtype == GGMLQuantizationType.F32:
        return np.ascontiguousarray(rows).view(np.float32) if rows.dtype != np.float32 else rows
    return quants.dequantize(rows, qtype).astype(np.float32, copy=False)


# Types too fine for 4 bits: they become 8-bit blocks when quantized again (the rest: 4-bit).
EIGHT_BIT_TYPES = ("Q6_K", "Q8_1", "Q8_K")


def weight_blocks(tensor: Any, transform: Callable[[np.ndarray], np.ndarray] | None = None,
                  factor: float = 1.0) -> tuple[int, np.ndarray, np.ndarray | None, str]:  # fmt: skip
    """A GGUF weight [N, K] as (bits, B, scales, how): repacked when it is Q4_0/Q8_0, else quantized
    again (8-bit for EIGHT_BIT_TYPES, else 4-bit, F16/F32 included). `transform` permutes
    rows (Q/K RoPE order), which works on block rows as on float rows; `factor` scales the rows
    (folded into the block scales). A width that is no multiple of 32 stays float (bits 0, B the
    [K, N] matrix for a plain MatMul)."""
    from gguf import GGMLQuantizationType

    qtype = GGMLQuantizationType(tensor.tensor_type)
    name = qtype.name.lower()
    rows = _rows(tensor)
    if qtype in (GGMLQuantizationType.Q4_0, GGMLQuantizationType.Q8_0):
        rows = transform(rows) if transform is not None else rows
        bits = 4 if qtype == GGMLQuantizationType.Q4_0 else 8
        packed, scales = pack_q4_0(rows) if bits == 4 else pack_q8_0(rows)
        return bits, packed, scales * np.float32(factor), f"{name} exact"
    w = _dequant_rows(rows, qtype).reshape(rows.shape[0], -1)
    w = transform(w) if transform is not None else w
    w = w * np.float32(factor) if factor != 1.0 else w
    if w.shape[1] % BLOCK:
        return 0, np.ascontiguousarray(w.T), None, f"{name} float"
    bits = 8 if qtype.name in EIGHT_BIT_TYPES else 4
    packed, scales = _quantize(w, bits)
    return bits, packed, scales, f"requantized {name}→{bits}-bit"


# ---- the graph ---------------------------------------------------------------------------------


class _Graph:
    """Nodes, and initializers appended to the external weights file as they come (each tensor is
    written and dropped at once: converting holds about one tensor)."""

    def __init__(self, data_path: Path) -> None:
        from onnx import helper, numpy_helper

        self.helper = helper
        self.numpy_helper = numpy_helper
        self.nodes: list[Any] = []
        self.inits: list[Any] = []
        self._n = 0
        self._data = data_path.open("wb")
        self._offset = 0
        self.location = data_path.name

    def const(self, name: str, array: np.ndarray) -> str:
        from onnx import TensorProto, helper

        array = np.ascontiguousarray(array)
        if array.nbytes < INLINE_BYTES:
            self.inits.append(self.numpy_helper.from_array(array, name))
            return name
        align = 4096 if array.nbytes >= 1 << 20 else 64  # large tensors page-aligned: onnxruntime maps them
        pad = -self._offset % align
        if pad:
            self._data.write(b"\0" * pad)
            self._offset += pad
        self._data.write(array.tobytes())
        t = TensorProto(name=name, data_type=helper.np_dtype_to_tensor_dtype(array.dtype), dims=list(array.shape))
        t.data_location = TensorProto.EXTERNAL
        for key, value in (("location", self.location), ("offset", str(self._offset)), ("length", str(array.nbytes))):
            entry = t.external_data.add()
            entry.key, entry.value = key, value
        self._offset += array.nbytes
        self.inits.append(t)
        return name

    def close(self) -> None:
        self._data.close()

    def op(self, op_type: str, inputs: list[str], n_out: int = 1, **attrs: Any) -> Any:
        self._n += 1
        outs = [f"{op_type.lower()}_{self._n}_{i}" for i in range(n_out)]
        self.nodes.append(self.helper.make_node(op_type, inputs, outs, name=f"{op_type}_{self._n}", **attrs))
        return outs[0] if n_out == 1 else outs

    def named(self, op_type: str, inputs: list[str], output: str, **attrs: Any) -> str:
        self._n += 1
        self.nodes.append(self.helper.make_node(op_type, inputs, [output], name=f"{op_type}_{self._n}", **attrs))
        return output

    def matmul(self, v: str, name: str, blocks: tuple[int, np.ndarray, np.ndarray | None, str],
               output: str | None = None) -> str:  # fmt: skip
        """v @ W.T for a weight from weight_blocks(): MatMulNBits, or a float MatMul."""
        bits, b, scales, _how = blocks
        if scales is None:  # bits 0: a float [K, N] matrix
            inputs = [v, self.const(name, b)]
            return self.named("MatMul", inputs, output) if output else self.op("MatMul", inputs)
        n, k = b.shape[0], b.shape[1] * BLOCK
        inputs = [v, self.const(name, b), self.const(name + ".scales", scales)]
        attrs = {"K": k, "N": n, "bits": bits, "block_size": BLOCK, "domain": "com.microsoft"}
        if output:
            return self.named("MatMulNBits", inputs, output, **attrs)
        return self.op("MatMulNBits", inputs, **attrs)


def describe_quantization(hows: list[str]) -> str:
    """How many weights reached the graph which way: "q4_0 exact (210 tensors), q8_0 exact (1)"."""
    from collections import Counter

    parts = []
    for i, (how, n) in enumerate(Counter(hows).most_common()):
        parts.append(f"{how} ({n} tensor{'s' if n != 1 else ''})" if i == 0 else f"{how} ({n})")
    return ", ".join(parts)


def convert(gguf_path: str, out_dir: Path, progress: Callable[[str], None] | None = None,
            part_limit: int = PART_LIMIT) -> DecoderConfig:  # fmt: skip
    """Write the graph(s) (each with its external weights) and npu.json for the GGUF into `out_dir`:
    model.onnx, or part0.onnx, part1.onnx, ... where npu_plan.split puts the layers in several
    parts of at most `part_limit` bytes of weights each."""
    from dataclasses import replace

    from gguf import GGUFReader
    from onnx import TensorProto, helper

    say = progress or (lambda _msg: None)
    t0 = time.perf_counter()
    reader = GGUFReader(gguf_path)
    cfg = read_config(reader, gguf_path)
    tensors = {t.name: t for t in reader.tensors}

    def tensor(name: str) -> Any:
        if name not in tensors:
            raise ConversionError(f"the GGUF has no tensor {name}")
        return tensors[name]

    def weight(name: str) -> np.ndarray:
        return _dequant(tensor(name))

    out_dir.mkdir(parents=True, exist_ok=True)
    hows: dict[str, str] = {}
    d, h, hkv, group = cfg.head_dim, cfg.n_head, cfg.n_head_kv, cfg.n_head // cfg.n_head_kv
    f32 = TensorProto.FLOAT
    scale = 1.0 / float(np.sqrt(d))
    # rotate_half(v) = v @ R: [-v2, v1] for the halves v1, v2 (a matmul by 0/±1 is exact).
    rot = np.zeros((d, d), dtype=np.float32)
    half = d // 2
    rot[half:, :half] = -np.eye(half, dtype=np.float32)
    rot[:half, half:] = np.eye(half, dtype=np.float32)
    every = max(1, cfg.n_layer // 4)  # a progress line per quarter, not per layer
    q_dim, kv_dim = h * d, hkv * d  # a fused QKV matrix's rows: Q's, K's, V's
    qkv_rows = {"attn_q": slice(0, q_dim), "attn_k": slice(q_dim, q_dim + kv_dim),
                "attn_v": slice(q_dim + kv_dim, q_dim + 2 * kv_dim)}  # fmt: skip

    def write_part(index: int, count: int, planned: Any) -> GraphPart:
        """One graph of the chain: its layers, and the final norm and head when it holds them."""
        graph_file, weights_file = part_files(index, count)
        part = GraphPart(graph_file, weights_file, planned.first_layer, planned.end_layer, planned.head,
                         input="inputs_embeds" if index == 0 else "hidden",
                         output="logits" if planned.head else "hidden_out", planned_bytes=planned.weight_bytes)  # fmt: skip
        g = _Graph(out_dir / weights_file)
        inputs = [helper.make_tensor_value_info(part.input, f32, [1, "seq", cfg.n_embd])]
        outputs = [
            helper.make_tensor_value_info(part.output, f32, [1, "seq", cfg.n_vocab if part.head else cfg.n_embd])
        ]

        def rms(v: str, name: str) -> str:
            return g.op("SimplifiedLayerNormalization", [v, g.const(name, weight(name))], axis=-1,
                        epsilon=cfg.rms_eps, stash_type=1)  # fmt: skip

        def linear(v: str, name: str, transform: Callable[[np.ndarray], np.ndarray] | None = None,
                   factor: float = 1.0, output: str | None = None, source: str | None = None) -> str:  # fmt: skip
            blocks = weight_blocks(tensor(source or name), transform, factor)
            hows[source or name] = blocks[3]
            return g.matmul(v, name, blocks, output)

        def projection(v: str, p: str, kind: str, rope_heads: int, factor: float) -> str:
            """Q, K or V (`kind`: attn_q, attn_k, attn_v) of layer prefix `p` with its optional bias
            (qwen2 has them): rows put in rotate-half order for `rope_heads` heads, and scaled by
            `factor` (the attention scale, for Q). A fused QKV matrix (phi3's `attn_qkv`: Q's rows,
            then K's, then V's) gives each its own rows (block rows: still exact)."""
            name, source, rows = p + kind, p + kind, None
            if name + ".weight" not in tensors and p + "attn_qkv.weight" in tensors:
                source, rows = p + "attn_qkv", qkv_rows[kind]
            b = weight(source + ".bias").reshape(-1, 1) if source + ".bias" in tensors else None
            b = b[rows] if b is not None and rows is not None else b
            steps: list[Callable[[np.ndarray], np.ndarray]] = []
            if rows is not None:
                steps.append(lambda r: r[rows])
            if rope_heads and cfg.arch in INTERLEAVED_ROPE_ARCHS:
                steps.append(lambda r: unpermute_rope_rows(r, rope_heads))
                b = unpermute_rope_rows(b, rope_heads) if b is not None else None

            def transform(r: np.ndarray) -> np.ndarray:
                for step in steps:
                    r = step(r)
                return r

            out = linear(v, name + ".weight", transform if steps else None, factor, source=source + ".weight")
            if b is None:
                return out
            return g.op("Add", [out, g.const(name + ".bias", (b.ravel() * np.float32(factor)).astype(np.float32))])

        def heads(v: str, shape: str, norm: str, factor: float) -> str:
            """[1, seq, heads * d] -> [1, heads, seq, d]; through the per-head RMSNorm `norm` first
            when the GGUF has it (qwen3's attn_q_norm / attn_k_norm, before RoPE), its weight
            scaled by `factor` (the attention scale, for Q)."""
            v = g.op("Reshape", [v, shape])
            if norm in tensors:
                w = (weight(norm) * np.float32(factor)).astype(np.float32)
                v = g.op("SimplifiedLayerNormalization", [v, g.const(norm, w)], axis=-1, epsilon=cfg.rms_eps,
                         stash_type=1)  # fmt: skip
            return g.op("Transpose", [v], perm=[0, 2, 1, 3])

        def ffn_in(v: str, p: str) -> tuple[str, str]:
            """The gate and up projections: `ffn_gate` and `ffn_up`, or phi3's fused `ffn_up` (the
            gate's rows first, then the up rows)."""
            if p + "ffn_gate.weight" in tensors:
                return linear(v, p + "ffn_gate.weight"), linear(v, p + "ffn_up.weight")
            n_ff = cfg.n_ff
            gate_rows, up_rows = slice(0, n_ff), slice(n_ff, 2 * n_ff)
            return (linear(v, p + "ffn_gate.weight", lambda r: r[gate_rows], source=p + "ffn_up.weight"),
                    linear(v, p + "ffn_up.weight", lambda r: r[up_rows]))  # fmt: skip

        x = part.input  # [1, seq, n_embd]
        try:
            if part.layers:
                inputs += [
                    helper.make_tensor_value_info("attn_mask", f32, [1, 1, "seq", "total"]),
                    helper.make_tensor_value_info("rope_cos", f32, [1, 1, "seq", d]),
                    helper.make_tensor_value_info("rope_sin", f32, [1, 1, "seq", d]),
                ]
                rot_c = g.const("rope_rotate_half", rot)
                mask = g.op("Tile", ["attn_mask", g.const("mask_repeats", np.array([1, 1, group, 1], np.int64))])
                shape_heads = g.const("shape_heads", np.array([0, 0, h, d], np.int64))
                shape_kv_heads = g.const("shape_kv_heads", np.array([0, 0, hkv, d], np.int64))
                shape_grouped = g.const("shape_grouped", np.array([1, hkv, -1, d], np.int64))
                shape_ungrouped = g.const("shape_ungrouped", np.array([1, h, -1, d], np.int64))
                shape_flat = g.const("shape_flat", np.array([0, 0, h * d], np.int64))

            def rope(v: str) -> str:  # v: [1, heads, seq, d]
                rotated = g.op("MatMul", [v, rot_c])
                return g.op("Add", [g.op("Mul", [v, "rope_cos"]), g.op("Mul", [rotated, "rope_sin"])])

            for i in part.layers:
                if (i + 1) % every == 0 and i + 1 < cfg.n_layer:
                    say(f"converted {i + 1}/{cfg.n_layer} layers")
                p = f"blk.{i}."
                past_k, past_v = f"past_key_{i}", f"past_value_{i}"
                inputs += [helper.make_tensor_value_info(n, f32, [1, hkv, "past", d]) for n in (past_k, past_v)]
                outputs += [helper.make_tensor_value_info(n, f32, [1, hkv, "seq", d])
                            for n in (f"present_key_{i}", f"present_value_{i}")]  # fmt: skip
                hn = rms(x, p + "attn_norm.weight")
                # The attention scale goes into Wq, or into the Q norm's weight where one follows Wq.
                q_normed = p + "attn_q_norm.weight" in tensors
                q = heads(projection(hn, p, "attn_q", h, 1.0 if q_normed else scale), shape_heads,
                          p + "attn_q_norm.weight", scale)  # fmt: skip
                k = heads(projection(hn, p, "attn_k", hkv, 1.0), shape_kv_heads, p + "attn_k_norm.weight", 1.0)
                v = heads(projection(hn, p, "attn_v", 0, 1.0), shape_kv_heads, "", 1.0)
                q = rope(q)
                k = g.named("Identity", [rope(k)], f"present_key_{i}")
                v = g.named("Identity", [v], f"present_value_{i}")
                keys = g.op("Concat", [past_k, k], axis=2)  # [1, hkv, total, d]
                values = g.op("Concat", [past_v, v], axis=2)
                qg = g.op("Reshape", [q, shape_grouped])  # [1, hkv, group*seq, d]
                scores = g.op(
                    "MatMul", [qg, g.op("Transpose", [keys], perm=[0, 1, 3, 2])]
                )  # [1, hkv, group*seq, total]
                probs = g.op("Softmax", [g.op("Add", [scores, mask])], axis=-1)
                ctx = g.op("Reshape", [g.op("MatMul", [probs, values]), shape_ungrouped])  # [1, h, seq, d]
                ctx = g.op("Reshape", [g.op("Transpose", [ctx], perm=[0, 2, 1, 3]), shape_flat])  # [1, seq, h*d]
                x = g.op("Add", [x, linear(ctx, p + "attn_output.weight")])
                hn = rms(x, p + "ffn_norm.weight")
                gate, up = ffn_in(hn, p)
                act = g.op("Mul", [g.op("Mul", [gate, g.op("Sigmoid", [gate])]), up])
                x = g.op("Add", [x, linear(act, p + "ffn_down.weight")])

            if part.head:
                x = rms(x, "output_norm.weight")
                # A tied head is the token embedding, written once, here.
                head = "output.weight" if "output.weight" in tensors else "token_embd.weight"
                linear(x, "lm_head", output="logits", source=head)
            else:
                g.named("Identity", [x], part.output)
        finally:
            g.close()
        graph = helper.make_graph(g.nodes, f"{cfg.arch}-decoder-part{index}", inputs, outputs, g.inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                        helper.make_opsetid("com.microsoft", 1)],
                                  producer_name="geniex-npu-convert")  # fmt: skip
        model.ir_version = 8
        (out_dir / graph_file).write_bytes(model.SerializeToString())  # the weights are already in weights_file
        return replace(part, weight_bytes=(out_dir / weights_file).stat().st_size)

    plan = split(cfg.shape(), part_limit)
    say(f"converting {Path(gguf_path).name} ({cfg.arch}, {cfg.n_layer} layers) to an ONNX graph for the NPU"
        + (f" in {len(plan)} parts" if len(plan) > 1 else ""))  # fmt: skip
    parts = [write_part(i, len(plan), planned) for i, planned in enumerate(plan)]
    requantized = sorted(n for n, how in hows.items() if how.startswith("requantized"))
    cfg = replace(cfg, quantization=describe_quantization(list(hows.values())), requantized=requantized, parts=parts)
    say(f"converted {cfg.n_layer}/{cfg.n_layer} layers; weights: {cfg.quantization}")
    (out_dir / CONFIG_FILE).write_text(json.dumps(asdict(cfg), indent=1))
    say(f"converted in {time.perf_counter() - t0:.1f}s")
    return cfg


def main(argv: list[str] | None = None) -> int:
    """`python -m workers.engines.npu.convert MODEL.gguf OUT_DIR`: convert once, by hand."""
    import argparse

    p = argparse.ArgumentParser(prog="python -m workers.engines.npu.convert")
    p.add_argument("gguf")
    p.add_argument("out_dir")
    p.add_argument("--part-limit", type=int, default=PART_LIMIT, help="bytes of weights per graph at most")
    args = p.parse_args(argv)
    convert(args.gguf, Path(args.out_dir), progress=print, part_limit=args.part_limit)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
