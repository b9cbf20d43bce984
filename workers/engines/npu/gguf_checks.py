"""A GGUF checked before the NPU converter reads it: a truncated file, a tensor of a type this
converter does not know, or matrices whose shapes disagree with the header are a ConversionError
naming the file and the reason (the worker then runs the model on the CPU, or says why it cannot),
never an exception from deep inside numpy or a graph with the wrong shapes."""

from __future__ import annotations

import math
import re
import struct

from protocol.gguf_header import Header, read_gguf
from workers.engines.npu.convert import ConversionError

_LAYER = re.compile(r"blk\.(\d+)\.(\w+)\.weight")
# Matrices whose inner dimension is the width (they read the residual stream, or are the token table
# and the head), those whose outer one is (they write it), and the width-long norms.
_READS = frozenset({"attn_q", "attn_k", "attn_v", "attn_qkv", "ffn_gate", "ffn_up", "token_embd", "output"})
_WRITES = frozenset({"attn_output", "ffn_down"})
_NORMS = frozenset({"attn_norm", "ffn_norm", "output_norm"})


def check_gguf(path: str) -> Header:
    """The header of a GGUF the converter may read (see above)."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    try:
        header = read_gguf(path)
    except (OSError, ValueError, KeyError, struct.error) as exc:
        raise ConversionError(f"{path}: not a readable GGUF ({exc})") from None
    for t in header.tensors:
        try:
            block, block_bytes = GGML_QUANT_SIZES[GGMLQuantizationType(t.ggml_type)]
        except (ValueError, KeyError):
            raise ConversionError(f"{path}: tensor {t.name} has an unknown quantization type ({t.ggml_type})") from None
        if not t.dims or t.dims[0] % block:
            raise ConversionError(f"{path}: tensor {t.name}'s rows ({t.dims}) are not whole blocks of {block}")
        end = header.data_start + t.offset + math.prod(t.dims) // block * block_bytes
        if end > header.file_size:
            raise ConversionError(f"{path}: the file is truncated: tensor {t.name} ends at byte {end:,} of "
                                  f"{header.file_size:,}")  # fmt: skip
    meta = header.meta
    arch = str(meta.get("general.architecture", ""))
    n_embd, n_layer = meta.get(f"{arch}.embedding_length"), meta.get(f"{arch}.block_count")
    if not isinstance(n_embd, int) or not isinstance(n_layer, int):
        raise ConversionError(f"{path}: the header has no {arch}.embedding_length or {arch}.block_count")
    for t in header.tensors:
        match = _LAYER.fullmatch(t.name)
        if match is not None and int(match[1]) >= n_layer:
            raise ConversionError(f"{path}: tensor {t.name}, but the header says {n_layer} layers")
        kind = match[2] if match is not None else t.name.removesuffix(".weight")
        if (
            (kind in _READS and t.dims[0] != n_embd)
            or (kind in _WRITES and t.dims[1:] != (n_embd,))
            or (kind in _NORMS and t.dims != (n_embd,))
        ):
            raise ConversionError(f"{path}: tensor {t.name} is {' x '.join(map(str, t.dims))}, which disagrees "
                                  f"with the header's width ({arch}.embedding_length {n_embd})")  # fmt: skip
    return header
