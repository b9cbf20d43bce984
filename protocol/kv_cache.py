"""The element types a llama.cpp worker's KV cache may be stored in (`--cache-type-k`,
`--cache-type-v`), as llama-server allows them: ggml's id for each, and its block, so the gateway
counts a cache's bytes without importing llama.cpp. tests/unit/test_kv_cache.py checks the table
against the installed ggml."""

from __future__ import annotations

import math
from typing import NamedTuple


class KvType(NamedTuple):
    ggml_type: int  # ggml's enum ggml_type (llama_context_params.type_k / type_v)
    block: int  # elements per block (1: a plain float type)
    block_bytes: int  # bytes per block


DEFAULT = "f16"
# llama-server's -ctk/-ctv list, in its order. Each was checked to create a context and decode on
# this build (SmolLM2, K and V alike and mixed); the K-quant types (q4_K ...) are not offered:
# their 256-element block divides no common head size (64, 128).
KV_TYPES: dict[str, KvType] = {
    "f32": KvType(0, 1, 4),
    "f16": KvType(1, 1, 2),
    "bf16": KvType(30, 1, 2),
    "q8_0": KvType(8, 32, 34),
    "q4_0": KvType(2, 32, 18),
    "q4_1": KvType(3, 32, 20),
    "iq4_nl": KvType(20, 32, 18),
    "q5_0": KvType(6, 32, 22),
    "q5_1": KvType(7, 32, 24),
}


def is_quantized(name: str) -> bool:
    """A block-quantized type: as the V cache, llama.cpp stores it only with flash attention on."""
    return KV_TYPES[name].block > 1


def row_bytes(name: str, elements: int) -> int:
    """Bytes of `elements` values of the type (ggml_row_size; a partial block counts whole)."""
    t = KV_TYPES[name]
    return math.ceil(elements / t.block) * t.block_bytes


def kv_bytes_per_token(n_layer: int, n_head_kv: int, k_len: int, v_len: int, type_k: str, type_v: str) -> int:
    """One token's K and V in every layer: a layer's K row is n_head_kv * k_len values of `type_k`."""
    return n_layer * (row_bytes(type_k, n_head_kv * k_len) + row_bytes(type_v, n_head_kv * v_len))


def element_bytes(name: str) -> float:
    """Bytes per value, on average: 2 for f16, 34/32 for q8_0."""
    t = KV_TYPES[name]
    return t.block_bytes / t.block
