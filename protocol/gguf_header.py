"""A GGUF's header read as both sides need it: the gateway (memory estimates, the engine choice, the
NPU plan) and the NPU chat worker (its plan before converting). A few dozen lines of `struct`
instead of `gguf.GGUFReader`, which parses every tensor and the whole vocabulary with numpy and takes
seconds on a large model."""

from __future__ import annotations

import math
import os
import struct
from typing import NamedTuple

from protocol.npu_plan import Shape

_SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9
_WANTED = (".alignment", ".block_count", ".embedding_length", ".attention.head_count", ".attention.head_count_kv",
           ".attention.key_length", ".attention.value_length", ".pooling_type", ".context_length",
           ".feed_forward_length", ".vocab_size", ".fim_pre_token_id", ".prefix_token_id")  # fmt: skip
ARCHITECTURE = "general.architecture"
TOKENS = "tokenizer.ggml.tokens"
CHAT_TEMPLATE = "tokenizer.chat_template"
# 1.0 when the chat template has a `<think>` block (a reasoning model), 0.0 when not; absent: no template.
TEMPLATE_THINKS = "tokenizer.chat_template.thinks"
MAX_TEMPLATE_CHARS = 64 << 10  # the template is kept (Ollama's /api/show shows it) up to this
PARAMETERS = "tensors.elements"  # the weights' element count: the model's parameter count
# The head's GGML type, or the token embedding's when the head is tied to it (no output.weight).
HEAD_TYPES = ("tensor.output.weight.type", "tensor.token_embd.weight.type")
LAYER_EIGHT_BIT = "tensors.blk.eight_bit_share"
# GGML types the NPU converter keeps at 8 bits (Q8_0, Q8_1, Q6_K, Q8_K); every other matrix at 4.
EIGHT_BIT_TYPES = frozenset({8, 9, 14, 15})


class TensorInfo(NamedTuple):
    name: str
    dims: tuple[int, ...]  # GGUF's order: the innermost (contiguous) dimension first
    ggml_type: int
    offset: int  # from the start of the data section


class Header(NamedTuple):
    meta: dict[str, float | str]
    tensors: list[TensorInfo]
    data_start: int  # where the tensors' data begins in the file
    file_size: int


def read_gguf_numbers(path: str) -> dict[str, float | str]:
    """The scalar metadata of a GGUF header whose key ends with one of `_WANTED`,
    `general.architecture`, the vocabulary's size, the head's type (HEAD_TYPES) and the layers'
    8-bit share, the parameter count (PARAMETERS), the chat template and whether it thinks (TEMPLATE_THINKS). ValueError (or struct.error on a truncated file) for a file that is not a
    readable GGUF."""
    return read_gguf(path).meta


def read_gguf(path: str) -> Header:
    """The header, its tensors' table included (what `read_gguf_numbers` reads, and where each
    tensor's data lies)."""
    out: dict[str, float | str] = {}
    tensors: list[TensorInfo] = []
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
            elif vtype == _STRING and key == CHAT_TEMPLATE:
                template = string()
                out[TEMPLATE_THINKS] = float(b"<think>" in template)
                out[CHAT_TEMPLATE] = template[:MAX_TEMPLATE_CHARS].decode(errors="replace")
            elif vtype == _ARRAY and key == TOKENS:  # its length is the vocabulary size (the NPU estimate)
                here = f.tell()
                f.read(4)  # element type
                (out[TOKENS],) = struct.unpack(count_fmt, f.read(size))
                f.seek(here)
                skip(vtype)
            else:
                skip(vtype)
        for _ in range(n_tensors):
            name = string().decode(errors="replace")
            (n_dims,) = struct.unpack("<I", f.read(4))
            if n_dims > 8:
                raise ValueError(f"corrupt GGUF header: tensor {name} has {n_dims} dimensions")
            dims = struct.unpack(f"<{n_dims}Q", f.read(8 * n_dims))
            ggml_type, offset = struct.unpack("<IQ", f.read(12))
            tensors.append(TensorInfo(name, dims, ggml_type, offset))
        alignment = int(out.get("general.alignment", 32)) or 32
        data_start = -(-f.tell() // alignment) * alignment
    # What the NPU plan reads of the tensors: the head's type, and the layers' 8-bit share.
    layer, eight_bit = 0, 0
    out[PARAMETERS] = sum(math.prod(t.dims) for t in tensors)
    for t in tensors:
        if t.name in ("output.weight", "token_embd.weight"):
            out[f"tensor.{t.name}.type"] = t.ggml_type
        elif t.name.startswith("blk.") and len(t.dims) == 2:
            layer += t.dims[0] * t.dims[1]
            eight_bit += t.dims[0] * t.dims[1] if t.ggml_type in EIGHT_BIT_TYPES else 0
    if layer:
        out[LAYER_EIGHT_BIT] = eight_bit / layer
    return Header(out, tensors, data_start, file_size)


def npu_shape(path: str, header: Header | None = None) -> Shape:
    """A decoder GGUF's shape for the NPU plan (protocol/npu_plan.py), from its header alone (read
    here unless the caller has it); ValueError when the header lacks what the plan needs."""
    meta = (header or read_gguf(path)).meta

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
        layer_eight_bit=float(meta.get(LAYER_EIGHT_BIT, 0.0)),
    )
